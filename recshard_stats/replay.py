"""Replay evaluation: held-out per-row access counts through a manifest's remap, and the
plans' per-batch cost on that data under the same cost model the solver predicted with.

Spark part (:func:`tier_hits`): a distributed join of held-out row counts with the remap
files; only per-table sums reach the driver. The rest (:func:`summarize`) is plain Python.
"""

from __future__ import annotations

from recshard_stats.costmodel import table_seconds

_MS = 1e3


def tier_hits(row_counts, remap, placement):
    """Per table: held-out accesses, those served from HBM under the plan, and accesses to rows
    the profile never saw.

    row_counts: (table, row, access_count); remap: (table, row, index) of seen rows;
    placement: (table, rows_hbm, unseen_below). A seen row is in HBM iff index < rows_hbm, a
    never-seen one iff row < unseen_below (see recshard_stats.manifest).
    """
    from pyspark.sql import functions as F

    joined = (row_counts.join(remap.select("table", "row", "index"), ["table", "row"], "left")
              .join(F.broadcast(placement), "table"))
    in_hbm = F.when(F.col("index").isNull(), F.col("row") < F.col("unseen_below")) \
        .otherwise(F.col("index") < F.col("rows_hbm"))
    return joined.groupBy("table").agg(
        F.sum("access_count").alias("accesses"),
        F.sum(F.when(in_hbm, F.col("access_count")).otherwise(0)).alias("hbm_accesses"),
        F.sum(F.when(F.col("index").isNull(), F.col("access_count")).otherwise(0)).alias("unseen_accesses"))


def _plan_cost(manifest: dict, hbm_fraction: dict[str, float], accesses_per_batch: dict[str, float],
               gpu_of: dict[str, int]) -> dict:
    hw = manifest["hardware"]
    gpus = [0.0] * len(manifest["gpus"])
    uvm = total = 0.0
    for t in manifest["tables"]:
        name = t["name"]
        a, f = accesses_per_batch[name], hbm_fraction[name]
        gpus[gpu_of[name]] += table_seconds(a, t["row_bytes"], f, hw["hbm_bandwidth"], hw["uvm_bandwidth"])
        uvm += a * (1 - f)
        total += a
    mean = sum(gpus) / len(gpus)
    return {"max_cost_ms": max(gpus) * _MS, "gpu_cost_ms": [c * _MS for c in gpus],
            "imbalance": max(gpus) / mean if mean else 1.0, "uvm_access_fraction": uvm / total if total else 0.0}


def summarize(manifest: dict, hits: dict[str, dict], num_samples: int) -> dict:
    """hits: table -> {accesses, hbm_accesses, unseen_accesses} on the held-out data."""
    batch = manifest["hardware"]["batch_size"]
    accesses = {t["name"]: batch * hits.get(t["name"], {}).get("accesses", 0) / num_samples
                for t in manifest["tables"]}
    recshard_f, tables = {}, []
    for t in manifest["tables"]:
        h = hits.get(t["name"], {"accesses": 0, "hbm_accesses": 0, "unseen_accesses": 0})
        f = h["hbm_accesses"] / h["accesses"] if h["accesses"] else 1.0
        recshard_f[t["name"]] = f
        tables.append({"name": t["name"], "gpu": t["gpu"], "accesses": h["accesses"],
                       "hbm_access_fraction": f, "predicted_hbm_access_fraction": t["predicted_hbm_access_fraction"],
                       "unseen_access_fraction": h["unseen_accesses"] / h["accesses"] if h["accesses"] else 0.0,
                       "accesses_per_batch": accesses[t["name"]],
                       "predicted_accesses_per_batch": t.get("accesses_per_batch")})
    recshard = _plan_cost(manifest, recshard_f, accesses, {t["name"]: t["gpu"] for t in manifest["tables"]})
    recshard["predicted_max_cost_ms"] = manifest["plan"]["objective_ms"]
    recshard["predicted_uvm_access_fraction"] = manifest["plan"]["uvm_access_fraction"]
    plans = {"recshard": recshard}
    for b in manifest["plan"]["baselines"]:
        # baselines keep whole tables in HBM or in UVM: their hit rate needs no remap
        names = [t["name"] for t in manifest["tables"]]
        f = {n: 1.0 if rows == t["hash_size"] else 0.0 if rows == 0 else None
             for n, rows, t in zip(names, b["rows_hbm"], manifest["tables"])}
        if any(v is None for v in f.values()):
            continue
        cost = _plan_cost(manifest, f, accesses, dict(zip(names, b["gpu"])))
        cost["predicted_max_cost_ms"] = b["max_cost_ms"]
        cost["predicted_uvm_access_fraction"] = b["uvm_access_fraction"]
        plans[b["name"]] = cost
    for name, p in plans.items():
        p["cost_vs_recshard"] = p["max_cost_ms"] / recshard["max_cost_ms"] if recshard["max_cost_ms"] else 1.0
    return {"num_samples": num_samples, "plans": plans, "tables": tables}
