"""Each stage's options as one frozen dataclass. A field's default is the only place that default
lives: the console script and the spark-submit jobs build their arguments from the fields
(:func:`add_arguments`) and turn parsed arguments back into the dataclass (:func:`from_args`).

Field metadata: ``help`` (the argument's help), ``flag`` (when the flag is not ``--field-name``),
``required`` (a field the command line must give although the library has a default).
Booleans become ``store_true`` flags (``store_false`` when the flag says ``--no-``); tuples take
one or more values.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import re
import typing

from recshard_stats.errors import Reason, RecShardError

SOLVERS = ("glpk", "cbc", "highs")
PARQUET_READERS = ("arrow", "spark")
HIT_ESTIMATES = ("held_out", "in_sample")  # distributions.HitEstimate
DEFAULT_MAX_REJECT_FRACTION = 0.01
HLL_LG_K_RANGE = (4, 21)
ROW_SAMPLE_BITS_RANGE = (0, 16)


MASTER_PATTERN = r"local(\[(\d+|\*)(,\d+)?\])?|yarn|(spark|k8s|mesos)://\S+"
MEMORY_PATTERN = r"\d+([kmgtp]b?)?"


def _opt(default=dataclasses.MISSING, help: str = "", **meta):
    return dataclasses.field(default=default, metadata={"help": help, **meta})


def _invalid(message: str, *fixes: str) -> RecShardError:
    return RecShardError(Reason.CONFIG_INVALID, message, fixes=fixes)


def check_ds(ds: str) -> str:
    """A run key must be a real ``YYYY-MM-DD`` date: it becomes a ``ds=<date>`` directory name."""
    try:
        if isinstance(ds, str) and len(ds) == 10 and datetime.date.fromisoformat(ds).isoformat() == ds:
            return ds
    except ValueError:
        pass
    raise _invalid(f"ds {ds!r} is not a date of the form YYYY-MM-DD", "e.g. --ds 2026-12-01")


@dataclasses.dataclass(frozen=True)
class SketchOptions:
    """Approximate-profile sketch settings. ``lg_config_k``: HLL registers 2**k; the relative
    standard error of a distinct count is about 1.04 / sqrt(2**k). ``row_sample_bits``:
    count-of-counts from one row in 2**bits of each table (0 keeps every row, so count-of-counts
    and CDFs stay exact)."""

    lg_config_k: int
    row_sample_bits: int

    def __post_init__(self):
        low, high = HLL_LG_K_RANGE
        if not low <= self.lg_config_k <= high:
            raise _invalid(f"HLL lg_config_k must be in {low}..{high}, got {self.lg_config_k}")
        low, high = ROW_SAMPLE_BITS_RANGE
        if not low <= self.row_sample_bits <= high:
            raise _invalid(f"row_sample_bits must be in {low}..{high}, got {self.row_sample_bits}")

    @property
    def relative_standard_error(self) -> float:
        return 1.04 / math.sqrt(2**self.lg_config_k)


@dataclasses.dataclass(frozen=True)
class SparkOptions:
    master: str | None = _opt(None, "Spark master (default: spark-submit's, else local[*])")
    driver_memory: str | None = _opt(
        None, "driver memory in local mode, e.g. 4g (default: half of this machine's memory)"
    )
    spark_log: str | None = _opt(
        None,
        "Spark's own log in local mode (default: recshard-spark-<user>.log in the "
        "temp dir; the console shows recshard's lines only)",
    )
    class_archive: bool = _opt(
        True,
        "do not map or save the JVM's class archive (by default the first local run saves "
        "the classes Spark loaded to ~/.cache/recshard/jvm, about 130 MB, and later runs "
        "start about 4 s faster)",
        flag="--no-class-archive",
    )

    def __post_init__(self):
        # what Spark would only reject after starting its JVM, with a Java trace
        if self.master is not None and not re.fullmatch(MASTER_PATTERN, self.master):
            raise _invalid(
                f"--master {self.master!r} is not a Spark master URL",
                "local, local[N], local[*], spark://host:port, yarn or k8s://https://host:port",
            )
        if self.driver_memory is not None and not re.fullmatch(MEMORY_PATTERN, self.driver_memory, re.I):
            raise _invalid(
                f"--driver-memory {self.driver_memory!r} is not a JVM memory size",
                "a number with k, m, g or t, e.g. 4g or 512m",
            )


@dataclasses.dataclass(frozen=True)
class SyntheticDrift:
    """How generated logs drift from day to day (``recshard generate --day N``): day 0 is the
    spec itself; every setting is per day, so day N has N times the change."""

    day: int = _opt(0, "which day of a drifting series to generate (0: the spec as written)")
    hot_rotation: float = _opt(
        0.0,
        "share of each feature's cardinality by which its popularity ranks shift per day: the "
        "hot ids of day N were colder ids on day 0",
        flag="--drift-hot-rotation",
    )
    new_ids: float = _opt(
        0.0,
        "share of the draws of a day N >= 1 going to ids of that day alone (never drawn on other days)",
        flag="--drift-new-ids",
    )
    coverage_trend: float = _opt(
        0.0, "added to each feature's coverage per day (clipped to [0, 1])", flag="--drift-coverage"
    )
    pooling_shift: float = _opt(
        0.0,
        "relative change of each multi-hot feature's mean pooling factor per day (0.1: 10%% more "
        "ids per sample each day)",
        flag="--drift-pooling",
    )

    def __post_init__(self):
        if self.day < 0:
            raise _invalid(f"--day must be 0 or more, got {self.day}")
        if not 0 <= self.hot_rotation <= 1:
            raise _invalid(f"--drift-hot-rotation must be in [0, 1], got {self.hot_rotation}")
        if not 0 <= self.new_ids <= 1:
            raise _invalid(f"--drift-new-ids must be in [0, 1], got {self.new_ids}")
        if not -1 <= self.coverage_trend <= 1:
            raise _invalid(f"--drift-coverage must be in [-1, 1], got {self.coverage_trend}")
        if not -1 < self.pooling_shift <= 10:
            raise _invalid(f"--drift-pooling must be in (-1, 10], got {self.pooling_shift}")


@dataclasses.dataclass(frozen=True)
class ProfileOptions:
    model: str = _opt(help="model config (YAML/TOML): features, tables, input format")
    inputs: tuple[str, ...] = _opt(help="log files or directories (Parquet or Criteo TSV)", flag="--input")
    out: str = _opt(help="stats root; the partition is <out>/ds=<date>")
    ds: str | None = _opt(None, "partition date YYYY-MM-DD (default: today)")
    sample_fraction: float = _opt(1.0, "profile this fraction of samples (Bernoulli, recorded in metadata)")
    seed: int = _opt(0, "seed of the sampling")
    cdf_points: int = _opt(128, "access-CDF breakpoints per feature/table")
    row_counts: bool = _opt(False, "also write per-row access counts (for remap)")
    id_counts: bool = _opt(False, "also write per-id access counts (what `recshard window` merges days from)")
    max_reject_fraction: float = _opt(
        DEFAULT_MAX_REJECT_FRACTION,
        "fail when more than this fraction of rows (or of one column's values) is rejected",
    )
    approximate: bool = _opt(
        False,
        "for inputs with too many distinct ids to count one by one: access counts "
        "per hashed row, HLL sketches for distinct ids (error bound in the metadata); "
        "one more pass over the input",
    )
    hll_lg_k: int = _opt(
        14,
        "with --approximate: HLL sketches of 2**k registers, 4..21; relative standard "
        "error about 1.04/sqrt(2**k) (14: 0.81%%)",
    )
    row_sample_bits: int = _opt(
        0,
        "with --approximate: count-of-counts from one row in 2**bits of each table "
        "(tables keep at least 65536 rows; 0: every row, exact access CDFs)",
    )
    skip_corrupt_files: bool = _opt(
        False,
        "leave out input files that cannot be read (each costs one more pass "
        "over the input) and list them in the stats metadata under "
        "skipped_files; default: fail",
    )
    max_skipped_files: int = _opt(10, "with --skip-corrupt-files, fail once more files than this are corrupt")
    parquet_reader: str = _opt(
        "arrow",
        "Parquet and uncompressed Criteo TSV logs: 'arrow' reads them with pyarrow in the "
        "Spark tasks (fast; needs pyarrow on the executors and a filesystem it opens: "
        "local, HDFS, S3, GCS), 'spark' with Spark's reader (any Hadoop filesystem; also "
        "used with --sample-fraction)",
        choices=PARQUET_READERS,
    )

    def __post_init__(self):
        if self.ds is not None:
            check_ds(self.ds)
        if not 0 < self.sample_fraction <= 1:
            raise _invalid(f"--sample-fraction must be in (0, 1], got {self.sample_fraction}")
        if self.cdf_points < 2:
            raise _invalid(f"--cdf-points must be at least 2, got {self.cdf_points}")
        if not 0 <= self.max_reject_fraction <= 1:
            raise _invalid(f"--max-reject-fraction must be in [0, 1], got {self.max_reject_fraction}")
        if self.max_skipped_files < 0:
            raise _invalid(f"--max-skipped-files must be >= 0, got {self.max_skipped_files}")
        if self.approximate and self.row_counts:
            raise _invalid(
                "per-row access counts (--row-counts, for remap) need the exact profile",
                "drop --approximate",
                "or drop --row-counts",
            )
        _ = self.sketch  # validates the sketch settings

    @property
    def sketch(self) -> SketchOptions | None:
        return SketchOptions(self.hll_lg_k, self.row_sample_bits) if self.approximate else None

    @property
    def partition_ds(self) -> str:
        return self.ds or datetime.date.today().isoformat()


@dataclasses.dataclass(frozen=True)
class WindowOptions:
    model: str = _opt(help="model config the days were profiled with")
    stats: str = _opt(help="stats root holding the days, <stats>/ds=<date> (profiled with --id-counts)")
    out: str = _opt(help="window root; the partition is <out>/ds=<date>")
    ds: str | None = _opt(None, "the window's last day YYYY-MM-DD (default: today)")
    days: int = _opt(7, "days in the window, ending at --ds")
    min_days: int | None = _opt(None, "fail when fewer days than this have stats (default: --days)")
    half_life_days: float | None = _opt(
        None,
        "weight each day's counts by 0.5 ** (age in days / this), rounded to whole accesses "
        "(default: every day counts fully, an exact merge)",
        flag="--half-life",
    )
    cdf_points: int = _opt(ProfileOptions.cdf_points, "access-CDF breakpoints per feature/table")

    def __post_init__(self):
        if self.ds is not None:
            check_ds(self.ds)
        if self.days < 1:
            raise _invalid(f"--days must be at least 1, got {self.days}")
        if self.min_days is not None and not 1 <= self.min_days <= self.days:
            raise _invalid(f"--min-days must be in 1..--days ({self.days}), got {self.min_days}")
        if self.half_life_days is not None and not 0 < self.half_life_days < math.inf:
            raise _invalid(f"--half-life must be a positive number of days, got {self.half_life_days}")
        if self.cdf_points < 2:
            raise _invalid(f"--cdf-points must be at least 2, got {self.cdf_points}")

    @property
    def partition_ds(self) -> str:
        return self.ds or datetime.date.today().isoformat()


@dataclasses.dataclass(frozen=True)
class DriftOptions:
    day: str = _opt(help="the newest day's stats partition (profiled with --id-counts)")
    reference: str = _opt(help="what it is compared with: the window of the days before it (or one day)")
    out: str = _opt(help="drift report to write (JSON)")
    manifest: str | None = _opt(
        None,
        "the published plan (manifest.json or its directory, with remap files): how its HBM rows serve the day",
    )
    thresholds: str | None = _opt(None, "thresholds file (default: conf/drift.yaml shipped with recshard)")
    published_root: str | None = _opt(
        None, "instead of --manifest: the plan published under this root (its latest.json), if any"
    )
    missing_reference_ok: bool = _opt(
        False,
        "when --reference does not exist (the first day of a series), write a report that says so "
        "instead of failing",
    )

    def __post_init__(self):
        if self.manifest is not None and self.published_root is not None:
            raise _invalid("give --manifest or --published-root, not both")


@dataclasses.dataclass(frozen=True)
class SolveOptions:
    """What the solver runs with; recorded in the manifest's inputs (their digest names the plan)."""

    solver: str = _opt("cbc", "MILP solver", choices=SOLVERS)
    time_limit_s: float = _opt(
        60.0,
        "wall seconds for the whole solve: starts, local search, the MILP with its "
        "build (TorchRec's planner, a baseline, is timed apart)",
        flag="--time-limit",
    )
    mip_gap: float = _opt(0.01, "relative MIP gap to stop at")
    cdf_segments: int = _opt(16, "linear pieces of each table's access CDF in the MILP")
    symmetry_breaking: bool = _opt(True, "", flag="--no-symmetry-breaking")
    local_search_s: float = _opt(
        20.0,
        "seconds of local search (moves and swaps judged by the exact split), "
        "half before the MILP and half after it; 0: none",
        flag="--local-search",
    )
    max_column_shards: int = _opt(
        8,
        "most column shards a hot table may be cut into (a power of 2 that divides "
        "its dim, at most the GPUs); 1: every table whole",
        flag="--max-column-shards",
    )
    torchrec_baselines: bool = _opt(
        True,
        "leave out TorchRec's planner as a baseline (it runs when torchrec is installed)",
        flag="--no-torchrec",
    )
    torchrec_timeout_s: int = _opt(
        120, "seconds TorchRec's planner may search (it keeps its best plan)", flag="--torchrec-timeout"
    )
    hit_estimate: str = _opt(
        "held_out",
        "what a row's profiled count predicts of new data: held_out (Good-Turing, what data that "
        "did not rank the rows sees) or in_sample (the counts themselves, optimistic)",
        choices=HIT_ESTIMATES,
    )
    max_moved_gib: float | None = _opt(
        None,
        "with --previous: at most this many GiB of tables may change GPU against the previous plan "
        "(moves the search made are taken back, least useful per byte first; default: no cap)",
        flag="--max-moved-gib",
    )

    def __post_init__(self):
        if self.max_moved_gib is not None and not 0 <= self.max_moved_gib < math.inf:
            raise _invalid(f"--max-moved-gib must be 0 or more GiB, got {self.max_moved_gib}")
        if self.solver not in SOLVERS:
            raise _invalid(f"unknown solver {self.solver!r}", f"use one of {SOLVERS}")
        if not 0 < self.time_limit_s < math.inf:
            raise _invalid(
                f"--time-limit must be a positive finite number of seconds, got {self.time_limit_s}"
            )
        if not 0 <= self.mip_gap < 1:
            raise _invalid(f"--mip-gap must be in [0, 1), got {self.mip_gap}")
        if self.cdf_segments < 1:
            raise _invalid(f"--cdf-segments must be at least 1, got {self.cdf_segments}")
        if not 0 <= self.local_search_s < math.inf:
            raise _invalid(f"--local-search must be 0 or more seconds (finite), got {self.local_search_s}")
        if self.max_column_shards < 1 or self.max_column_shards & (self.max_column_shards - 1):
            raise _invalid(
                f"--max-column-shards must be a power of 2 (1: no splits), got {self.max_column_shards}"
            )
        if self.torchrec_timeout_s < 1:
            raise _invalid(f"--torchrec-timeout must be at least 1 second, got {self.torchrec_timeout_s}")


