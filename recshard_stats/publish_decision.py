"""Whether a candidate manifest replaces the published one (``recshard publish``).

A new plan is only worth the churn of re-sharding a trainer when it is faster on the data the
trainer will see. Given the newest logs replayed through both plans (two ``recshard evaluate``
outputs on the same logs), the candidate is published only when its slowest GPU is faster than
the published plan's by ``margin``; it is published without a comparison when nothing is
published yet or the published plan was made for another model or hardware config (it may no
longer fit), and always with ``force``. The decision, with both figures and its reason, is
written as ``decision.json`` beside the candidate."""

from __future__ import annotations

import dataclasses
import json
import pathlib

from recshard_stats.atomic import write_text_atomic
from recshard_stats.errors import Reason, RecShardError
from recshard_stats.manifest_loader import ManifestFile
from recshard_stats.replay import RECSHARD, Evaluation
from recshard_stats.typed_json import to_plain

DEFAULT_MARGIN = 0.02  # the candidate must be this much faster than the published plan
DECISION_NAME = "decision.json"


@dataclasses.dataclass(frozen=True)
class PublishDecision:
    """``decision.json``: what ``recshard publish`` decided for a candidate, and why."""

    ds: str
    candidate: str  # the candidate's manifest.json
    published: str | None  # the manifest published when it was decided (None: nothing)
    publish: bool
    reason: str
    margin: float
    logs: tuple[str, ...]  # the replayed logs both figures come from (empty: not compared)
    candidate_ms: float | None  # replayed slowest GPU, per batch
    published_ms: float | None


def _check_evaluation(evaluation: Evaluation, manifest: ManifestFile, role: str, flag: str) -> None:
    if pathlib.Path(evaluation.manifest).resolve() != manifest.path.resolve():
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"{flag} replays {evaluation.manifest}, not the {role} manifest {manifest.path}",
            fixes=(f"recshard evaluate --manifest {manifest.path.parent} --logs <newest logs> --out <file>",),
        )


def decide(
    candidate: ManifestFile,
    published: ManifestFile | None,
    candidate_evaluation: Evaluation | None,
    published_evaluation: Evaluation | None,
    margin: float = DEFAULT_MARGIN,
    force: bool = False,
) -> PublishDecision:
    if not 0 <= margin < 1:
        raise RecShardError(Reason.CONFIG_INVALID, f"--margin {margin} is not a share in [0, 1)")

    def made(publish: bool, reason: str, logs=(), candidate_ms=None, published_ms=None) -> PublishDecision:
        return PublishDecision(
            ds=candidate.manifest.ds,
            candidate=str(candidate.path),
            published=str(published.path) if published else None,
            publish=publish,
            reason=reason,
            margin=margin,
            logs=tuple(logs),
            candidate_ms=candidate_ms,
            published_ms=published_ms,
        )

    if force:
        return made(True, "forced (--force)")
    if published is None:
        return made(True, "nothing is published yet")
    now, then = candidate.manifest.inputs, published.manifest.inputs
    for what, new, old in (
        ("model config", now.model_digest, then.model_digest),
        ("hardware config", now.hardware_digest, then.hardware_digest),
    ):
        if new != old:
            return made(True, f"the published plan was made for another {what}: it may no longer fit")
    if candidate_evaluation is None and published_evaluation is None:
        return made(True, "not compared: no evaluations given")
    if candidate_evaluation is None or published_evaluation is None:
        missing = "--evaluation" if candidate_evaluation is None else "--published-evaluation"
        raise RecShardError(
            Reason.INPUT_MISSING,
            f"{missing} is missing: the plans are compared on the same logs replayed through both",
            fixes=("give both evaluations", "leave both out to publish without comparing", "--force"),
        )
    _check_evaluation(candidate_evaluation, candidate, "candidate", "--evaluation")
    _check_evaluation(published_evaluation, published, "published", "--published-evaluation")
    if tuple(candidate_evaluation.logs) != tuple(published_evaluation.logs):
        raise RecShardError(
            Reason.MANIFEST_MISMATCH,
            f"the evaluations replay different logs: {list(candidate_evaluation.logs)} and "
            f"{list(published_evaluation.logs)}",
            fixes=("replay the same logs through both manifests",),
        )
    new_ms = candidate_evaluation.plans[RECSHARD].max_cost_ms
    old_ms = published_evaluation.plans[RECSHARD].max_cost_ms
    faster = 1 - new_ms / old_ms if old_ms > 0 else 0.0
    figures = f"{new_ms:.6g} ms against the published {old_ms:.6g} ms per batch on the replayed logs"
    better = new_ms <= old_ms * (1 - margin)
    reason = (
        f"faster by {faster:.1%} (margin {margin:.0%}): {figures}"
        if better
        else f"not faster by the margin {margin:.0%} ({faster:+.1%}): {figures}"
    )
    return made(better, reason, candidate_evaluation.logs, new_ms, old_ms)


def write_decision(decision: PublishDecision) -> pathlib.Path:
    path = pathlib.Path(decision.candidate).parent / DECISION_NAME
    return write_text_atomic(path, json.dumps(to_plain(decision), indent=2) + "\n")
