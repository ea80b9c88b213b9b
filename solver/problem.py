"""Plain-data inputs of the solver, built from a stats partition + model and hardware configs."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from recshard_stats.config import HardwareConfig, ModelConfig
from recshard_stats.costmodel import TableLoad, tier_bags
from recshard_stats.distributions import CountOfCounts, HitEstimate, good_turing_values
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.stats_reader import StatsPartition, check_profiled_with
from recshard_stats.units import fmt_bytes


@dataclasses.dataclass(frozen=True)
class TableDemand:
    """One embedding table as the cost model sees it."""

    name: str
    features: tuple[str, ...]
    hash_size: int
    dim: int
    hash: str
    row_bytes: float
    accesses_per_batch: float  # a_j = B * cov_j * pf_j (ids per sample, summed over features)
    coc: CountOfCounts  # access count -> rows, from the profile
    pooling_factor: float  # mean ids per present sample
    coverage: float = 1.0  # largest coverage among its features
    feature_pooling: tuple[float, ...] = ()  # mean ids per sample, per feature (TorchRec's pooling_factors)
    column_shards: int = 1  # > 1: one of that many column shards of a table (dim, row_bytes already cut)
    longest_bag: float = 0.0  # ids in the longest bag a batch is expected to hold (of any feature)
    hit_estimate: HitEstimate = HitEstimate.HELD_OUT  # how a row's profiled count predicts new data

    def column_shard(self, k: int) -> TableDemand:
        """One of k column shards: dim / k columns, 1/k of the row bytes, every access and row
        touched (1/k of the per-byte terms, all the per-lookup ones)."""
        if k == 1:
            return self
        return dataclasses.replace(self, dim=self.dim // k, row_bytes=self.row_bytes / k, column_shards=k)

    def most_column_shards(self, num_gpus: int, limit: int) -> int:
        """The most shards it may be cut into: a power of 2 dividing dim, at most num_gpus and limit."""
        k = 1
        while 2 * k <= min(num_gpus, limit) and self.dim % (2 * k) == 0:
            k *= 2
        return k

    def shard_counts(self, num_gpus: int, limit: int) -> tuple[int, ...]:
        """The shard counts it may be cut into: 1, 2, 4, ... up to :meth:`most_column_shards`."""
        return tuple(2**i for i in range(self.most_column_shards(num_gpus, limit).bit_length()))

    @property
    def size_bytes(self) -> float:
        return self.hash_size * self.row_bytes

    @property
    def unique_rows(self) -> int:
        return min(self.coc.unique_rows, self.hash_size)

    @functools.cached_property
    def _values(self) -> tuple[np.ndarray, float]:
        if self.hit_estimate is HitEstimate.IN_SAMPLE:
            return self.coc.counts.astype(np.float64), 0.0
        return good_turing_values(self.coc, self.hash_size)

    @property
    def row_values(self) -> np.ndarray:
        """Expected accesses of new data per row, for each profiled access-count class (hottest
        first): Good-Turing's held-out value (:func:`~recshard_stats.distributions.good_turing_values`),
        or the profiled count itself in-sample (rows scored on the sample that ranked them)."""
        return self._values[0]

    @property
    def unseen_row_value(self) -> float:
        """Expected accesses of new data per never-seen row (0 in-sample)."""
        return self._values[1]

    @functools.cached_property
    def _draw_probability(self) -> float:
        """The chance that one sample of the profile is in a given batch (B / samples profiled)."""
        total = self.coc.total_accesses
        return min(self.accesses_per_batch / total, 1.0) if total else 0.0

    def _in_batch(self, values) -> np.ndarray:
        """Chance that a row with ``values`` expected accesses per profile is touched by a batch."""
        q = self._draw_probability
        values = np.asarray(values, dtype=np.float64)
        return np.where(values > 0, 1.0, 0.0) if q >= 1 else -np.expm1(values * np.log1p(-q))

    @functools.cached_property
    def _rows_in_batch(self) -> tuple[np.ndarray, float]:
        """The chance a batch touches a row: per access-count class, and per never-seen row."""
        return self._in_batch(self.row_values), float(self._in_batch(self.unseen_row_value))

    def distinct_rows(self, rows_hbm) -> np.ndarray:
        """Expected distinct rows a batch touches among the rows_hbm first rows of the remap (a
        row accessed v times in the profile is in a batch with chance 1 - (1 - B/N)^v)."""
        rows_hbm = np.asarray(rows_hbm, dtype=np.float64)
        if self.coc.total_accesses == 0:
            return np.zeros_like(rows_hbm)
        return self._over_first_rows(rows_hbm, *self._rows_in_batch)

    def _over_first_rows(self, rows, per_class, per_unseen: float) -> np.ndarray:
        """The sum of a per-row value over the ``rows`` first rows of the remap: seen rows by
        class, hottest first, then never-seen rows."""
        return self.coc.top_sum(np.minimum(rows, self.unique_rows), per_class) + per_unseen * np.clip(
            rows - self.unique_rows, 0, None
        )

    @functools.cached_property
    def distinct_per_batch(self) -> float:
        return float(self.distinct_rows(self.hash_size))

    def hbm_fraction(self, rows_hbm) -> np.ndarray:
        """Predicted share of new data's accesses served by HBM with the rows_hbm first rows of
        the remap (seen rows hottest first, then never-seen rows) there."""
        rows_hbm = np.asarray(rows_hbm, dtype=np.float64)
        total = self.coc.total_accesses
        if total == 0:
            return np.zeros_like(rows_hbm)
        return np.minimum(
            self._over_first_rows(rows_hbm, self.row_values, self.unseen_row_value) / total, 1.0
        )


@dataclasses.dataclass(frozen=True)
class Problem:
    """Tables to place on the GPUs. After :func:`~recshard_stats.solver.column_split.split_problem`
    an entry may be a column shard of a model table: ``parent`` maps each entry to its table's
    index (empty: every entry is a whole table), and shards of one table go to different GPUs."""

    tables: tuple[TableDemand, ...]
    hardware: HardwareConfig
    parent: tuple[int, ...] = ()

    @functools.cached_property
    def shard_groups(self) -> tuple[tuple[int, ...], ...]:
        """The entries of each table cut into column shards (tables left whole are left out)."""
        groups: dict[int, list[int]] = {}
        for j, p in enumerate(self.parent):
            groups.setdefault(p, []).append(j)
        return tuple(tuple(g) for g in groups.values() if len(g) > 1)

    @functools.cached_property
    def shard_rows(self) -> dict[int, int]:
        """Per column shard: the rows its table keeps in HBM at the pooled water level (the fewest
        any of its shards gets in the pooled split), where every GPU's HBM runs out in a plan that
        reaches the pooled bound; the search holds shards there (:mod:`solver.local_search`)."""
        from recshard_stats.solver.waterfill import split

        if not self.shard_groups:
            return {}
        pooled = split(self, list(range(len(self.tables))), self.pooled_rows_capacity)
        return {j: min(pooled[k] for k in group) for group in self.shard_groups for j in group}

    @functools.cached_property
    def siblings(self) -> tuple[tuple[int, ...], ...]:
        """Per entry: the other column shards of its table (which may not share its GPU)."""
        out: list[tuple[int, ...]] = [()] * len(self.tables)
        for group in self.shard_groups:
            for j in group:
                out[j] = tuple(k for k in group if k != j)
        return tuple(out)

    @property
    def num_gpus(self) -> int:
        return self.hardware.num_gpus

    @property
    def hbm_capacity(self) -> float:
        """Usable HBM bytes per GPU (after the reserve), for rows and the trainer's buffers."""
        return float(self.hardware.usable_hbm_bytes)

    @functools.cached_property
    def trainer_bytes(self) -> tuple[int, ...]:
        """Per table: the HBM its GPU gives the trainer's buffers for it (ids, pooled outputs),
        whatever its rows (:meth:`HardwareConfig.trainer_bytes`)."""
        hw = self.hardware
        return tuple(
            hw.trainer_bytes(t.accesses_per_batch / hw.batch_size, len(t.features), t.dim)
            for t in self.tables
        )

    def buffer_bytes(self, tables) -> int:
        """The trainer's buffers of ``tables`` (indices into ``tables``) in HBM."""
        return sum(self.trainer_bytes[j] for j in tables)

    @property
    def pooled_rows_capacity(self) -> float:
        """HBM bytes left for rows on all GPUs together, after every table's buffers."""
        return self.hbm_capacity * self.num_gpus - self.buffer_bytes(range(len(self.tables)))

    def rows_capacity(self, tables) -> float:
        """HBM bytes left for rows on a GPU holding ``tables`` (negative: their buffers overflow it)."""
        return self.hbm_capacity - self.buffer_bytes(tables)

    @functools.cached_property
    def comm_bytes(self) -> tuple[float, ...]:
        """Per table: the ids and pooled outputs its GPU exchanges per batch
        (:meth:`HardwareConfig.comm_bytes`)."""
        hw = self.hardware
        return tuple(
            hw.comm_bytes(t.accesses_per_batch / hw.batch_size, len(t.features), t.dim) for t in self.tables
        )

    def load(
        self, table: TableDemand, rows_hbm, comm_bytes: float = 0.0, gpu: int = 0, linear: bool = False
    ) -> TableLoad:
        """A table (or column shard) with its rows_hbm hottest rows in HBM, as the cost model sees it:
        its bags run in each tier it has rows in (a split table in both). ``linear``: the solver's
        view, every table's bags in its cheaper tier only (a constant: the cost stays linear in the
        rows and never above the exact one; the kernel-call polish counts the rest)."""
        distinct_hbm = table.distinct_rows(rows_hbm)
        bags = float(self.hardware.batch_size * len(table.features))
        if linear:
            costs = self.hardware.costs
            cheaper_in_hbm = costs.hbm.per_bag(table.row_bytes) <= costs.host.per_bag(table.row_bytes)
            bags_hbm, bags_host = (bags, 0.0) if cheaper_in_hbm else (0.0, bags)
        else:
            bags_hbm, bags_host = tier_bags(bags, rows_hbm, table.hash_size)
        return TableLoad(
            gpu,
            table.accesses_per_batch,
            table.hbm_fraction(rows_hbm),
            distinct_hbm,
            table.distinct_per_batch - distinct_hbm,
            table.row_bytes,
            table.size_bytes,
            comm_bytes,
            bags_hbm,
            bags_host,
            table.longest_bag,
            1.0 / table.column_shards,
        )

    def demand_cost(self, table: TableDemand, rows_hbm, comm_bytes: float = 0.0):
        """The solver's per-batch seconds of a table (or column shard) with its rows_hbm hottest
        rows in HBM (:meth:`load` with ``linear``)."""
        return self.hardware.costs.table_seconds(self.load(table, rows_hbm, comm_bytes, linear=True))

    def table_cost(self, j: int, rows_hbm) -> float:
        """The cost model: per-batch seconds of table j with its rows_hbm hottest rows in HBM."""
        return float(self.demand_cost(self.tables[j], rows_hbm, self.comm_bytes[j]))

    def saving_fraction(self, j: int, rows_hbm) -> np.ndarray:
        """Share of table j's possible saving (all in UVM -> all in HBM) its rows_hbm hottest rows
        in HBM give: concave in the rows (the MILP's cuts lie above it); F itself under v1."""
        t = self.tables[j]
        uvm, hbm = self.uvm_time(j), self.hbm_time(j)
        if uvm <= hbm:
            return np.zeros_like(np.asarray(rows_hbm, dtype=np.float64))
        return (uvm - np.asarray(self.demand_cost(t, rows_hbm, self.comm_bytes[j]))) / (uvm - hbm)

    def row_savings(self, j: int) -> tuple[np.ndarray, float]:
        """Seconds per batch one row of table j saves in HBM: per access-count class (hottest
        first), and per never-seen row."""
        t = self.tables[j]
        lookup_hbm, lookup_host, distinct_hbm, distinct_host = self.hardware.costs.unit_costs(
            t.row_bytes, t.size_bytes
        )
        per_access = t.accesses_per_batch / max(t.coc.total_accesses, 1) * (lookup_host - lookup_hbm)
        per_distinct = distinct_host - distinct_hbm
        seen, unseen = t._rows_in_batch
        return t.row_values * per_access + seen * per_distinct, float(
            t.unseen_row_value * per_access + unseen * per_distinct
        )

    @functools.cached_property
    def entry_row_bytes(self) -> np.ndarray:
        """Per entry: the bytes of one of its rows."""
        return np.array([t.row_bytes for t in self.tables], dtype=np.float64)

    @functools.cached_property
    def row_segments(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Per entry: (seconds one row saves in HBM, rows) of each access-count class, hottest
        first, then of its never-seen rows (the water-fill asks for them again and again)."""
        out = []
        for j, t in enumerate(self.tables):
            seen, unseen = self.row_savings(j)
            out.append(
                (
                    np.append(seen, unseen),
                    np.append(t.coc.rows.astype(np.float64), float(t.hash_size - t.unique_rows)),
                )
            )
        return tuple(out)

    def uvm_time(self, j: int) -> float:
        """Per-batch seconds of table j with every access served from UVM."""
        return self.table_cost(j, 0)

    def hbm_time(self, j: int) -> float:
        """Per-batch seconds of table j with every access served from HBM."""
        return self.table_cost(j, self.tables[j].hash_size)

    def check_capacity(self) -> None:
        """Infeasible whatever the plan: the trainer's buffers must fit in HBM (each table's on one
        GPU, all of them on all GPUs), and all tables in HBM + host memory together."""
        buffers = self.trainer_bytes
        hw = self.hardware
        fixes = (
            f"lower batch_size ({hw.batch_size})",
            "raise hbm_per_gpu_gib or lower hbm_reserved_fraction",
            "add GPUs" if len(buffers) > 1 else "lower the table's dim",
        )
        worst = max(range(len(buffers)), key=lambda j: buffers[j], default=None)
        if worst is not None and buffers[worst] > self.hbm_capacity:
            raise RecShardError(
                Reason.INFEASIBLE_HBM,
                f"table {self.tables[worst].name!r} alone needs {fmt_bytes(buffers[worst])} of HBM for the "
                f"trainer's ids and pooled outputs at batch {hw.batch_size}, a GPU has "
                f"{fmt_bytes(self.hbm_capacity)} usable (short by {fmt_bytes(buffers[worst] - self.hbm_capacity)})",
                fixes=fixes[:2],
                context={"needed_bytes": int(buffers[worst]), "hbm_bytes": int(self.hbm_capacity)},
            )
        if sum(buffers) > self.num_gpus * self.hbm_capacity:
            raise RecShardError(
                Reason.INFEASIBLE_HBM,
                f"the trainer's ids and pooled outputs at batch {hw.batch_size} need {fmt_bytes(sum(buffers))} of "
                f"HBM for all tables, the {self.num_gpus} GPUs have {fmt_bytes(self.num_gpus * self.hbm_capacity)} "
                f"usable (short by {fmt_bytes(sum(buffers) - self.num_gpus * self.hbm_capacity)})",
                fixes=fixes,
                context={
                    "needed_bytes": int(sum(buffers)),
                    "hbm_bytes": int(self.num_gpus * self.hbm_capacity),
                },
            )
        total = sum(t.size_bytes for t in self.tables)
        hbm = self.num_gpus * self.hbm_capacity - sum(buffers)
        host_needed = total - hbm
        if host_needed > self.hardware.host_bytes:
            raise RecShardError(
                Reason.INFEASIBLE_HOST,
                f"tables need {fmt_bytes(total)} in all; with {fmt_bytes(hbm)} of usable HBM for rows "
                f"({self.num_gpus} GPUs x {fmt_bytes(self.hbm_capacity)}, less the trainer's buffers) they need "
                f"{fmt_bytes(host_needed)} of host memory, config gives {fmt_bytes(self.hardware.host_bytes)} "
                f"(short by {fmt_bytes(host_needed - self.hardware.host_bytes)})",
                fixes=("raise host_gib", "add GPUs", "shrink hash sizes or dims"),
                context={"needed_bytes": int(host_needed), "host_bytes": self.hardware.host_bytes},
            )


def build_problem(
    stats: StatsPartition,
    model: ModelConfig,
    hardware: HardwareConfig,
    hit_estimate: HitEstimate = HitEstimate.HELD_OUT,
) -> Problem:
    check_profiled_with(stats, model)
    rows = {r["table"]: r for r in stats.rows("tables")}
    features = {r["feature"]: r for r in stats.rows("features")}
    histograms: dict[str, list[tuple[int, int]]] = {}
    for r in stats.rows("pooling_histogram"):
        histograms.setdefault(r["feature"], []).append((r["pooling_factor"], r["samples"]))
    tables = []
    for table in model.tables:
        if table.name not in rows:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"stats at {stats.path} have no table {table.name!r}",
                fixes=("profile with this model config",),
            )
        row = rows[table.name]
        if row["hash_size"] != table.hash_size:
            raise RecShardError(
                Reason.STATS_INVALID,
                f"table {table.name!r}: stats were computed with hash_size {row['hash_size']}, "
                f"model config says {table.hash_size}",
                fixes=("re-run the profile",),
            )
        present = sum(features[f]["present_samples"] for f in table.features)
        pooling = row["total_accesses"] / present if present else 0.0
        tables.append(
            TableDemand(
                name=table.name,
                features=table.features,
                hash_size=table.hash_size,
                dim=table.dim,
                hash=table.hash,
                row_bytes=hardware.row_bytes(table.dim),
                accesses_per_batch=hardware.batch_size * row["accesses_per_sample"],
                coc=stats.count_of_counts("table", table.name),
                pooling_factor=pooling,
                coverage=max(features[f]["coverage"] for f in table.features),
                feature_pooling=tuple(features[f]["pf_mean"] for f in table.features),
                longest_bag=max(
                    longest_bag(histograms.get(f, []), hardware.batch_size) for f in table.features
                ),
                hit_estimate=hit_estimate,
            )
        )
    return Problem(tuple(tables), hardware)


def with_hit_estimate(problem: Problem, estimate: HitEstimate) -> Problem:
    """The same problem with every table's rows valued by ``estimate``."""
    return dataclasses.replace(
        problem, tables=tuple(dataclasses.replace(t, hit_estimate=estimate) for t in problem.tables)
    )


