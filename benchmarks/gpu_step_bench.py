"""Each GPU's share of every plan in a manifest, run in turn on one GPU with a held-out day's ids
(forward + backward + update), against what the cost model predicts for it.

Three steps, so the GPU machine needs only numpy and torch:

  # here (pyarrow): the held-out ids of one batch, hashed and remapped, and every plan's parts
  python benchmarks/gpu_step_bench.py prepare --manifest run/manifests/ds=2026-12-01 \\
      --logs run/logs/ds=2026-12-02 --batch 16384 --out bench/example_b16384
  # on the GPU (numpy + torch): times each plan's GPU shares, one JSON line each
  python benchmarks/gpu_step_bench.py measure --inputs bench --out results.jsonl
  # here: measured vs predicted, per share (R^2) and per plan (slowest GPU, gain over RecShard)
  python benchmarks/gpu_step_bench.py report --inputs bench --results results.jsonl \\
      --hardware conf/hardware_h200.yaml

A share's parts (tables, or their HBM and host parts, or TorchRec's shards) are laid out as the
trainer runs them (recshard_stats.lookup_kernels): per tier and row size one weight tensor and
one pooled embedding_bag call; RecShard's split tables put their ``rows_hbm`` hottest rows (the
remap's order) in HBM and the rest in pinned host memory read in place; greedy baselines keep
whole tables in one tier; TorchRec's ``fused`` / ``fused_uvm`` shards are HBM / host, and its
``fused_uvm_caching`` shards are modelled as a static cache of their load factor's hottest rows
in HBM before the whole table in host memory (a warm LRU cache at best).

The prediction for a share is the cost model (a hardware config's calibration, or its v1
bandwidths) applied to that batch's traffic: lookups and distinct rows per tier, row bytes and
the table's host span, plus one fixed cost per call. It scores the model on the hardware; the
solver's own forecast from the profile is in the manifest (``recshard evaluate`` scores that).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HBM, HOST = "hbm", "host"
# issue 30's targets, which the report checks per scenario
TARGET_R2, TARGET_SPEARMAN, TARGET_GAIN_ERROR = 0.9, 0.9, 0.2


# ---------------------------------------------------------------- prepare (CPU, pyarrow)


def _plans(manifest) -> list[dict]:
    """Every plan of the manifest as parts: (table, gpu, kind, cols, rows range, samples share)."""
    plans = []
    recshard = []
    for t in manifest.tables:
        for part in t.gpu_parts:
            recshard.append(
                {
                    "table": t.name,
                    "gpu": part.gpu,
                    "kind": "split",
                    "rows_hbm": t.rows_hbm,
                    "cols": round(t.dim * part.share),
                }
            )
    plans.append({"name": "recshard", "parts": recshard})
    for b in manifest.plan.baselines:
        if any(0 < r < t.hash_size for r, t in zip(b.rows_hbm, manifest.tables, strict=True)):
            continue  # a baseline with split tables would need its own remap
        plans.append(
            {
                "name": b.name,
                "parts": [
                    {"table": t.name, "gpu": g, "kind": HBM if r == t.hash_size else HOST, "cols": t.dim}
                    for t, g, r in zip(manifest.tables, b.gpu, b.rows_hbm, strict=True)
                ],
            }
        )
    for tp in manifest.plan.torchrec:
        if tp.error is not None:
            continue
        parts: list[dict] = []
        next_row: dict[str, int] = {}
        for s in tp.shards:
            t = manifest.table(s.table)
            lo = (
                next_row.get(s.table, 0)
                if s.sharding_type in ("row_wise", "table_row_wise", "grid_shard")
                else 0
            )
            if s.sharding_type in ("row_wise", "table_row_wise", "grid_shard"):
                next_row[s.table] = lo + s.rows
            kind = {"fused_uvm": HOST, "fused_uvm_caching": "cache"}.get(
                s.compute_kernel, HBM
            )  # fused, dense: HBM
            part = {
                "table": s.table,
                "gpu": s.rank,
                "kind": kind,
                "cols": s.cols,
                "row_lo": lo,
                "row_hi": lo + s.rows if lo or s.rows < t.hash_size else t.hash_size,
            }
            if kind == "cache":
                part["cache_rows"] = min(round(s.cache_load_factor * t.hash_size), t.hash_size)
            if s.sharding_type == "data_parallel":
                part["sample_share"] = [s.rank, manifest.num_gpus]
            parts.append(part)
        plans.append({"name": tp.name, "parts": parts})
    return plans


def prepare(manifest_path: str, logs: str, batch: int, out: str | pathlib.Path) -> pathlib.Path:
    import pyarrow.dataset as ds

    from recshard_stats.atomic import temp_sibling, write_text_atomic
    from recshard_stats.hashing import keys_of, rows_of
    from recshard_stats.manifest_loader import load_manifest

    loaded = load_manifest(manifest_path, require_remap=True)
    manifest = loaded.manifest
    model = manifest.model
    feature_types = {f.name: f.type for f in model.features}
    features = list(feature_types)
    table = ds.dataset(logs, format="parquet").head(batch, columns=features)
    if table.num_rows < batch:
        raise SystemExit(f"{logs} holds {table.num_rows} samples, fewer than the batch {batch}")
    arrays, tables = {}, []
    for t in manifest.tables:
        lengths, rows = [], []
        for f in t.features:
            per_sample = [
                (
                    []
                    if v is None or v == ""
                    else [x for x in v if x is not None and x != ""]
                    if isinstance(v, list)
                    else [v]
                )
                for v in table[f].to_pylist()
            ]
            lengths.append([len(v) for v in per_sample])
            flat = [x for v in per_sample for x in v]
            rows.append(
                rows_of(keys_of(flat, feature_types[f], t.hash), t.hash_size)
                if flat
                else np.zeros(0, np.int64)
            )
        row = np.concatenate(rows)
        arrays[f"{t.name}.rows"] = row.astype(np.int64)
        arrays[f"{t.name}.index"] = loaded.new_index(t.name, row).astype(np.int64)
        arrays[f"{t.name}.lengths"] = np.asarray(lengths, dtype=np.int32)
        tables.append({"name": t.name, "hash_size": t.hash_size, "dim": t.dim, "row_bytes": t.row_bytes})
    target = pathlib.Path(out)
    target.mkdir(parents=True, exist_ok=True)
    # ids first, plans.json last: a scenario is ready (measure reads it) only once both are whole
    tmp = temp_sibling(target / "ids.npz")
    try:
        with open(tmp, "wb") as handle:
            np.savez_compressed(handle, **arrays)  # type: ignore[arg-type]  # numpy's stub reads **arrays as allow_pickle
        os.replace(tmp, target / "ids.npz")
    finally:
        tmp.unlink(missing_ok=True)
    meta = {
        "manifest": str(loaded.path),
        "logs": logs,
        "batch": batch,
        "num_gpus": manifest.num_gpus,
        "tables": tables,
        "plans": _plans(manifest),
        "predicted_ms": {
            "recshard": [g.predicted_cost_ms for g in manifest.gpus],
            **{b.name: list(b.gpu_cost_ms) for b in manifest.plan.baselines},
            **{p.name: list(p.gpu_cost_ms) for p in manifest.plan.torchrec if p.error is None},
        },
        "manifest_batch": manifest.hardware.batch_size,
    }
    write_text_atomic(target / "plans.json", json.dumps(meta, indent=1))
    return target


# ---------------------------------------------------------------- shares (numpy only)


class Scenario:
    """One prepared directory: a batch of held-out ids and the plans to run it through."""

    def __init__(self, directory: pathlib.Path):
        self.directory = directory
        self.meta = json.loads((directory / "plans.json").read_text())
        with np.load(directory / "ids.npz") as data:
            self.ids = {k: data[k] for k in data.files}
        self.tables = {t["name"]: t for t in self.meta["tables"]}

    @property
    def name(self) -> str:
        return self.directory.name

    def lookups(self, part: dict) -> dict[str, tuple[int, np.ndarray, np.ndarray]]:
        """Per tier: (rows of the part's weights there, each lookup's row, bag offsets); one bag
        per feature and sample."""
        t = self.tables[part["table"]]
        rows, index, lengths = (self.ids[f"{t['name']}.{k}"] for k in ("rows", "index", "lengths"))
        samples = lengths.shape[1]
        bags = lengths.reshape(-1)  # feature-major: all samples of feature 0, then feature 1, ...
        bag_of = np.repeat(np.arange(len(bags)), bags)
        keep = np.ones(len(rows), dtype=bool)
        if "sample_share" in part:
            rank, g = part["sample_share"]
            sample = bag_of % samples
            keep &= (sample >= rank * samples // g) & (sample < (rank + 1) * samples // g)
        lo, hi = part.get("row_lo", 0), part.get("row_hi", t["hash_size"])
        keep &= (rows >= lo) & (rows < hi)
        kind = part["kind"]
        if kind == "split":
            in_hbm = index < part["rows_hbm"]
            tiers = {
                HBM: (part["rows_hbm"], in_hbm, index),
                HOST: (t["hash_size"] - part["rows_hbm"], ~in_hbm, index - part["rows_hbm"]),
            }
        elif kind == "cache":
            in_hbm = index < part["cache_rows"]
            tiers = {HBM: (part["cache_rows"], in_hbm, index), HOST: (hi - lo, ~in_hbm, rows - lo)}
        else:
            tiers = {kind: (hi - lo, np.ones(len(rows), dtype=bool), rows - lo)}
        out = {}
        for tier, (size, mask, address) in tiers.items():
            chosen = keep & mask
            if size <= 0 or not chosen.any():
                continue
            counts = np.bincount(bag_of[chosen], minlength=len(bags))
            offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
            out[tier] = (int(size), address[chosen].astype(np.int64), offsets)
        return out

    def share(
        self, plan: dict, gpu: int
    ) -> dict[tuple[str, int], list[tuple[int, np.ndarray, np.ndarray, dict]]]:
        """A GPU's parts of a plan grouped as the kernels run them: (tier, columns) -> parts."""
        groups: dict[tuple[str, int], list] = {}
        for part in plan["parts"]:
            if part["gpu"] != gpu:
                continue
            for tier, (size, ids, offsets) in self.lookups(part).items():
                groups.setdefault((tier, part["cols"]), []).append((size, ids, offsets, part))
        return groups


