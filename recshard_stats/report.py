"""``recshard report``: one self-contained HTML page (figures embedded as PNG) for a plan.

Figures: access CDFs per table (log rows), pooling-factor histograms, coverage and unused
rows, per-GPU cost and HBM use of RecShard vs each baseline, -- when an evaluation
sits beside the manifest -- predicted vs replayed HBM hit rates, and -- given a drift report
(``recshard drift``) -- each feature's drift against its thresholds and the published plan's
HBM share on the newest day, with the alerts. Needs matplotlib (the
``report`` extra); nothing is fetched at view time.
"""

from __future__ import annotations

import base64
import html
import io
import pathlib

import numpy as np

from recshard_stats.atomic import write_text_atomic
from recshard_stats.drift import DRIFT_NAME, DriftReport, load_drift
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest import Manifest
from recshard_stats.manifest_loader import load_manifest
from recshard_stats.replay import EVALUATION_NAME, Evaluation, load_evaluation
from recshard_stats.schemas import StatsMetadata
from recshard_stats.stats_reader import StatsPartition, check_profiled_with, load_stats
from recshard_stats.units import GIB

FIGURES = ("access_cdf", "pooling", "coverage_unused", "gpu_cost", "gpu_hbm")


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _colors(n: int):
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab20")
    return [cmap(i % 20) for i in range(n)]


def fig_access_cdf(stats: StatsPartition, manifest: Manifest):
    import matplotlib.pyplot as plt

    cdf = stats.tables["access_cdf"].to_pandas()
    cdf = cdf[cdf.level == "table"]
    fig, ax = plt.subplots(figsize=(9, 5))
    rows_in_hbm = {t.name: t.rows_hbm for t in manifest.tables}
    for color, (name, group) in zip(_colors(cdf.name.nunique()), cdf.groupby("name", sort=True), strict=True):
        ax.plot(group.rows, group.access_fraction, color=color, label=name, lw=1.2)
        rows_hbm = rows_in_hbm.get(name, 0)
        if 0 < rows_hbm <= group.rows.max():
            ax.plot(
                [rows_hbm], [np.interp(rows_hbm, group.rows, group.access_fraction)], "o", color=color, ms=4
            )
    ax.set_xscale("log")
    ax.set_xlabel("hottest rows (log scale); dot = rows the plan keeps in HBM")
    ax.set_ylabel("share of accesses")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    ax.set_title("Access CDF per table")
    return fig


def fig_pooling(stats: StatsPartition):
    import matplotlib.pyplot as plt

    hist = stats.tables["pooling_histogram"].to_pandas()
    hist = hist[hist.pooling_factor > 0]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for color, (name, group) in zip(
        _colors(hist.feature.nunique()), hist.groupby("feature", sort=True), strict=True
    ):
        if len(group) > 1:
            ax.plot(group.pooling_factor, group.samples, ".-", color=color, label=name, lw=0.8, ms=3)
        else:
            ax.plot(group.pooling_factor, group.samples, "o", color=color, label=name, ms=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("pooling factor (ids per present sample)")
    ax.set_ylabel("samples")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=3)
    ax.set_title("Pooling-factor histograms")
    return fig


def fig_coverage_unused(stats: StatsPartition):
    import matplotlib.pyplot as plt

    features = stats.tables["features"].to_pandas()
    tables = stats.tables["tables"].to_pandas()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    a.barh(features.feature, features.coverage, color="#4c72b0")
    a.set_xscale("log")
    a.set_xlabel("coverage (share of samples, log)")
    a.invert_yaxis()
    a.set_title("Coverage per feature")
    unused = tables.unused_rows / tables.hash_size
    b.barh(tables.table, unused, color="#dd8452", label="never accessed")
    b.barh(tables.table, 1 - unused, left=unused, color="#55a868", label="accessed")
    b.set_xlabel("share of hash rows")
    b.invert_yaxis()
    b.legend(fontsize=7, loc="lower right")
    b.set_title("Unused rows per table (birthday paradox + long tail)")
    for axis in (a, b):
        axis.tick_params(axis="y", labelsize=6)
    return fig