def longest_bag(histogram: list[tuple[int, int]], batch: int) -> float:
    """The pooling factor a batch of ``batch`` samples reaches once: the smallest whose larger
    ones are at most one sample in ``batch`` (1 - 1/batch quantile of the profile's histogram)."""
    if not histogram:
        return 1.0
    pf, samples = (np.array(a, dtype=np.float64) for a in zip(*sorted(histogram), strict=True))
    above = samples.sum() - np.cumsum(samples)  # samples with a larger pooling factor
    return float(pf[np.argmax(above <= samples.sum() / batch)])


def breakpoints(problem: Problem, j: int, num: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, S) at ~num log-spaced points from 0 to unique_rows, then the whole table (S, the
    saving fraction, is linear over the never-seen rows): where the MILP's cut lines touch S."""
    table = problem.tables[j]
    u = table.unique_rows
    if u == 0:
        return np.array([0.0]), np.array([0.0])
    # from u / 10^4 rows on: a finer head would only add lines too steep for the solvers'
    # numerics (the first line then lies further above S there: a looser relaxation, still valid)
    head = max(1.0, u / 1e4)
    pts = np.unique(np.round(np.logspace(math.log10(head), math.log10(u), max(num - 1, 1))))
    # S is linear over each access-count class: a line at a class's first row is S over that whole
    # class. The classes of at least 1/num of the rows get theirs (at most num more lines): without
    # one, a wide class lies under the line of a hotter one, which can claim the whole saving far
    # too early (8 classes of 1,000 rows: 6,500 rows "saved" all 36,000 accesses)
    starts = np.concatenate([[0], np.cumsum(table.coc.rows)[:-1]]).astype(np.float64)
    wide = starts[(table.coc.rows >= u / max(num, 1)) & (starts >= head) & (starts < u)]
    pts = np.unique(np.concatenate([[0.0], pts, wide, [float(u), float(table.hash_size)]]))
    return pts, problem.saving_fraction(j, pts)
