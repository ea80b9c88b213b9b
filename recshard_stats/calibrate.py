"""``recshard calibrate``: the cost model's terms (:mod:`recshard_stats.costmodel`) measured on
the user's GPU with the trainer's kernels (:mod:`recshard_stats.lookup_kernels`), fitted by
non-negative least squares, written as a calibration file a hardware config references.

The grid sweeps tier x dim x table size x batch x pooling factor x id distribution (uniform,
or Zipf with hot rows scattered over the table), within a time budget, in an order that spreads
a cut-short sweep over the whole grid. Each configuration gives the forward time and the step
time (forward + backward + update); the backward's terms are fitted on their difference.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import pathlib
import time

import numpy as np

from recshard_stats.costmodel import (
    SPAN_HIGH_BYTES,
    SPAN_LOW_BYTES,
    CostModel,
    PassTerms,
    TierTerms,
    calibration_to_file,
    span_ramp,
)
from recshard_stats.lookup_kernels import (
    HBM,
    HOST,
    TBE,
    TORCH,
    cuda_available,
    device_name,
    kernel_name,
    release_cached_memory,
    tbe_available,
)
from recshard_stats.units import GIB, MS_PER_S, NS, PS, US

# the fitted terms, in the order of the design matrix's columns after the constant
FEATURES = ("lookup_s", "byte_s", "distinct_s", "distinct_byte_s", "span_distinct_s", "bag_s", "bag_byte_s")
DEFAULT_BUDGET_S, DEFAULT_HOST_GIB, DEFAULT_REPS = 180.0, 8.0, 10  # `recshard calibrate`'s defaults
MIN_SECONDS = 1e-6  # a floor for the fit's relative weights
LONG_BAG = 512  # the long bag the grid's chain configurations hold
POOR_FIT = 0.9  # a step fit below this R^2 is reported as poor


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One configuration's shape and its times (seconds)."""

    tier: str
    lookups: int
    distinct: int
    row_bytes: int
    span_bytes: int
    forward_s: float
    step_s: float
    bags: int = 0
    longest_bag: int = 0


@dataclasses.dataclass(frozen=True)
class GridPoint:
    tier: str
    dim: int
    rows: int
    batch: int
    pooling: int
    dist: str
    empty_share: float = 0.0  # share of the bags left empty (a split table's other tier has many)
    long_bag: int = 0  # one bag of this many ids (a multi-hot feature's longest)


