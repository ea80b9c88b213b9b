"""``recshard``: one console script, a thin subcommand over each stage's library function.

Arguments come from the stages' option dataclasses (:mod:`recshard_stats.options`), so each
default lives there; the spark-submit jobs in ``jobs/`` are this script's Spark subcommands.
"""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
from collections.abc import Callable

from recshard_stats.errors import Reason, RecShardError
from recshard_stats.options import (
    DriftOptions,
    ProfileOptions,
    RemapOptions,
    ReplayOptions,
    SolveOptions,
    SparkOptions,
    SyntheticDrift,
    WindowOptions,
    add_arguments,
    check_ds,
    from_args,
)
from recshard_stats.session_server import DEFAULT_IDLE_TIMEOUT_S, default_socket

EXAMPLES = """examples:
  recshard run --out example_run                   # the built-in example, end to end
  recshard generate --spec conf/synthetic.yaml --samples 1000000 --out logs/ds=2026-12-01
  recshard profile --model conf/synthetic.yaml --input logs/ds=2026-12-01 --out stats --ds 2026-12-01 --row-counts
  recshard window --model conf/synthetic.yaml --stats stats --out windows --ds 2026-12-07 --days 7
  recshard solve --stats stats/ds=2026-12-01 --model conf/synthetic.yaml --hardware conf/hardware.yaml --out manifests
  recshard remap --manifest manifests/ds=2026-12-01
  recshard evaluate --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02
  recshard report --manifest manifests/ds=2026-12-01 --out report.html
  recshard validate --manifest manifests/ds=2026-12-01 --model conf/synthetic.yaml
  recshard publish --manifest manifests/ds=2026-12-01 --root manifests
  recshard calibrate --out conf/calibration/my_gpu.yaml   # on the training machine's GPU
  recshard serve &   then   recshard profile ... --server   # Spark commands in one kept session

each command's --help has its options and more examples.
"""
PROFILE_EXAMPLES = """examples:
  recshard profile --model conf/criteo_kaggle.yaml --input day_0.tsv --out stats --ds 2026-12-01
  recshard profile --model conf/synthetic.yaml --input logs/ --out stats --row-counts --sample-fraction 0.1
  recshard profile --model conf/synthetic.yaml --input logs/ --out stats --skip-corrupt-files
  recshard profile --model conf/synthetic.yaml --input logs/ --out stats --approximate --hll-lg-k 16
  spark-submit --master yarn --py-files dist/recshard_stats.zip jobs/profile_job.py --model ... --input ... --out ...
"""
WINDOW_EXAMPLES = """examples:
  recshard profile --model conf/synthetic.yaml --input logs/ds=2026-12-07 --out stats --ds 2026-12-07 --id-counts
  recshard window --model conf/synthetic.yaml --stats stats --out windows --ds 2026-12-07 --days 7
  recshard window ... --days 14 --min-days 10 --half-life 3   # recent days weigh more
  recshard solve --stats windows/ds=2026-12-07 --model conf/synthetic.yaml --hardware conf/hardware.yaml --out manifests
  spark-submit jobs/window_job.py --model ... --stats ... --out ... --ds ...
"""
DRIFT_EXAMPLES = """examples:
  recshard drift --day stats/ds=2026-12-08 --reference windows/ds=2026-12-07 --out drift.json
  recshard drift ... --manifest manifests/published/ds=2026-12-07 --thresholds my_drift.yaml
"""
SOLVE_EXAMPLES = """examples:
  recshard solve --stats stats/ds=2026-12-01 --model conf/synthetic.yaml --hardware conf/hardware.yaml --out manifests
  recshard solve ... --solver glpk --time-limit 30 --mip-gap 0.02
  recshard solve ... --previous manifests --max-moved-gib 2   # at most 2 GiB of tables change GPU
"""
REMAP_EXAMPLES = """examples:
  recshard remap --manifest manifests/ds=2026-12-01 --stats stats/ds=2026-12-01
  spark-submit --master yarn --py-files dist/recshard_stats.zip jobs/remap_job.py --manifest ... --stats ...
"""
EVALUATE_EXAMPLES = """examples:
  recshard evaluate --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02
  recshard evaluate --manifest manifests/ds=2026-12-01 --logs day_1.tsv --out eval.json
  spark-submit jobs/replay_job.py --manifest manifests/ds=2026-12-01 --logs logs/ds=2026-12-02
"""
RUN_EXAMPLES = """examples:
  recshard run                                      # 2 days + a held-out day, 200k samples each, into ./example_run
  recshard run --samples 2000000 --solver highs --out /tmp/big_run
"""
CALIBRATE_EXAMPLES = """examples:
  recshard calibrate --out conf/calibration/h200.yaml                 # ~1 minute on an H200
  recshard calibrate --out cal.yaml --budget-s 60 --host-gib 4        # a shorter sweep
  recshard calibrate --out cal.yaml --from-grid timings.jsonl         # fit timings measured before
  recshard calibrate --out /tmp/cal.yaml --device cpu --budget-s 10   # checks the loop only (no GPU)
  recshard calibrate --out /tmp/cal.yaml --device cpu --kernel tbe    # ... with FBGEMM's TBE (CPU build)
then in the hardware config:  calibration: calibration/h200.yaml  (relative to that file)
"""
SERVE_EXAMPLES = """examples:
  recshard serve &                                   # one Spark session, kept (3 h idle at most)
  recshard profile --model conf/synthetic.yaml --input logs/ds=2026-12-01 --out stats --ds 2026-12-01 --server
  recshard window ... --server                       # each Spark command: --server, in that session
  recshard serve --driver-memory 8g --socket /tmp/rs.sock --idle-timeout 0 &
  recshard evaluate ... --server /tmp/rs.sock
  recshard serve --stop                              # ends once its current command is done
"""
# the default configs: conf/ of the checkout, shipped in the wheel as package data (through the
# recshard_stats/conf link)
CONF = pathlib.Path(__file__).parent / "conf"


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("py4j", "pyomo"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_main(body: Callable[[], int | None]) -> int:
    """Run a command; an expected failure becomes one readable line on stderr and exit code 2."""
    try:
        return body() or 0
    except RecShardError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        for key, value in exc.context.items():
            print(f"  {key}: {value}", file=sys.stderr)
        return 2
    except OSError as exc:  # the disk, not the code: a full disk, a read-only or missing directory
        print(
            f"error: [os_error] {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""),
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        # a failure inside Spark (a full disk under a write, a lost executor): its root cause in
        # one line, the Java trace in Spark's log and with --verbose
        failure = _spark_failure(exc)
        if failure is None:
            raise
        logging.getLogger(__name__).debug("Spark failed", exc_info=True)
        print(f"error: [{Reason.SPARK_FAILED.value}] {failure} (Spark's log has the trace)", file=sys.stderr)
        return 2


def _spark_failure(exc: BaseException) -> str | None:
    if not type(exc).__module__.startswith(("py4j", "pyspark")):
        return None  # without importing Spark for commands that never start it
    from recshard_stats.spark_io import spark_failure

    return spark_failure(exc)


def _spark(args, app: str):
    from recshard_stats.spark_io import spark_session

    return spark_session(app, from_args(SparkOptions, args))


def _profile(args) -> None:
    from recshard_stats.config import load_model_config
    from recshard_stats.stages import profile_logs

    options = from_args(ProfileOptions, args)  # options and config are checked before Spark starts
    model = load_model_config(options.model)
    print(profile_logs(_spark(args, "recshard-profile"), options, model))


def _window(args) -> None:
    from recshard_stats.config import load_model_config
    from recshard_stats.stages import merge_window

    options = from_args(WindowOptions, args)
    model = load_model_config(options.model)
    print(merge_window(_spark(args, "recshard-window"), options, model))


def _drift(args) -> None:
    from recshard_stats.stages import check_drift

    options = from_args(DriftOptions, args)
    print(check_drift(_spark(args, "recshard-drift"), options))


def _solve(args) -> None:
    from recshard_stats.solver.manifest_builder import solve_to_manifest

    print(
        solve_to_manifest(
            args.stats,
            args.model,
            args.hardware,
            args.out,
            args.ds,
            from_args(SolveOptions, args),
            previous=args.previous,
        )
    )


def _remap(args) -> None:
    from recshard_stats.stages import remap_manifest

    options = from_args(RemapOptions, args)
    print(remap_manifest(_spark(args, "recshard-remap"), options))


def _evaluate(args) -> None:
    from recshard_stats.stages import replay_logs

    options = from_args(ReplayOptions, args)
    print(replay_logs(_spark(args, "recshard-evaluate"), options))


def _generate(args) -> None:
    from recshard_stats.generate import generate

    print(
        generate(
            args.spec,
            args.out,
            args.samples,
            seed=args.seed,
            chunk_rows=args.chunk_rows,
            processes=args.processes,
            drift=from_args(SyntheticDrift, args),
        )
    )


def _report(args) -> None:
    from recshard_stats.report import write_report

    print(write_report(args.manifest, args.out, args.stats, args.evaluation, args.drift))


def _validate(args) -> None:
    from recshard_stats.manifest_loader import load_manifest

    loaded = load_manifest(args.manifest, args.model, require_remap=True, require_checksum=True)
    plan = loaded.manifest.plan
    print(
        f"{loaded.path}: valid; {len(loaded.tables)} tables on {loaded.num_gpus} GPUs, "
        f"{plan.objective_ms:.4f} ms/batch, gap {plan.gap:.2%}, solver {plan.solver} ({plan.status})"
    )


def _publish(args) -> None:
    from recshard_stats.manifest_publisher import LATEST_NAME, beside_candidate, publish_if_better

    evaluation, published_evaluation = args.evaluation, args.published_evaluation
    if args.compare:
        if evaluation or published_evaluation:  # one of them would be silently ignored
            raise RecShardError(
                Reason.CONFIG_INVALID,
                "--compare reads the evaluations beside the candidate (evaluation.json, "
                "published_evaluation.json), so it takes no --evaluation or --published-evaluation",
                fixes=(
                    "drop --compare to decide on the files given",
                    "drop --evaluation and --published-evaluation to use those beside the candidate",
                ),
            )
        evaluation, published_evaluation = beside_candidate(args.manifest)
    decision = publish_if_better(
        args.root,
        args.manifest,
        args.model,
        evaluation=evaluation,
        published_evaluation=published_evaluation,
        margin=args.margin,
        force=args.force,
    )
    if decision.publish:
        print(
            f"published: {pathlib.Path(args.root) / LATEST_NAME} -> {decision.candidate} ({decision.reason})"
        )
    else:
        print(f"kept the published {decision.published}: {decision.reason}; --force publishes it anyway")


def _rollback(args) -> None:
    from recshard_stats.manifest_publisher import rollback_latest

    pointer = rollback_latest(args.root, args.model)
    print(f"{pathlib.Path(args.root) / 'latest.json'} -> {pointer.manifest} (ds {pointer.ds})")


def _calibrate(args) -> None:
    from recshard_stats.calibrate import calibrate

    calibrate(
        args.out,
        args.device,
        args.budget_s,
        args.host_gib,
        args.reps,
        args.from_grid,
        args.measurements,
        kernel=args.kernel,
    )


def _run(args) -> None:
    """Each stage through the library call its command makes, exactly as a user would run them;
    one run at a time per output."""
    from recshard_stats.atomic import check_output_root, output_lock

    ds = check_ds(args.ds)
    if args.window_days < 1:
        raise RecShardError(
            Reason.CONFIG_INVALID, f"--window-days must be at least 1, got {args.window_days}"
        )
    out = pathlib.Path(args.out)
    check_output_root(out, "--out")
    with output_lock(out / "_lock-run", f"recshard run --out {out}"):
        _run_stages(args, ds, out)


# how the example's generated days drift (mildly: some hot ids cool, some ids are new each day)
EXAMPLE_DRIFT = SyntheticDrift(hot_rotation=0.0002, new_ids=0.01)


def _run_stages(args, ds: str, out: pathlib.Path) -> None:
    import dataclasses
    import datetime

    from recshard_stats.generate import generate
    from recshard_stats.report import write_report
    from recshard_stats.solver.manifest_builder import solve_to_manifest
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import merge_window, profile_logs, remap_manifest, replay_logs
    from recshard_stats.window import window_dates

    days = window_dates(ds, args.window_days)
    held_out = (datetime.date.fromisoformat(ds) + datetime.timedelta(days=1)).isoformat()
    steps = 7
    print(
        f"[1/{steps}] generating {args.samples} samples a day for {', '.join(days)} and {held_out}",
        flush=True,
    )
    logs = {
        day: generate(
            args.spec,
            out / "logs" / f"ds={day}",
            args.samples,
            seed=index,
            drift=dataclasses.replace(EXAMPLE_DRIFT, day=index),
        )
        for index, day in enumerate((*days, held_out))
    }
    print(f"[2/{steps}] profiling {', '.join(days)}", flush=True)
    spark = spark_session("recshard-run")
    for day in days:
        profile_logs(
            spark,
            ProfileOptions(
                model=args.spec, inputs=(str(logs[day]),), out=str(out / "stats"), ds=day, id_counts=True
            ),
        )
    print(f"[3/{steps}] merging the {len(days)}-day window ending {ds}", flush=True)
    stats = merge_window(
        spark,
        WindowOptions(
            model=args.spec, stats=str(out / "stats"), out=str(out / "windows"), ds=ds, days=len(days)
        ),
    )
    print(f"[4/{steps}] solving with {args.solver}", flush=True)
    manifest = solve_to_manifest(
        stats, args.spec, args.hardware, out / "manifests", ds, from_args(SolveOptions, args)
    ).parent
    print(f"[5/{steps}] writing remap files", flush=True)
    remap_manifest(spark, RemapOptions(manifest=str(manifest), stats=str(stats)))
    print(f"[6/{steps}] replaying the held-out day {held_out}", flush=True)
    replay_logs(spark, ReplayOptions(manifest=str(manifest), logs=(str(logs[held_out]),)))
    print(f"[7/{steps}] writing the report", flush=True)
    report = write_report(manifest, out / "report.html", stats)
    print(f"done: manifest {manifest / 'manifest.json'}, report {report}")


def build_parser() -> argparse.ArgumentParser:
    from recshard_stats.calibrate import DEFAULT_BUDGET_S, DEFAULT_HOST_GIB, DEFAULT_REPS
    from recshard_stats.generate import DEFAULT_CHUNK_ROWS
    from recshard_stats.publish_decision import DEFAULT_MARGIN

    parser = argparse.ArgumentParser(
        prog="recshard",
        description="RecShard: profile logs, solve the sharding MILP, hand a manifest to training.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    socket_default = str(default_socket())
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    fmt = argparse.RawDescriptionHelpFormatter

    def command(name: str, help_text: str, epilog: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, epilog=epilog, formatter_class=fmt, parents=[common])

    def spark_command(name: str, help_text: str, epilog: str, options: type, func) -> None:
        parser = command(name, help_text, epilog)
        add_arguments(parser, options)
        add_arguments(parser, SparkOptions)
        parser.add_argument(
            "--server",
            nargs="?",
            const=socket_default,
            default=None,
            metavar="SOCKET",
            help="run in the Spark session of a running `recshard serve` (its socket; default "
            f"{socket_default}): no JVM to start and warm up",
        )
        parser.set_defaults(func=func)

    gen = command(
        "generate",
        "write synthetic Parquet logs",
        "examples:\n  recshard generate --spec conf/synthetic.yaml --samples 10000000 --out logs\n"
        "  recshard generate --spec conf/synthetic.yaml --samples 200000 --out logs/ds=2026-12-03 \\\n"
        "      --seed 2 --day 2 --drift-hot-rotation 0.01 --drift-new-ids 0.05   # day 2 of a drifting series",
    )
    gen.add_argument(
        "--spec", default=str(CONF / "synthetic.yaml"), help="model config with synthetic blocks"
    )
    gen.add_argument("--samples", type=int, required=True)
    gen.add_argument("--out", required=True, help="output directory (replaced atomically)")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument(
        "--chunk-rows",
        type=int,
        default=DEFAULT_CHUNK_ROWS,
        help=f"rows per Parquet file (default {DEFAULT_CHUNK_ROWS})",
    )
    gen.add_argument("--processes", type=int, default=None, help="worker processes (default: all cores)")
    add_arguments(gen, SyntheticDrift)
    gen.set_defaults(func=_generate)

    spark_command(
        "profile", "profile logs into stats Parquet (Spark)", PROFILE_EXAMPLES, ProfileOptions, _profile
    )

    spark_command(
        "window",
        "merge the last N days' stats into one window partition (Spark)",
        WINDOW_EXAMPLES,
        WindowOptions,
        _window,
    )

    spark_command(
        "drift",
        "the newest day against the window before it, and the published plan on it (Spark)",
        DRIFT_EXAMPLES,
        DriftOptions,
        _drift,
    )

    solve = command("solve", "solve the sharding MILP -> manifest.json", SOLVE_EXAMPLES)
    solve.add_argument("--stats", required=True, help="a stats partition, <stats>/ds=<date>")
    solve.add_argument("--model", required=True, help="model config (tables, hash sizes, dims)")
    solve.add_argument("--hardware", required=True, help="hardware config (GPUs, HBM, host, bandwidths)")
    solve.add_argument("--out", required=True, help="manifest root; writes <out>/ds=<date>/manifest.json")
    solve.add_argument(
        "--ds", default=None, help="partition date YYYY-MM-DD (default: the stats partition's)"
    )
    solve.add_argument(
        "--previous",
        default=None,
        help="the plan in service (a manifest, its directory, or a root holding latest.json): the manifest "
        "records its diff against it (tables moved, HBM rows changed), and --max-moved-gib caps the moves",
    )
    add_arguments(solve, SolveOptions)
    solve.set_defaults(func=_solve)

    spark_command(
        "remap",
        "write remap files (hot rows first) next to a manifest (Spark)",
        REMAP_EXAMPLES,
        RemapOptions,
        _remap,
    )
    spark_command(
        "evaluate",
        "replay held-out logs through a manifest (Spark)",
        EVALUATE_EXAMPLES,
        ReplayOptions,
        _evaluate,
    )

    report = command(
        "report",
        "self-contained HTML report of a plan",
        "example:\n  recshard report --manifest manifests/ds=2026-12-01 --out report.html",
    )
    report.add_argument("--manifest", required=True, help="manifest.json or its directory")
    report.add_argument(
        "--stats", default=None, help="stats partition (default: the manifest's inputs.stats)"
    )
    report.add_argument(
        "--evaluation",
        default=None,
        help="evaluation JSON (default: evaluation.json beside the manifest, if any)",
    )
    report.add_argument(
        "--drift", default=None, help="drift report (default: drift.json beside the manifest, if any)"
    )
    report.add_argument("--out", required=True, help="HTML file to write")
    report.set_defaults(func=_report)

    validate = command(
        "validate",
        "check a manifest the way a trainer loads it",
        "example:\n  recshard validate --manifest manifests/ds=2026-12-01 --model conf/synthetic.yaml",
    )
    validate.add_argument("--manifest", required=True)
    validate.add_argument("--model", default=None, help="the trainer's model config, to match against")
    validate.set_defaults(func=_validate)

    publish = command(
        "publish",
        "point <root>/latest.json at a manifest once it validates (and, given both evaluations, is faster)",
        "examples:\n  recshard publish --manifest manifests/ds=2026-12-01 --root manifests\n"
        "  recshard publish --manifest manifests/ds=2026-12-02 --root manifests \\\n"
        "      --evaluation new.json --published-evaluation old.json   # only if 2% faster\n"
        "  recshard evaluate --manifest manifests/ds=2026-12-02 --logs logs/ds=2026-12-02 --published-root manifests\n"
        "  recshard publish --manifest manifests/ds=2026-12-02 --root manifests --compare",
    )
    publish.add_argument("--manifest", required=True)
    publish.add_argument("--root", required=True, help="the directory holding latest.json")
    publish.add_argument("--model", default=None)
    publish.add_argument(
        "--evaluation", default=None, help="the candidate's `recshard evaluate` on the newest logs"
    )
    publish.add_argument(
        "--published-evaluation",
        default=None,
        help="the published manifest's `recshard evaluate` on the same logs (with --evaluation: "
        "the candidate is published only when it is faster by --margin)",
    )
    publish.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"how much faster the candidate must be (default {DEFAULT_MARGIN})",
    )
    publish.add_argument(
        "--compare",
        action="store_true",
        help="compare with the evaluations `recshard evaluate --published-root` wrote beside the "
        "candidate (evaluation.json, published_evaluation.json)",
    )
    publish.add_argument("--force", action="store_true", help="publish whatever the comparison says")
    publish.set_defaults(func=_publish)

    rollback = command(
        "rollback",
        "point <root>/latest.json back at the manifest published before the current one",
        "example:\n  recshard rollback --root manifests",
    )
    rollback.add_argument("--root", required=True, help="the directory holding latest.json")
    rollback.add_argument("--model", default=None, help="the trainer's model config, to match against")
    rollback.set_defaults(func=_rollback)

    cal = command(
        "calibrate",
        "measure the cost model's terms on this machine's GPU -> calibration file",
        CALIBRATE_EXAMPLES,
    )
    cal.add_argument("--out", required=True, help="calibration file to write (YAML)")
    cal.add_argument(
        "--device", default="cuda", help="cuda, cuda:N, or cpu (checks the loop only; default cuda)"
    )
    cal.add_argument(
        "--budget-s",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"measuring time budget in seconds (default {DEFAULT_BUDGET_S:g})",
    )
    cal.add_argument(
        "--host-gib",
        type=float,
        default=DEFAULT_HOST_GIB,
        help=f"largest host table swept, GiB of pinned memory (default {DEFAULT_HOST_GIB:g})",
    )
    cal.add_argument(
        "--reps",
        type=int,
        default=DEFAULT_REPS,
        help=f"timed runs per configuration (median; default {DEFAULT_REPS})",
    )
    cal.add_argument("--from-grid", default=None, help="fit these JSON-lines timings instead of measuring")
    cal.add_argument("--measurements", default=None, help="also write each measurement (JSON lines) here")
    cal.add_argument(
        "--kernel",
        default="auto",
        choices=("auto", "tbe", "torch"),
        help="tbe: FBGEMM's TBE (what TorchRec runs); torch: plain PyTorch embedding_bag; "
        "auto (default): TBE on a GPU where its CUDA build is installed, else torch",
    )
    cal.set_defaults(func=_calibrate)

    serve = command(
        "serve",
        "keep one Spark session for the Spark commands run with --server (no JVM start and "
        "warm-up per command)",
        SERVE_EXAMPLES,
    )
    serve.add_argument("--socket", default=socket_default, help=f"where to listen (default {socket_default})")
    serve.add_argument(
        "--idle-timeout",
        type=float,
        default=DEFAULT_IDLE_TIMEOUT_S,
        help=f"end after this many seconds without a command; 0: never (default {DEFAULT_IDLE_TIMEOUT_S:g})",
    )
    serve.add_argument(
        "--stop", action="store_true", help="stop the server at --socket once its command is done"
    )
    serve.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="serve at once (by default the server first profiles a few generated samples, so "
        "that its JVM has compiled the profile's code before the first command)",
    )
    add_arguments(serve, SparkOptions)
    serve.set_defaults(func=_serve)

    run = command(
        "run",
        "the whole pipeline on generated drifting days: generate, profile each day, merge "
        "the window, solve, remap, evaluate on the next (held-out) day, report",
        RUN_EXAMPLES,
    )
    run.add_argument("--out", default="example_run", help="working directory (default: example_run)")
    run.add_argument("--spec", default=str(CONF / "synthetic.yaml"), help="synthetic model config")
    run.add_argument("--hardware", default=str(CONF / "hardware_example.yaml"))
    run.add_argument(
        "--samples", type=int, default=200_000, help="samples per generated day (default 200000)"
    )
    run.add_argument(
        "--ds",
        default="2026-12-01",
        help="the window's last day; the next day is held out (default 2026-12-01)",
    )
    run.add_argument(
        "--window-days",
        type=int,
        default=2,
        help="days profiled and merged into the plan's window (default 2)",
    )
    add_arguments(run, SolveOptions, skip=("mip_gap", "cdf_segments", "symmetry_breaking", "max_moved_gib"))
    run.set_defaults(func=_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if getattr(args, "server", None):
        from recshard_stats.session_server import run_on_server

        return run_main(lambda: run_on_server(pathlib.Path(args.server), argv))
    code = run_main(lambda: args.func(args))
    if code == 0 and "pyspark" in sys.modules:
        _save_class_archive()
    return code


def _served_command(argv: list[str]) -> int:
    """A client's command inside ``recshard serve``: parsed and run here, never sent on."""
    args = build_parser().parse_args(argv)
    logging.getLogger().setLevel(logging.DEBUG if args.verbose else logging.INFO)
    return run_main(lambda: args.func(args))


def _serve(args) -> int:
    from recshard_stats.jvm_class_archive import save_class_archive
    from recshard_stats.session_server import serve, stop_server

    socket_path = pathlib.Path(args.socket)
    if args.stop:
        code = stop_server(socket_path)
        if code == 0:
            print(f"stopped the recshard server at {socket_path}")
        return code
    spark_options = from_args(SparkOptions, args)  # checked before the JVM starts
    return serve(
        spark_options, socket_path, _served_command, args.idle_timeout, save_class_archive, args.warm_up
    )


def _save_class_archive() -> None:
    """After a command's work: the classes its fresh JVM loaded, saved once for later runs."""
    from pyspark.sql import SparkSession

    from recshard_stats.jvm_class_archive import save_class_archive

    spark = SparkSession.getActiveSession()
    if spark is not None:
        save_class_archive(spark)


if __name__ == "__main__":
    sys.exit(main())
