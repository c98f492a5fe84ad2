"""Train's stage of a round: the policy updated on the round's batch (``buffer.sampling``: explorer
rows by FIFO or replay, plus expert rows, mixed and ordered) at the round's learning rate, then those
explorer rows marked consumed. The caller (``campaign.stages``) counts the policy's version."""

from __future__ import annotations

from typing import Any

from rftflow.components.train.trainer import Trainer


def update(trainer: Trainer, sampler: Any, policy_version: int, round_no: int, rounds: int) -> dict[str, float]:
    """One update of ``trainer``'s policy (of ``policy_version``) on round ``round_no``'s batch from
    ``sampler`` (a ``buffer.sampling.Sampler``); its metrics, with ``train/lr``."""
    batch = sampler.round_batch(policy_version, round_no)
    lr = trainer.round_lr(round_no, rounds)
    trainer.set_lr(lr)
    metrics = {**trainer.train(batch.rows, batch.steps), **batch.metrics, "train/lr": lr}
    batch.commit()
    return metrics