def default_grid(device: str, host_gib: float) -> list[GridPoint]:
    """Tables from 64 MiB to ``host_gib`` (spanning both host regimes), dims 16-256, batch 2048 to
    65536, one id or ten per bag, uniform and skewed ids; on CPU a small grid that only checks
    the loop."""
    dims: tuple[int, ...]
    spans: tuple[int, ...]
    batches: tuple[int, ...]
    pools: tuple[int, ...]
    if device == "cpu":
        dims, spans, batches, pools = (16, 64), (2**22, 2**24), (256, 1024), (1, 4)
    else:
        dims, batches, pools = (16, 64, 256), (2048, 16384, 65536), (1, 10)
        spans = tuple(s for s in (2**26, 2**28, 2**30, 2**31, 2**32, 2**33) if s <= host_gib * GIB)
    # bags of one id, of ten, of one id with 7 in 8 bags empty (bags apart from lookups), and of
    # one id but one bag of 512 (the longest bag's serial sum)
    shapes = [(pf, 0.0, 0) for pf in pools] + [(1, 0.875, 0), (1, 0.0, LONG_BAG)]
    grid = [
        GridPoint(tier, dim, span // (4 * dim), batch, pf, dist, empty, long)
        for tier, dim, span, batch, (pf, empty, long), dist in itertools.product(
            (HBM, HOST), dims, spans, batches, shapes, ("uniform", "zipf")
        )
    ]
    # a sweep cut short by the budget still covers every tier, size and batch
    return [grid[i] for i in np.random.default_rng(0).permutation(len(grid))]


def bag_lengths(point: GridPoint, rng: np.random.Generator) -> np.ndarray:
    """Ids per bag: ``pooling`` each, ``empty_share`` of the bags empty, one long bag if asked."""
    lengths = np.full(point.batch, point.pooling)
    lengths[rng.permutation(point.batch)[: int(point.batch * point.empty_share)]] = 0
    if point.long_bag:
        lengths[rng.integers(point.batch)] = point.long_bag
    return lengths


def draw_ids(point: GridPoint, n: int, rng: np.random.Generator) -> np.ndarray:
    if point.dist == "uniform":
        return rng.integers(0, point.rows, n)
    # Zipf over ranks (P(rank k) ~ 1/k), hot rows scattered over the table by a multiplicative hash
    ranks = np.minimum(_zipf_ranks(point.rows, n, rng), point.rows - 1)
    return (ranks * 2654435761) % point.rows


def _zipf_ranks(rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """Ranks with P(k) ~ 1/(k+1) over [0, rows): inverse CDF of the continuous 1/x law."""
    u = rng.random(n)
    return np.floor(np.expm1(u * math.log(rows + 1.0))).astype(np.int64)


def measure_grid(
    grid: list[GridPoint],
    device: str,
    budget_s: float,
    reps: int = DEFAULT_REPS,
    progress=print,
    kernel: str = TORCH,
) -> list[Measurement]:
    """Times each point in turn until the budget is spent (plain PyTorch: one pool per tier,
    allocated once; TBE: a module per point, its own memory)."""
    from recshard_stats.lookup_kernels import KernelGroup, TbeTable, WeightPools, time_groups, time_tbe

    largest = {
        tier: max((p.rows * p.dim * 4 for p in grid if p.tier == tier), default=4) for tier in (HBM, HOST)
    }
    started = time.time()
    if kernel == TORCH:
        pools = WeightPools(device, largest[HBM], largest[HOST])
        progress(
            f"calibrate: pools ready in {time.time() - started:.1f}s (HBM {largest[HBM] / GIB:.2f} GiB, "
            f"host {largest[HOST] / GIB:.2f} GiB, device {device})"
        )
    rng = np.random.default_rng(1)
    out = []
    for i, point in enumerate(grid):
        if time.time() - started > budget_s:
            progress(f"calibrate: budget of {budget_s:.0f}s spent after {i} of {len(grid)} configurations")
            break
        lengths = bag_lengths(point, rng)
        ids = draw_ids(point, int(lengths.sum()), rng)
        offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        if kernel == TBE:
            tbe = TbeTable(point.tier, point.rows, point.dim, ids, offsets, device)
            timing, distinct = time_tbe(tbe, reps), tbe.distinct
            del tbe  # its module (and on CUDA its captured graphs) before the next configuration
        else:
            group = KernelGroup.of(pools.weights(point.tier, point.rows, point.dim), ids, offsets)
            timing, distinct = time_groups([group], reps), len(group.distinct)
            del group
        out.append(
            Measurement(
                point.tier,
                len(ids),
                distinct,
                point.dim * 4,
                point.rows * point.dim * 4,
                timing.forward_s,
                timing.step_s,
                point.batch,
                int(lengths.max()),
            )
        )
        if (i + 1) % 20 == 0:
            if device.startswith("cuda"):
                release_cached_memory()  # the captured graphs' pools, the TBE modules
            progress(f"calibrate: {i + 1}/{len(grid)} configurations, {time.time() - started:.0f}s")
    return out


def measurements_from_grid_file(path: str | pathlib.Path) -> list[Measurement]:
    """The shared grid's JSON lines (``kind: calib``, ``tier: hbm | uvm``) as measurements."""
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") != "calib":
            continue
        row_bytes = r["bytes"] // r["lookups"]
        out.append(
            Measurement(
                HBM if r["tier"] == "hbm" else HOST,
                r["lookups"],
                r["unique"],
                row_bytes,
                r["rows"] * row_bytes,
                r["fwd"]["ms"] / MS_PER_S,
                r["full"]["ms"] / MS_PER_S,
                r["batch"],
                r["pf"],
            )
        )
    return out


def design(ms: list[Measurement], low: float, high: float) -> np.ndarray:
    """Columns: 1, lookups, bytes looked up, distinct rows, their bytes, distinct rows x span ramp,
    bags, their output bytes."""
    ramp = span_ramp([m.span_bytes for m in ms], low, high)
    lookups = np.array([m.lookups for m in ms], dtype=np.float64)
    distinct = np.array([m.distinct for m in ms], dtype=np.float64)
    row_bytes = np.array([m.row_bytes for m in ms], dtype=np.float64)
    bags = np.array([m.bags for m in ms], dtype=np.float64)
    return np.column_stack(
        [
            np.ones(len(ms)),
            lookups,
            lookups * row_bytes,
            distinct,
            distinct * row_bytes,
            distinct * ramp,
            bags,
            bags * row_bytes,
        ]
    )


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson), columns scaled to unit norm for the numerics."""
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale
    n = a.shape[1]
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(3 * n + 10):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=0.0) <= 1e-12 * max(np.abs(b).max(), 1e-30):
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x / scale


def r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(((y - y.mean()) ** 2).sum())
    return 1.0 - float(((y - predicted) ** 2).sum()) / total if total > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class TierFit:
    terms: TierTerms
    r2: float
    configurations: int


@dataclasses.dataclass(frozen=True)
class Fit:
    model: CostModel
    fits: dict[str, dict[str, TierFit]]  # pass ("forward", "backward", "step") -> tier -> fit

    def summary(self) -> str:
        lines = [f"{'pass':<9} {'tier':<5} {'R^2':>7} {'configs':>8}  terms"]
        for p, tiers in self.fits.items():
            for tier, fit in tiers.items():
                t = fit.terms
                lines.append(
                    f"{p:<9} {tier:<5} {fit.r2:>7.4f} {fit.configurations:>8}  fixed {t.fixed_s / US:.2f} us, "
                    f"lookup {t.lookup_s / NS:.3f} ns + {t.byte_s / PS:.3f} ps/B, distinct row "
                    f"{t.distinct_s / NS:.3f} ns + {t.distinct_byte_s / PS:.3f} ps/B "
                    f"+ {t.span_distinct_s / NS:.3f} ns x span ramp, bag {t.bag_s / NS:.3f} ns "
                    f"+ {t.bag_byte_s / PS:.3f} ps/B, chain {t.chain_s / NS:.1f} ns per id"
                )
        lines.append(
            f"host span ramp: {self.model.span_low_bytes / GIB:g} GiB -> {self.model.span_high_bytes / GIB:g} GiB"
        )
        return "\n".join(lines)


def _fit_tier(
    ms: list[Measurement], y: np.ndarray, low: float, high: float, host: bool, scale: np.ndarray | None = None
) -> TierFit:
    """NNLS with each row divided by sqrt(``scale``, default y): between absolute error (where the
    largest configurations set the fixed terms, 8x too high for small batches on the shared H200
    grid) and relative error (where the largest are underfit); R^2 is on the absolute times."""
    a = design(ms, low, high)
    if not host:
        a[:, 5] = 0.0  # HBM has no span ramp
    w = 1.0 / np.sqrt(np.maximum(y if scale is None else scale, MIN_SECONDS))
    coef = nnls(a * w[:, None], y * w)
    return TierFit(TierTerms(coef[0], *coef[1:]), r_squared(y, a @ coef), len(ms))


def _chain(ms: list[Measurement], terms: TierTerms, model: CostModel) -> float:
    """Seconds per id of a call's longest bag: the forward is max(fixed + work, chain x longest
    bag); fitted by a search over chain on the configurations with a long bag."""
    long = [m for m in ms if m.longest_bag >= LONG_BAG]
    if not long:
        return 0.0
    t = np.array([m.forward_s for m in long])
    work = design(long, model.span_low_bytes, model.span_high_bytes) @ _coefficients(terms)
    length = np.array([m.longest_bag for m in long], dtype=np.float64)
    choices = np.concatenate([[0.0], np.geomspace(1e-10, 1e-5, 301)])
    predicted = np.maximum(work[None, :], choices[:, None] * length[None, :])
    error = ((np.log(predicted) - np.log(t)[None, :]) ** 2).sum(axis=1)  # in log: small and large alike
    return float(choices[int(np.argmin(error))])


def fit(ms: list[Measurement]) -> Fit:
    """Per tier, forward and backward terms by NNLS on the configurations without a long bag;
    the host ramp's ends chosen (among powers of 2) for the best step fit; then each tier's
    chain term on those with one."""
    chains = {tier: [m for m in ms if m.tier == tier] for tier in (HBM, HOST)}
    ms = [m for m in ms if m.longest_bag < LONG_BAG]
    by_tier = {tier: [m for m in ms if m.tier == tier] for tier in (HBM, HOST)}
    missing = [tier for tier, sub in by_tier.items() if len(sub) < 6]
    if missing:
        raise ValueError(
            f"too few measurements to fit tier(s) {', '.join(missing)} (need 6 each, have "
            f"{', '.join(f'{t}: {len(s)}' for t, s in by_tier.items())}); raise --budget-s"
        )
    host = by_tier[HOST]
    step_y = np.array([m.step_s for m in host])
    # the ramp's ends: powers of 2 from half the smallest host table to twice the largest
    smallest, largest = min(m.span_bytes for m in host), max(m.span_bytes for m in host)
    spans = [2.0**k for k in range(int(math.log2(smallest)) - 1, int(math.log2(largest)) + 2)]
    low, high = SPAN_LOW_BYTES, SPAN_HIGH_BYTES
    if smallest < largest:
        low, high = max(
            ((lo, hi) for lo, hi in itertools.combinations(spans, 2)),
            key=lambda p: _fit_tier(host, step_y, p[0], p[1], True).r2,
        )
    fits: dict[str, dict[str, TierFit]] = {"forward": {}, "backward": {}, "step": {}}
    for tier, sub in by_tier.items():
        forward = np.array([m.forward_s for m in sub])
        step = np.array([m.step_s for m in sub])
        fits["forward"][tier] = _fit_tier(sub, forward, low, high, tier == HOST)
        fits["backward"][tier] = _fit_tier(
            sub, np.maximum(step - forward, 0.0), low, high, tier == HOST, step
        )
        both = fits["forward"][tier].terms + fits["backward"][tier].terms
        fits["step"][tier] = TierFit(
            both, r_squared(step, design(sub, low, high) @ _coefficients(both)), len(sub)
        )
    model = CostModel(
        PassTerms(fits["forward"][HBM].terms, fits["forward"][HOST].terms),
        PassTerms(fits["backward"][HBM].terms, fits["backward"][HOST].terms),
        low,
        high,
        source="calibration",
    )
    chained = {
        tier: dataclasses.replace(
            fits["forward"][tier].terms, chain_s=_chain(chains[tier], fits["forward"][tier].terms, model)
        )
        for tier in (HBM, HOST)
    }
    fits["forward"] = {
        tier: dataclasses.replace(f, terms=chained[tier]) for tier, f in fits["forward"].items()
    }
    return Fit(dataclasses.replace(model, forward=PassTerms(chained[HBM], chained[HOST])), fits)


def _coefficients(t: TierTerms) -> np.ndarray:
    return np.array([t.fixed_s, *(getattr(t, f) for f in FEATURES)])


def calibration_document(result: Fit, device_name: str, kernel: str, measured_on: str) -> dict:
    return calibration_to_file(
        result.model,
        device=device_name,
        kernel=kernel,
        measured_on=measured_on,
        created_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        fit={
            p: {tier: {"r2": round(f.r2, 4), "configurations": f.configurations} for tier, f in tiers.items()}
            for p, tiers in result.fits.items()
        },
    )


def calibrate(
    out: str | pathlib.Path,
    device: str = "cuda",
    budget_s: float = DEFAULT_BUDGET_S,
    host_gib: float = DEFAULT_HOST_GIB,
    reps: int = DEFAULT_REPS,
    from_grid: str | None = None,
    measurements_out: str | None = None,
    progress=print,
    kernel: str = "auto",
) -> Fit:
    """Measure (or read ``from_grid``), fit, and write the calibration file atomically."""
    from recshard_stats.atomic import write_text_atomic
    from recshard_stats.errors import Reason, RecShardError

    if from_grid is not None:
        ms, name, kernel, where = (
            measurements_from_grid_file(from_grid),
            "from grid",
            "as measured",
            str(from_grid),
        )
        name = _grid_device(from_grid) or name
    else:
        if device.startswith("cuda") and not cuda_available():
            raise RecShardError(
                Reason.NO_DEVICE,
                "no CUDA GPU is visible to torch: calibrate measures the GPU the trainer will run on",
                fixes=("run it on the training machine", "--device cpu only checks the measuring loop"),
            )
        if kernel == "auto":  # what TorchRec runs where it can, else the plain-PyTorch kernels
            kernel = TBE if tbe_available(device) and device != "cpu" else TORCH
        elif kernel == TBE and not tbe_available(device):
            raise RecShardError(
                Reason.NO_DEVICE,
                f"FBGEMM's TBE has no kernels for {device} here",
                fixes=("install fbgemm_gpu built for this torch and GPU", "--kernel torch"),
            )
        grid = default_grid("cpu" if device == "cpu" else "cuda", host_gib)
        ms = measure_grid(grid, device, budget_s, reps, progress, kernel)
        name, kernel, where = device_name(device), kernel_name(kernel), f"{len(ms)} configurations measured"
        if measurements_out:
            write_text_atomic(measurements_out, "".join(json.dumps(dataclasses.asdict(m)) + "\n" for m in ms))
    result = fit(ms)
    progress(result.summary())
    for tier, f in result.fits["step"].items():
        if f.r2 < POOR_FIT:
            progress(
                f"calibrate: warning: the {tier} step fit has R^2 {f.r2:.3f} < {POOR_FIT}: the terms explain the "
                "times poorly (a busy or throttled device, or too few configurations: raise --budget-s)"
            )
    import yaml

    document = calibration_document(result, name, kernel, where)
    write_text_atomic(
        out,
        f"# written by `recshard calibrate`: the cost model's terms on {name}\n"
        + yaml.safe_dump(document, sort_keys=False),
    )
    progress(f"calibrate: wrote {out}; reference it from a hardware config as `calibration: {out}`")
    return result


def _grid_device(path) -> str | None:
    for line in pathlib.Path(path).read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "env" and r.get("name"):
            return str(r["name"])
    return None