def _plans(manifest: Manifest) -> list[tuple[str, list[float]]]:
    """(name, per-GPU cost ms) for RecShard, each baseline and each TorchRec plan."""
    return [
        ("recshard", [g.predicted_cost_ms for g in manifest.gpus]),
        *((b.name, list(b.gpu_cost_ms)) for b in manifest.plan.baselines),
        *((t.name, list(t.gpu_cost_ms)) for t in manifest.plan.torchrec if t.error is None),
    ]


def fig_gpu_cost(manifest: Manifest):
    import matplotlib.pyplot as plt

    plans = _plans(manifest)
    gpus = np.arange(manifest.num_gpus)
    width = 0.8 / len(plans)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, (name, costs) in enumerate(plans):
        ax.bar(gpus + i * width, costs, width, label=f"{name} (max {max(costs):.3f} ms)")
    ax.axhline(manifest.plan.lower_bound_ms, color="k", ls="--", lw=1, label="lower bound")
    ax.set_xticks(gpus + 0.4 - width / 2, [f"GPU {g}" for g in gpus])
    ax.set_ylabel("predicted embedding time per batch (ms)")
    ax.legend(fontsize=7)
    ax.set_title("Per-GPU cost: RecShard vs greedy baselines and TorchRec's planner")
    return fig


def fig_gpu_hbm(manifest: Manifest):
    import matplotlib.pyplot as plt

    used = np.array([g.hbm_bytes_used for g in manifest.gpus]) / GIB
    buffers = np.array([g.trainer_buffer_bytes for g in manifest.gpus]) / GIB
    cap = manifest.gpus[0].hbm_bytes_capacity / GIB
    fig, ax = plt.subplots(figsize=(9, 3.5))
    ax.bar(np.arange(len(used)), buffers, color="#8172b3", label="trainer buffers (ids, pooled outputs)")
    ax.bar(np.arange(len(used)), used, bottom=buffers, color="#55a868", label="RecShard HBM rows")
    ax.axhline(cap, color="r", ls="--", lw=1, label=f"usable HBM ({cap:.2f} GiB)")
    ax.set_xticks(np.arange(len(used)), [f"GPU {g}" for g in range(len(used))])
    ax.set_ylabel("GiB")
    ax.legend(fontsize=7)
    ax.set_title("HBM used per GPU")
    return fig


def fig_replay(evaluation: Evaluation):
    import matplotlib.pyplot as plt

    tables = evaluation.tables
    x = np.arange(len(tables))
    fig, ax = plt.subplots(figsize=(11, 4))
    in_sample = [t.in_sample_hbm_access_fraction for t in tables]
    if all(f is not None for f in in_sample):  # evaluations written before version 4 lack them
        heights = [float(f or 0.0) for f in in_sample]
        ax.bar(
            x - 0.27,
            heights,
            0.27,
            color="#cccccc",
            label="predicted in-sample (on the day that ranked the rows)",
        )
    ax.bar(
        x,
        [t.predicted_hbm_access_fraction for t in tables],
        0.27,
        label="predicted (the plan's hit estimate)",
    )
    ax.bar(x + 0.27, [t.hbm_access_fraction for t in tables], 0.27, label="replayed (held-out day)")
    ax.set_xticks(x, [t.name for t in tables], rotation=70, fontsize=6)
    ax.set_ylabel("share of accesses served by HBM")
    ax.legend(fontsize=7)
    ax.set_title("HBM hit rate per table: prediction vs held-out replay")
    return fig