@dataclasses.dataclass(frozen=True)
class RemapOptions:
    manifest: str = _opt(help="manifest.json or its directory")
    stats: str | None = _opt(
        None, "stats partition profiled with --row-counts (default: the manifest's inputs.stats)"
    )


@dataclasses.dataclass(frozen=True)
class ReplayOptions:
    manifest: str = _opt(help="manifest.json (with remap files) or its directory")
    logs: tuple[str, ...] = _opt(help="held-out logs (same format as profiled)")
    out: str | None = _opt(None, "evaluation JSON (default: <manifest dir>/evaluation.json)")
    max_reject_fraction: float = _opt(
        DEFAULT_MAX_REJECT_FRACTION, "fail when more than this fraction of rows is rejected"
    )
    published_root: str | None = _opt(
        None,
        "also replay the logs through the manifest published under this root (its latest.json, "
        "when one is published for the same model and hardware) into published_evaluation.json "
        "beside --out: what `recshard publish` compares",
    )


def _flag(field: dataclasses.Field) -> str:
    return field.metadata.get("flag") or "--" + field.name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = ()) -> None:
    """One argument per field of the options dataclass ``cls``, defaults from the fields."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        hint, flag, help_text = hints[field.name], _flag(field), field.metadata.get("help", "")
        kwargs: dict = {"dest": field.name}
        if field.default is dataclasses.MISSING:
            kwargs["required"] = True
        elif hint is not bool:
            kwargs["default"] = field.default
            help_text += "" if field.default is None else f" (default {field.default})"
        if hint is bool:
            kwargs.update(
                action="store_false" if flag.startswith("--no-") else "store_true", default=field.default
            )
        else:
            args = typing.get_args(hint)
            if typing.get_origin(hint) is tuple:
                kwargs["nargs"] = "+"
                base = args[0]
            else:
                base = next((a for a in args if a is not type(None)), hint)
            kwargs["type"] = base
            if "choices" in field.metadata:
                kwargs["choices"] = field.metadata["choices"]
        parser.add_argument(flag, help=help_text or None, **kwargs)


def from_args(cls: type, args: argparse.Namespace, **overrides):
    """The options dataclass ``cls`` from parsed arguments (lists become tuples)."""
    values = {}
    for field in dataclasses.fields(cls):
        if field.name in overrides:
            values[field.name] = overrides[field.name]
        elif hasattr(args, field.name):
            value = getattr(args, field.name)
            values[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)
