"""Predicted against replayed on data the plan never saw, for each hit estimate (issue 27).

    .venv/bin/python benchmarks/holdout_bench.py --work /tmp/recshard-holdout \\
        --example-run example_run

Cases: the Criteo Kaggle sample (``../shared/data/criteo/criteo_kaggle_7200.tsv``; its first
70% of lines profiled, the next 15% (dev) and the last 15% (test) replayed) on three hardware
configs whose HBM holds part of the seen rows, and, with ``--example-run``, the built-in
example as ``recshard run`` left it (day 1 profiled, day 2 replayed). Each case is solved twice
(``--hit-estimate in_sample`` and ``held_out``, same solver and limits), remapped, and replayed
on each held-out set in one Spark session. Prints, per plan: the predicted UVM access share and
slowest GPU (the plan's estimate, and in-sample) beside the replayed ones. With ``--chunks N``
each Criteo held-out set is also replayed in N runs of consecutive lines, and the standard
error of the replayed figures (the chunks' standard deviation / sqrt(N)) is printed beside them:
how far a held-out set of this size measures them.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shutil

import numpy as np
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[1]
CRITEO = ROOT.parent / "shared" / "data" / "criteo" / "criteo_kaggle_7200.tsv"
# 2 GPUs whose HBM holds part of the Criteo sample's seen rows (batch 256: the sample is small)
CRITEO_HBM_BYTES = (1_000_000, 3_000_000, 10_000_000)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    model: pathlib.Path
    hardware: pathlib.Path
    held_out: dict[str, pathlib.Path]  # name -> logs replayed
    train_logs: pathlib.Path | None = None  # profiled here
    stats: pathlib.Path | None = None  # or a stats partition profiled before
    chunks: dict[str, list[pathlib.Path]] = dataclasses.field(default_factory=dict)  # name -> runs of lines


def _write_lines(directory: pathlib.Path, lines: list[str]) -> pathlib.Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "part-0.tsv").write_text("".join(lines))
    return directory


def criteo_cases(work: pathlib.Path, source: pathlib.Path, chunks: int):
    lines = source.read_text().splitlines(keepends=True)
    train_end, dev_end = int(len(lines) * 0.70), int(len(lines) * 0.85)
    parts = {"train": lines[:train_end], "dev": lines[train_end:dev_end], "test": lines[dev_end:]}
    for name, part in parts.items():
        _write_lines(work / "criteo" / name, part)
    runs = {
        name: [
            _write_lines(work / "criteo" / f"{name}-{i}", list(lines_of_run))
            for i, lines_of_run in enumerate(np.array_split(np.array(parts[name], dtype=object), chunks))
        ]
        for name in ("dev", "test")
        if chunks > 1
    }
    for hbm in CRITEO_HBM_BYTES:
        hw = work / f"criteo_hw_{hbm}.yaml"
        hw.write_text(
            yaml.safe_dump(
                {
                    "num_gpus": 2,
                    "hbm_per_gpu_bytes": hbm,
                    "hbm_reserved_fraction": 0,
                    "host_gib": 64,
                    "batch_size": 256,
                }
            )
        )
        yield Case(
            f"criteo, {hbm / 1e6:g} MB HBM x 2",
            ROOT / "conf" / "criteo_kaggle.yaml",
            hw,
            {"dev": work / "criteo" / "dev", "test": work / "criteo" / "test"},
            train_logs=work / "criteo" / "train",
            chunks=runs,
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", default="/tmp/recshard-holdout")
    parser.add_argument("--criteo", default=str(CRITEO))
    parser.add_argument("--example-run", default=None, help="the --out of a finished `recshard run`")
    parser.add_argument("--solver", default="cbc")
    parser.add_argument("--time-limit", type=float, default=20)
    parser.add_argument(
        "--chunks", type=int, default=0, help="replay each Criteo held-out set also in N runs of lines"
    )
    args = parser.parse_args()

    from recshard_stats.cli import build_parser
    from recshard_stats.manifest_loader import load_manifest
    from recshard_stats.options import ProfileOptions, RemapOptions, ReplayOptions, SolveOptions, from_args
    from recshard_stats.replay import load_evaluation
    from recshard_stats.solver.manifest_builder import solve_to_manifest
    from recshard_stats.spark_io import spark_session
    from recshard_stats.stages import profile_logs, remap_manifest, replay_logs

    spark = spark_session("recshard-holdout-bench")

    def profile(model, logs, out) -> pathlib.Path:
        argv = [
            "profile",
            "--model",
            str(model),
            "--input",
            str(logs),
            "--out",
            str(out),
            "--ds",
            "2026-12-01",
            "--row-counts",
        ]
        return pathlib.Path(profile_logs(spark, from_args(ProfileOptions, build_parser().parse_args(argv))))

    work = pathlib.Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cases = list(criteo_cases(work, pathlib.Path(args.criteo), args.chunks))
    if args.example_run:
        run = pathlib.Path(args.example_run)
        cases.append(
            Case(
                "built-in example",
                ROOT / "conf" / "synthetic.yaml",
                ROOT / "conf" / "hardware_example.yaml",
                {"next day": run / "logs" / "ds=2026-12-02"},
                stats=run / "stats" / "ds=2026-12-01",
            )
        )
    header = (
        f"{'case':<26} {'planned':<10} {'held out':<9} {'UVM pred':>9} {'in-samp':>8} {'replayed':>9} "
        f"{'ms pred':>8} {'in-samp':>8} {'replayed':>9} {'ms err':>7} {'UVM se':>7} {'ms se':>6}"
    )

    def replayed(manifest, logs):
        evaluation = load_evaluation(
            replay_logs(spark, ReplayOptions(manifest=str(manifest), logs=(str(logs),)))
        )
        return evaluation.plans["recshard"]

    def standard_errors(manifest, runs) -> str:
        if not runs:
            return ""
        got = [replayed(manifest, logs) for logs in runs]
        uvm = np.array([g.uvm_access_fraction for g in got])
        ms = np.array([g.max_cost_ms for g in got])
        root = np.sqrt(len(got))
        return f" {uvm.std(ddof=1) / root:>7.2%} {ms.std(ddof=1) / ms.mean() / root:>6.1%}"

    rows = [header]
    for k, case in enumerate(cases):
        stats = case.stats or profile(case.model, case.train_logs, work / f"stats-{k}")
        for estimate in ("in_sample", "held_out"):
            options = SolveOptions(
                solver=args.solver,
                time_limit_s=args.time_limit,
                torchrec_baselines=False,
                hit_estimate=estimate,
            )
            manifest = solve_to_manifest(
                stats, case.model, case.hardware, work / f"manifests-{k}-{estimate}", options=options
            )
            remap_manifest(spark, RemapOptions(manifest=str(manifest)))
            plan = load_manifest(manifest).manifest.plan
            for set_name, logs in case.held_out.items():
                got = replayed(manifest, logs)
                err = got.max_cost_ms / plan.objective_ms - 1
                rows.append(
                    f"{case.name:<26} {estimate:<10} {set_name:<9} {plan.uvm_access_fraction:>9.2%} "
                    f"{plan.in_sample_uvm_access_fraction:>8.2%} {got.uvm_access_fraction:>9.2%} "
                    f"{plan.objective_ms:>8.4f} {plan.in_sample_objective_ms or 0:>8.4f} "
                    f"{got.max_cost_ms:>9.4f} {err:>+7.1%}"
                    + standard_errors(manifest, case.chunks.get(set_name))
                )
                print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
