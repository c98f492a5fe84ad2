"""A round's check: its rollouts scored, the experience contract applied, the experience
pipeline run on the rows it accepts. Pure: the caller records the outcome and stores the rows."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.data.contracts import ContractBounds, Verdict, check_experiences
from rftflow.components.data.pipelines import run_pipeline
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.rewards import RewardFn
from rftflow.components.verify.scoring import score, unavailable_reasons


@dataclass
class Checked:
    """The outcome of ``check_round``: ``verdict`` (the contract's accepted and quarantined rows of
    ``scored``), ``dropped`` (accepted rows the pipeline dropped, with their reason) and ``verified``
    (the rows kept, ``reason`` null, then every rejected row with its reason)."""

    scored: pa.Table
    verdict: Verdict
    dropped: pa.Table | None = None
    verified: pa.Table = field(default_factory=pa.table)

    def metrics(self) -> dict[str, float]:
        rewards = self.scored.column("reward")
        out = {"reward/mean": pc.mean(rewards).as_py(), "reward/std": pc.stddev(rewards).as_py() or 0.0,
               **per_reward_means(self.scored), "contract/accepted": self.verdict.counts["accepted"],
               "verify/quarantined": self.verdict.counts["quarantined"]}
        if self.dropped is not None:
            out["verify/pipeline_dropped"] = self.dropped.num_rows
        return out


def check_round(rollouts: pa.Table, tasks_by_id: dict[str, Task], reward_fn: RewardFn, reward_name: str,
                bounds: ContractBounds, pipeline: list[dict[str, Any]], seed: int) -> Checked:
    """Score ``rollouts`` against their tasks, check them against the experience contract
    (``bounds``, its reward bounds widened to the rewards' declared range: ``reward_bounds``), and
    run ``pipeline`` (a list of operator steps; empty: none) on the rows it
    accepts."""
    bounds = reward_bounds(bounds, getattr(reward_fn, "bounds", None))
    scored = score(rollouts, tasks_by_id, reward_fn, reward_name)
    unavailable = unavailable_reasons(scored)
    if any(unavailable):  # the reward's infrastructure failed on these: quarantined, never scored 0 or 1
        failed = pa.array([r is not None for r in unavailable])
        cut = scored.filter(failed)
        reasons = pa.array([f"reward unavailable: {r}" for r in unavailable if r is not None], pa.string())
        scored = scored.filter(pc.invert(failed))
    verdict = check_experiences(scored, bounds)
    if any(unavailable):
        verdict = verdict.with_quarantined(cut.append_column("reason", reasons))
    accepted, rejected, dropped = verdict.accepted, verdict.quarantined, None
    if pipeline:
        result = run_pipeline("experiences", accepted, pipeline, seed=seed)
        accepted, dropped = result.kept, result.dropped
        rejected = pa.concat_tables([rejected, dropped], promote_options="default")
    reasons = pa.array([None] * accepted.num_rows, pa.string())
    verified = pa.concat_tables([accepted.append_column("reason", reasons), rejected])
    return Checked(scored, verdict, dropped, verified)


def reward_bounds(bounds: ContractBounds, declared: tuple[float, float] | None) -> ContractBounds:
    """``bounds`` with the contract's reward bounds widened where ``declared`` — the least and most a
    row's total can be by the rewards' declared ranges (None: unknown) — goes past [0, 1]; bounds
    set within [0, 1] on purpose stay."""
    if declared is None:
        return bounds
    low = min(bounds.reward_min, declared[0]) if declared[0] < 0.0 else bounds.reward_min
    high = max(bounds.reward_max, declared[1]) if declared[1] > 1.0 else bounds.reward_max
    return replace(bounds, reward_min=low, reward_max=high)


def per_reward_means(scored: pa.Table) -> dict[str, float]:
    """``reward/fn/<name>/mean``: each reward's (term's) mean over the rows it scored (the ``rewards`` map)."""
    sums: dict[str, list[float]] = {}
    for terms in scored.column("rewards").to_pylist():
        for name, value in terms or ():
            sums.setdefault(name, []).append(value)
    return {f"reward/fn/{name}/mean": sum(v) / len(v) for name, v in sorted(sums.items())}


def per_taskset_rewards(scored: pa.Table, tasks_by_id: dict[str, Task]) -> dict[str, float]:
    """``reward/<part>/mean`` of each mixture part's rows (nothing outside a mixture)."""
    sums: dict[str, list[float]] = {}
    for task_id, reward in zip(scored.column("task_id").to_pylist(), scored.column("reward").to_pylist()):
        part = tasks_by_id[task_id].metadata.get("taskset")
        if part is not None and reward is not None:
            sums.setdefault(part, []).append(reward)
    return {f"reward/{part}/mean": sum(v) / len(v) for part, v in sorted(sums.items())}