def concatenated(parts) -> tuple[int, np.ndarray, np.ndarray]:
    """Parts of one group in one weight tensor: rows stacked, ids and bags shifted."""
    ids, offsets, base_row, base_id = [], [], 0, 0
    for size, part_ids, part_offsets, _ in parts:
        ids.append(part_ids + base_row)
        offsets.append(part_offsets + base_id)
        base_row += size
        base_id += len(part_ids)
    return base_row, np.concatenate(ids), np.concatenate(offsets)


# ---------------------------------------------------------------- measure (GPU: numpy + torch)


def measure(inputs: str, out: str, device: str, reps: int, budget_s: float) -> None:
    from recshard_stats.lookup_kernels import (
        KernelGroup,
        WeightPools,
        device_name,
        release_cached_memory,
        time_groups,
    )

    started = time.time()
    scenarios = [Scenario(d) for d in sorted(pathlib.Path(inputs).iterdir()) if (d / "plans.json").is_file()]
    need = {HBM: 4, HOST: 4}
    for sc in scenarios:
        for plan in sc.meta["plans"]:
            for gpu in range(sc.meta["num_gpus"]):
                for tier in (HBM, HOST):
                    size = sum(
                        concatenated(parts)[0] * cols * 4
                        for (t, cols), parts in sc.share(plan, gpu).items()
                        if t == tier
                    )
                    need[tier] = max(need[tier], size)
    # one group's weights at a time: the largest tier share of any plan's GPU
    pools = WeightPools(device, need[HBM], need[HOST])
    print(
        f"pools: HBM {need[HBM] / 2**30:.2f} GiB, host {need[HOST] / 2**30:.2f} GiB pinned in "
        f"{time.time() - started:.1f}s",
        flush=True,
    )
    with open(out, "a") as sink:
        for sc in scenarios:
            for plan in sc.meta["plans"]:
                for gpu in range(sc.meta["num_gpus"]):
                    if time.time() - started > budget_s:
                        print(f"budget of {budget_s:.0f}s spent: stopping", flush=True)
                        return
                    groups, offsets_in_pool = [], {HBM: 0, HOST: 0}
                    for (tier, cols), parts in sorted(sc.share(plan, gpu).items()):
                        rows, ids, offsets = concatenated(parts)
                        pool = pools.hbm if tier == HBM else pools.host
                        start = offsets_in_pool[tier]
                        weights = pool[start : start + rows * cols].view(rows, cols)
                        offsets_in_pool[tier] += rows * cols
                        groups.append(KernelGroup.of(weights, ids, offsets))
                    timing = time_groups(groups, reps)
                    record = {
                        "scenario": sc.name,
                        "plan": plan["name"],
                        "gpu": gpu,
                        "batch": sc.meta["batch"],
                        "forward_ms": timing.forward_s * 1e3,
                        "step_ms": timing.step_s * 1e3,
                        "device": device_name(device),
                    }
                    sink.write(json.dumps(record) + "\n")
                    sink.flush()
                    print(
                        f"{sc.name} {plan['name']:<18} gpu {gpu}: fwd {record['forward_ms']:.4f} ms, "
                        f"step {record['step_ms']:.4f} ms",
                        flush=True,
                    )
                    del groups
                    if device.startswith("cuda"):
                        release_cached_memory()  # the captured graphs' pools