def fig_drift_features(drift: DriftReport):
    """Per feature, three drift measures against their thresholds (dashed)."""
    import matplotlib.pyplot as plt

    features = drift.features
    y = np.arange(len(features))
    fig, axes = plt.subplots(1, 3, figsize=(12, 0.25 * len(features) + 1.5), sharey=True)
    panels = (
        ("coverage change", [f.coverage_change for f in features], drift.thresholds.coverage_change),
        (
            "pooling-factor total variation",
            [f.pooling_total_variation for f in features],
            drift.thresholds.pooling_total_variation,
        ),
        (
            "accesses to ids new to the reference",
            [f.new_id_access_share for f in features],
            drift.thresholds.new_id_access_share,
        ),
    )
    for ax, (title, values, limit) in zip(axes, panels, strict=True):
        beyond = [abs(v) > limit for v in values]
        ax.barh(y, values, color=["#c44e52" if b else "#4c72b0" for b in beyond])
        for x in (limit, -limit) if title == "coverage change" else (limit,):
            ax.axvline(x, color="k", ls="--", lw=0.8)
        ax.set_title(title, fontsize=9)
    axes[0].set_yticks(y, [f.feature for f in features], fontsize=6)
    fig.suptitle(
        f"drift of {drift.ds} against {', '.join(drift.reference_days)} (red: beyond the threshold)",
        fontsize=10,
    )
    return fig


def fig_drift_tables(drift: DriftReport):
    """Per table, the published plan's predicted HBM share beside the newest day's."""
    import matplotlib.pyplot as plt

    tables = [t for t in drift.tables if t.hbm_share is not None]
    x = np.arange(len(tables))
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.bar(
        x - 0.2, [t.predicted_hbm_share or 0.0 for t in tables], 0.4, label="predicted by the published plan"
    )
    ax.bar(x + 0.2, [t.hbm_share or 0.0 for t in tables], 0.4, label=f"served on {drift.ds}")
    ax.set_xticks(x, [t.table for t in tables], rotation=70, fontsize=6)
    ax.set_ylabel("share of accesses served by HBM")
    ax.legend(fontsize=7)
    ax.set_title("the published plan's HBM rows on the newest day")
    return fig


def _drift_alerts(drift: DriftReport) -> str:
    if drift.reference is None:
        return f'<p id="drift-alerts">No reference before {html.escape(drift.ds)}: drift not measured.</p>'
    if not drift.alerts:
        return f'<p id="drift-alerts">No drift beyond the thresholds ({html.escape(drift.ds)}).</p>'
    items = "".join(f"<li>{html.escape(a)}</li>" for a in drift.alerts)
    return f'<ul id="drift-alerts" class="warning">{items}</ul>'


def _summary_table(manifest: Manifest, evaluation: Evaluation | None) -> str:
    """Every plan in our cost model (and replayed, when an evaluation is given), with TorchRec's
    rating of it where the manifest has one; a TorchRec plan that failed shows TorchRec's error."""
    plan = manifest.plan
    rows: list[tuple[str, float | None, float | None, float | None, float | None, float | None]] = [
        (
            "recshard",
            plan.objective_ms,
            plan.imbalance,
            plan.uvm_access_fraction,
            1.0,
            plan.torchrec_rating_ms,
        )
    ]
    rows += [
        (b.name, b.max_cost_ms, b.imbalance, b.uvm_access_fraction, b.cost_vs_recshard, b.torchrec_rating_ms)
        for b in plan.baselines
    ]
    rows += [
        (t.name, t.max_cost_ms, t.imbalance, t.uvm_access_fraction, t.cost_vs_recshard, t.torchrec_rating_ms)
        for t in plan.torchrec
        if t.error is None
    ]
    replay = evaluation.plans if evaluation else {}
    head = (
        "<tr><th>plan</th><th>max GPU ms/batch</th><th>imbalance</th><th>UVM accesses</th>"
        "<th>cost vs RecShard</th><th>replayed ms</th><th>replayed UVM</th><th>TorchRec's rating ms</th></tr>"
    )
    body = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{c:.4f}</td><td>{i:.2f}</td><td>{u:.2%}</td><td>{r:.2f}x</td>"
        + (
            f"<td>{replay[n].max_cost_ms:.4f}</td><td>{replay[n].uvm_access_fraction:.2%}</td>"
            if n in replay
            else "<td>-</td><td>-</td>"
        )
        + (f"<td>{rating:.4f}</td>" if rating is not None else "<td>-</td>")
        + "</tr>"
        for n, c, i, u, r, rating in rows
    )
    failed = "".join(
        f"<li>{html.escape(t.name)}: no plan after {t.planning_seconds:.1f}s: {html.escape(t.error)}</li>"
        for t in plan.torchrec
        if t.error is not None
    )
    return f"<table>{head}{body}</table>" + (f'<ul id="torchrec-errors">{failed}</ul>' if failed else "")


