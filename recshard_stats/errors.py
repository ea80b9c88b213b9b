"""The project's one error type: a reason, a message with the numbers, and possible fixes."""

from __future__ import annotations

import enum


class Reason(enum.Enum):
    CONFIG_INVALID = "config_invalid"
    INPUT_MISSING = "input_missing"
    INPUT_CORRUPT = "input_corrupt"
    OUTPUT_BUSY = "output_busy"
    OUTPUT_INVALID = "output_invalid"
    SCHEMA_MISMATCH = "schema_mismatch"
    TOO_MANY_REJECTS = "too_many_rejects"
    STATS_INVALID = "stats_invalid"
    INFEASIBLE_HBM = "infeasible_hbm"
    INFEASIBLE_HOST = "infeasible_host"
    SOLVER_UNAVAILABLE = "solver_unavailable"
    SOLVER_FAILED = "solver_failed"
    NO_INCUMBENT = "no_incumbent"
    MANIFEST_INVALID = "manifest_invalid"
    MANIFEST_MISMATCH = "manifest_mismatch"
    NO_DEVICE = "no_device"
    SPARK_FAILED = "spark_failed"


class RecShardError(Exception):
    """Raised for every expected failure; the CLI prints it as one line plus context."""

    def __init__(
        self, reason: Reason, message: str, *, fixes: tuple[str, ...] = (), context: dict | None = None
    ):
        self.reason = reason
        self.message = message
        self.fixes = tuple(fixes)
        self.context = dict(context or {})
        super().__init__(self.render())

    def render(self) -> str:
        text = f"[{self.reason.value}] {self.message}"
        if self.fixes:
            text += " Possible fixes: " + "; ".join(self.fixes) + "."
        return text