# ---------------------------------------------------------------- report (CPU)


def predicted_share_ms(sc: Scenario, plan: dict, gpu: int, model) -> float:
    """The cost model on this batch's traffic of the share."""
    from recshard_stats.costmodel import TableLoad, placement_cost

    loads = []
    for (tier, cols), parts in sc.share(plan, gpu).items():
        for size, ids, offsets, part in parts:
            t = sc.tables[part["table"]]
            row_bytes = t["row_bytes"] * cols / t["dim"]
            distinct = len(np.unique(ids))
            bags = float(len(offsets))
            longest = float(np.diff(np.append(offsets, len(ids))).max()) if len(offsets) else 0.0
            loads.append(
                TableLoad(
                    0,
                    len(ids),
                    1.0 if tier == HBM else 0.0,
                    distinct if tier == HBM else 0.0,
                    0.0 if tier == HBM else distinct,
                    row_bytes,
                    size * row_bytes,
                    bags_hbm=bags if tier == HBM else 0.0,
                    bags_host=0.0 if tier == HBM else bags,
                    longest_bag=longest,
                )
            )
    return placement_cost(model, 1, loads).max_cost * 1e3 if loads else 0.0


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 1 else 1.0


def report(inputs: str, results: str, hardware: str, pass_name: str = "step") -> dict:
    from recshard_stats.calibrate import r_squared
    from recshard_stats.config import load_hardware_config

    model = load_hardware_config(hardware).costs
    if pass_name == "forward":
        import dataclasses

        from recshard_stats.costmodel import PassTerms

        model = dataclasses.replace(model, backward=PassTerms())
    measured = [json.loads(line) for line in pathlib.Path(results).read_text().splitlines() if line.strip()]
    scenarios = {d.name: Scenario(d) for d in pathlib.Path(inputs).iterdir() if (d / "plans.json").is_file()}
    key = f"{pass_name}_ms"
    summary: dict = {"hardware": hardware, "model": model.source, "scenarios": {}}
    lines = [f"cost model: {model.source} ({hardware}); times in ms per {pass_name}"]
    all_m, all_p = [], []
    for name, sc in sorted(scenarios.items(), key=lambda kv: (kv[0].rsplit("_b", 1)[0], kv[1].meta["batch"])):
        rows = [r for r in measured if r["scenario"] == name]
        if not rows:
            continue
        plans = {p["name"]: p for p in sc.meta["plans"]}
        per_plan: dict[str, dict] = {}
        m_share, p_share = [], []
        for r in rows:
            p = predicted_share_ms(sc, plans[r["plan"]], r["gpu"], model)
            per_plan.setdefault(r["plan"], {"measured": [], "predicted": []})
            per_plan[r["plan"]]["measured"].append(r[key])
            per_plan[r["plan"]]["predicted"].append(p)
            m_share.append(r[key])
            p_share.append(p)
        all_m += m_share
        all_p += p_share
        slow_m = {n: max(v["measured"]) for n, v in per_plan.items()}
        slow_p = {n: max(v["predicted"]) for n, v in per_plan.items()}
        names = list(per_plan)
        r2 = r_squared(np.array(m_share), np.array(p_share))
        rho = spearman([slow_m[n] for n in names], [slow_p[n] for n in names])
        lines.append(
            f"\n{name} (batch {sc.meta['batch']}, {sc.meta['num_gpus']} GPUs): per-share R^2 {r2:.3f}, "
            f"plan ranking Spearman {rho:.3f}"
        )
        lines.append(
            f"{'plan':<20} {'measured':>10} {'predicted':>10} {'gain meas.':>11} {'gain pred.':>11} "
            f"{'pred/meas':>10}"
        )
        base_m, base_p = slow_m.get("recshard"), slow_p.get("recshard")
        entry: dict = {"batch": sc.meta["batch"], "share_r2": r2, "spearman": rho, "plans": {}}
        for n in sorted(names, key=lambda n: slow_m[n]):
            gain_m = slow_m[n] / base_m if base_m else float("nan")
            gain_p = slow_p[n] / base_p if base_p else float("nan")
            lines.append(
                f"{n:<20} {slow_m[n]:>10.4f} {slow_p[n]:>10.4f} {gain_m:>10.2f}x {gain_p:>10.2f}x "
                f"{gain_p / gain_m if gain_m else float('nan'):>10.2f}"
            )
            entry["plans"][n] = {
                "measured_ms": slow_m[n],
                "predicted_ms": slow_p[n],
                "gain_measured": gain_m,
                "gain_predicted": gain_p,
            }
        fastest = min(slow_m, key=lambda n: slow_m[n])
        if fastest != "recshard" and base_m:
            lines.append(
                f"  RecShard is not the fastest: {fastest} is {base_m / slow_m[fastest]:.3f}x faster"
            )
        worst = max(
            (abs(np.log(p["gain_predicted"] / p["gain_measured"])), n) for n, p in entry["plans"].items()
        )
        entry["worst_gain_ratio"] = float(np.exp(worst[0]))
        lines.append(
            f"  targets: per-share R^2 {r2:.3f} {'>=' if r2 >= TARGET_R2 else '<'} {TARGET_R2}; Spearman {rho:.3f} "
            f"{'>=' if rho >= TARGET_SPEARMAN else '<'} {TARGET_SPEARMAN}; predicted gain off by at most "
            f"{entry['worst_gain_ratio']:.2f}x ({worst[1]}; target {1 + TARGET_GAIN_ERROR:.2f}x); RecShard "
            + (
                "fastest"
                if fastest == "recshard"
                else f"{base_m / slow_m[fastest]:.3f}x slower than {fastest}"
            )
        )
        summary["scenarios"][name] = entry
    lines.append(
        f"\nall shares: R^2 {r_squared(np.array(all_m), np.array(all_p)):.3f} over {len(all_m)} shares"
    )
    summary["share_r2_all"] = r_squared(np.array(all_m), np.array(all_p))
    print("\n".join(lines))
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="held-out ids and plans of one manifest at one batch size (CPU)")
    p.add_argument("--manifest", required=True)
    p.add_argument("--logs", required=True, help="the held-out day's logs (Parquet)")
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--out", required=True, help="directory for this scenario (ids.npz, plans.json)")
    m = sub.add_parser("measure", help="time every prepared share (GPU; numpy + torch only)")
    m.add_argument("--inputs", required=True, help="directory holding prepared scenario directories")
    m.add_argument("--out", required=True, help="results, one JSON line per share (appended as measured)")
    m.add_argument("--device", default="cuda")
    m.add_argument("--reps", type=int, default=10)
    m.add_argument("--budget-s", type=float, default=420.0)
    r = sub.add_parser("report", help="measured vs predicted (CPU)")
    r.add_argument("--inputs", required=True)
    r.add_argument("--results", required=True)
    r.add_argument("--hardware", required=True, help="hardware config whose cost model predicts")
    r.add_argument("--pass", dest="pass_name", default="step", choices=("step", "forward"))
    r.add_argument("--json", default=None, help="also write the summary here")
    args = parser.parse_args(argv)
    if args.step == "prepare":
        print(prepare(args.manifest, args.logs, args.batch, args.out))
    elif args.step == "measure":
        measure(args.inputs, args.out, args.device, args.reps, args.budget_s)
    else:
        summary = report(args.inputs, args.results, args.hardware, args.pass_name)
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
