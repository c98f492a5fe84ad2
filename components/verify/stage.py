"""Verify's stages: ``prepare_data`` (the taskset splits and the expert demonstrations checked by their
contracts, then stored) and ``verify_round`` (a round's rollouts through ``check.check_round``, the
outcome recorded, a round past the contract's threshold failed with its bad rows kept).

Explicit values in: the checked config, the store, the campaign's ``ValidationLog`` (each checked
batch adds its line), and what comes from other rooms as values or callables (the expert rows of
explore's workflows, the reward, the tasks by id). Metrics out; the verified rows go back to the
caller, which hands them to buffer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.layout import campaigns_in, round_dir
from rftflow.components.buffer.selectors import PassRates
from rftflow.components.config import CampaignConfig
from rftflow.components.data.contracts import ContractBounds, ContractError, check_experiences, enforce
from rftflow.components.data.pipelines import run_pipeline
from rftflow.components.data.report import ValidationLog
from rftflow.components.data.tasksets import (Task, load_mixture, load_tasks, recheck_tasks, tasks_from_table,
                                               tasks_to_table)
from rftflow.components.verify.check import check_round, per_taskset_rewards
from rftflow.components.verify.rewards import RewardFn


@dataclass
class Prepared:
    """``prepare_data``'s outcome: its metrics, and the train split it stored when it stored it first
    (None when an earlier attempt's split stays: read it back)."""

    metrics: dict[str, float]
    train: list[Task] | None


def prepare_data(cfg: CampaignConfig, store: ExperienceStore, validation: ValidationLog,
                 expert_rows: Callable[[list[Task]], pa.Table]) -> Prepared:
    """Build the taskset splits (the tasks pipeline, if any, run and rechecked) and the expert
    demonstrations (``expert_rows(train)``), check both by their contracts and store them
    (idempotent: a split stored already stays)."""
    taskset = (load_mixture(cfg.part_tasksets(), cfg.seed, cfg.contracts) if cfg.mixture
               else load_tasks(cfg.taskset, cfg.seed, cfg.contracts))
    train_table = tasks_to_table(taskset.train)
    metrics: dict[str, float] = {}
    if cfg.pipelines.tasks:
        result = run_pipeline("tasks", train_table, cfg.pipelines.tasks, seed=cfg.seed,
                              prompt_template=cfg.taskset.prompt_template, pass_rates=store_pass_rates(store))
        train_table, rejected = recheck_tasks(result.kept, taskset.held_out, cfg.contracts)
        dropped = pa.concat_tables([result.dropped, rejected], promote_options="default")
        validation.record("tasks pipeline", 0, train_table.num_rows + dropped.num_rows, dropped)
        store.write_quarantine("tasks-pipeline", dropped)
        metrics |= {"tasks/pipeline_dropped": dropped.num_rows, "tasks/pipeline_added": result.added}
    store.write_quarantine("tasks", taskset.quarantined)
    validation.record("tasks contract", 0, taskset.rows_checked, taskset.quarantined)
    fresh = not store.tasks_committed("train")  # else an earlier attempt's split stays, and is read back
    store.write_tasks("train", train_table)
    store.write_tasks("eval", tasks_to_table(taskset.held_out))
    train = tasks_from_table(train_table)
    expert = expert_rows(train)
    verdict = check_experiences(expert, ContractBounds.of(cfg.contracts), kind="expert")
    validation.record("expert contract", 0, expert.num_rows, verdict.quarantined)
    store.write_quarantine("expert", verdict.quarantined)  # kept even if the batch fails below
    enforce(verdict, cfg.contracts.max_bad_fraction, "expert demonstrations")
    store.write_expert(verdict.accepted)
    return Prepared({**metrics, "tasks/train": len(train), "tasks/eval": len(taskset.held_out),
                     "tasks/quarantined": taskset.quarantined.num_rows, "tasks/expert": verdict.accepted.num_rows},
                    train if fresh else None)


def store_pass_rates(store: ExperienceStore) -> PassRates:
    """Pass rates measured by every campaign in ``store``'s object store (tasks are keyed by question
    hash, so a task explored by an earlier campaign on the same source has a measured rate)."""
    return PassRates.merged(ExperienceStore(store.objects, name).read_state("pass_rates")
                            for name in campaigns_in(store.objects))


def verify_round(cfg: CampaignConfig, store: ExperienceStore, validation: ValidationLog, round_no: int,
                 rollouts: pa.Table, tasks_by_id: dict[str, Task], reward_fn: RewardFn,
                 max_model_version: int) -> tuple[pa.Table, dict[str, float]]:
    """Score ``rollouts``, check the experience contract (rows of a model newer than
    ``max_model_version`` are bad) and run the experience pipeline (``check.check_round``) → the
    verified rows (with ``reason``) and the metrics. A round past the contract's bad-row threshold
    fails here (``ContractError``), its bad rows kept under ``quarantine/failed``."""
    contracts = cfg.contracts
    bounds = ContractBounds.of(contracts, max_model_version=max_model_version, group_size=cfg.explorer.repeat_times)
    checked = check_round(rollouts, tasks_by_id, reward_fn, cfg.reward.function, bounds, cfg.pipelines.experiences,
                          cfg.seed)
    verdict = checked.verdict
    validation.record("experience contract", round_no, checked.scored.num_rows, verdict.quarantined)
    try:
        enforce(verdict, contracts.max_bad_fraction, f"round {round_no} experiences")
    except ContractError:  # the stage fails; its bad rows stay where `buffer show --kind failed` finds them
        store.write_quarantine(f"failed/{round_dir(round_no)}", verdict.quarantined)
        raise
    if checked.dropped is not None:
        validation.record("experience pipeline", round_no, verdict.accepted.num_rows, checked.dropped)
    return checked.verified, {**checked.metrics(), **per_taskset_rewards(checked.scored, tasks_by_id)}