def _placement_table(manifest: Manifest) -> str:
    """Per table: its GPU, or its column shards' GPUs, its HBM rows and its predicted cost."""
    head = (
        "<tr><th>table</th><th>GPU</th><th>layout</th><th>rows in HBM</th><th>of rows</th>"
        "<th>predicted HBM hits</th><th>predicted ms/batch</th></tr>"
    )
    body = "".join(
        f"<tr><td>{html.escape(t.name)}</td><td>{', '.join(map(str, t.ranks))}</td>"
        f"<td>{f'column-wise x{len(t.column_shards)}' if t.column_shards else 'table-wise'}</td>"
        f"<td>{t.rows_hbm:,}</td><td>{t.hash_size:,}</td><td>{t.predicted_hbm_access_fraction:.2%}</td>"
        f"<td>{t.predicted_cost_ms:.4f}</td></tr>"
        for t in manifest.tables
    )
    return f'<table id="placement">{head}{body}</table>'


def _beside(given, default: pathlib.Path, flag: str, command: str) -> pathlib.Path | None:
    """An optional input of the report: the file given (which must exist), else the one beside
    the manifest if there is one."""
    if given is not None and not pathlib.Path(given).is_file():
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"{flag} {given} does not exist",
            fixes=(f"run `{command}` first, or leave {flag} out",),
        )
    path = pathlib.Path(given) if given is not None else default
    return path if path.is_file() else None


def render(manifest_path, stats_path=None, evaluation_path=None, drift_path=None) -> str:
    import matplotlib

    matplotlib.use("Agg")
    loaded = load_manifest(manifest_path, verify_checksums=False)
    manifest = loaded.manifest
    stats = load_stats(stats_path or loaded.stats_path)
    check_profiled_with(stats, manifest.model)  # another model's stats would plot other rows
    evaluation_file = _beside(
        evaluation_path, loaded.path.parent / EVALUATION_NAME, "--evaluation", "recshard evaluate"
    )
    evaluation = load_evaluation(evaluation_file) if evaluation_file else None
    figures = [
        ("access_cdf", fig_access_cdf(stats, manifest)),
        ("pooling", fig_pooling(stats)),
        ("coverage_unused", fig_coverage_unused(stats)),
        ("gpu_cost", fig_gpu_cost(manifest)),
        ("gpu_hbm", fig_gpu_hbm(manifest)),
    ]
    if evaluation:
        figures.append(("replay", fig_replay(evaluation)))
    drift_file = _beside(drift_path, loaded.path.parent / DRIFT_NAME, "--drift", "recshard drift")
    drift = load_drift(drift_file) if drift_file else None
    drift_html = ""
    if drift:
        drift_figures = [("drift_features", fig_drift_features(drift))] if drift.features else []
        if any(t.hbm_share is not None for t in drift.tables):
            drift_figures.append(("drift_tables", fig_drift_tables(drift)))
        drift_html = (
            "<h2>Drift</h2>\n"
            + _drift_alerts(drift)
            + "\n".join(
                f'<figure id="fig-{name}"><img alt="{name}" src="data:image/png;base64,{_png(fig)}"></figure>'
                for name, fig in drift_figures
            )
        )
    plan = manifest.plan
    blocks = "\n".join(
        f'<figure id="fig-{name}"><img alt="{name}" src="data:image/png;base64,{_png(fig)}"></figure>'
        for name, fig in figures
    )
    title = f"RecShard plan {html.escape(manifest.ds)} ({html.escape(manifest.model.name)})"
    cut = sum(1 for t in manifest.tables if t.column_shards)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}figure{{margin:1.5em 0}}img{{max-width:100%}}</style>
</head><body>
<h1>{title}</h1>
<p id="summary">{len(manifest.tables)} tables on {manifest.num_gpus} GPUs; solver {html.escape(plan.solver)}
({html.escape(plan.status)}, plan from {html.escape(plan.source)}); slowest GPU
<b>{plan.objective_ms:.4f} ms</b> per batch; lower bound {plan.lower_bound_ms:.4f} ms;
gap <b>{plan.gap:.2%}</b>; {stats.metadata.num_samples} samples profiled{_window(stats.metadata)}; {cut} table(s) cut into column
shards.{_skipped(stats.metadata)}</p>
{_decision(loaded.path.parent)}
{_diff(manifest)}
{_summary_table(manifest, evaluation)}
{blocks}
{drift_html}
<h2>Placement</h2>
{_placement_table(manifest)}
</body></html>
"""


def _decision(directory: pathlib.Path) -> str:
    """The publish decision beside the manifest (``recshard publish``), if it was made."""
    import json

    from recshard_stats.publish_decision import DECISION_NAME, PublishDecision
    from recshard_stats.typed_json import DecodeError, from_plain

    path = directory / DECISION_NAME
    if not path.is_file():
        return ""
    try:
        decision = from_plain(PublishDecision, json.loads(path.read_text()))
    except (json.JSONDecodeError, DecodeError) as exc:
        return f'<p id="decision" class="warning">{html.escape(str(path))} does not read: {html.escape(str(exc))}</p>'
    verdict = (
        "published" if decision.publish else f"not published; kept {html.escape(decision.published or '')}"
    )
    return f'<p id="decision">Publish decision: <b>{verdict}</b>: {html.escape(decision.reason)}.</p>'


def _diff(manifest: Manifest) -> str:
    """What applying the plan moves against the previous one, when it was solved with one."""
    diff = manifest.diff
    if diff is None:
        return ""
    moved = sum(1 for c in diff.tables if c.moved_bytes)
    entering = [c.rows_entering_hbm for c in diff.tables if c.rows_entering_hbm is not None]
    rows = f"; {sum(entering):,} rows enter HBM" if entering else ""
    return (
        f'<p id="diff">Against the plan of {html.escape(diff.previous_ds)}: {moved} table(s) change GPU '
        f"({diff.moved_bytes / GIB:.3f} GiB moved){rows}; {len(diff.tables)} table(s) changed in all.</p>"
    )


def _window(metadata: StatsMetadata) -> str:
    window = metadata.window
    if window is None:
        return ""
    text = f" over the {len(window.days)}-day window {html.escape(window.days[0])} .. {html.escape(window.days[-1])}"
    if window.missing_days:
        text += f" (no stats for {html.escape(', '.join(window.missing_days))})"
    if window.half_life_days is not None:
        text += f", half-life {window.half_life_days:g} days"
    return text


def _skipped(metadata: StatsMetadata) -> str:
    """What the profile left out or found odd: skipped files, outlying pooling factors."""
    files, outliers = metadata.skipped_files, metadata.pooling_outliers
    text = ""
    if files:
        text += (
            f' <b class="warning">{len(files)} corrupt input file(s) skipped</b>: '
            + ", ".join(html.escape(f) for f in files)
            + "."
        )
    if outliers:
        text += (
            ' <b class="warning">outlying pooling factors</b> (a sample with far more ids than the '
            "feature's p99): "
            + ", ".join(f"{html.escape(f)} {n:,}" for f, n in sorted(outliers.items()))
            + "."
        )
    return text


def write_report(manifest_path, out, stats_path=None, evaluation_path=None, drift_path=None) -> pathlib.Path:
    return write_text_atomic(out, render(manifest_path, stats_path, evaluation_path, drift_path))
