"""``WarmStart``: expert-only SFT steps before the RL rounds (``trainer.warmup_steps``), with its
own checkpoints, its resume, and the ``trainer.warmup_until`` check that can end it early.

Its dependencies come in explicitly (``campaign.stages`` wires them): the trainer, the sampler
(whose order RNG draws the steps), the weight store its checkpoints go to, the stop flag, the train
tasks (a callable: read lazily) and ``lowest_accuracy(groups)``, the greedy accuracy of the
trainer's own weights, lowest over groups of tasks (decoding is explore's: train does not import
it). The caller counts the policy's version and hands the weights to the explorer.
"""

from __future__ import annotations

import base64
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rftflow.components.buffer.weights import CorruptCheckpoint, WeightStore
from rftflow.components.config import TrainerConfig
from rftflow.components.data.tasksets import Task
from rftflow.components.stopping import StopFlag, StopRequested
from rftflow.components.train.checkpoints import load_trainer, save_trainer
from rftflow.components.train.trainer import Trainer

log = logging.getLogger("rftflow")


class WarmStart:
    """The warm start of one campaign's trainer. ``step``: steps of the newest warm-start
    checkpoint written or restored here (None: none)."""

    def __init__(self, trainer: Trainer, sampler, weight_store: WeightStore, settings: TrainerConfig, *,
                 base: str, stop: StopFlag, train_tasks: Callable[[], list[Task]],
                 lowest_accuracy: Callable[[list[list[Task]]], float]):
        self.trainer, self.sampler, self.weight_store, self.settings = trainer, sampler, weight_store, settings
        self.base, self.stop, self.train_tasks, self.lowest_accuracy = base, stop, train_tasks, lowest_accuracy
        self.step: int | None = None

    def run(self, progress=None) -> dict[str, float]:
        """``trainer.warmup_steps`` expert-only SFT steps (none: nothing happens). Every
        ``trainer.warmup_checkpoint_every`` steps (or ``warmup_checkpoint_minutes``) the warm start
        is checkpointed (``save``); a stop asked for meanwhile ends it after the current step
        (``StopRequested``), checkpointed there. A resumed campaign continues from the newest
        (``resume``) and ends where an uninterrupted one ends. With ``trainer.warmup_until`` it ends
        at the first check (every ``warmup_check_every`` steps, every step after one that reached
        ``warmup_check_near``) where ``accuracy`` reaches it (on every group of ``warmup_check_by``).
        ``progress(step, metrics)`` after each step. Its metrics."""
        tc = self.settings
        steps, metrics, done, near = tc.warmup_steps, {}, 0, False
        if not steps:
            return metrics
        saved_at = time.monotonic()

        def step_done(step: int, step_metrics: dict[str, float]) -> bool:
            nonlocal done, near, saved_at
            done = step
            reached = False
            if tc.warmup_until is not None and (near or step % tc.warmup_check_every == 0):
                metrics["warmup/check_accuracy"] = accuracy = self.accuracy()
                near = near or (tc.warmup_check_near is not None and accuracy >= tc.warmup_check_near)
                reached = accuracy >= tc.warmup_until
                step_metrics = {**step_metrics, "warmup/check_accuracy": accuracy}
            if progress is not None:  # the step's loss, and its check's accuracy where it had one
                progress(step, step_metrics)
            if reached:
                return True
            every, minutes = tc.warmup_checkpoint_every, tc.warmup_checkpoint_minutes
            due = (every and step % every == 0) or (minutes and time.monotonic() - saved_at >= 60 * minutes)
            if self.stop.reason or (due and step < steps):
                self.save(step, drawn_from, {"near": near, "metrics": metrics})
                saved_at = time.monotonic()
            if self.stop.reason:
                raise StopRequested(f"stopped ({self.stop.reason}) at step {step} of the warm start")
            return False

        if tc.warmup_until is not None:
            self.check_groups()  # a missing metadata key fails here, before any step
        resumed = self.resume()
        if resumed is not None:
            saved = resumed["order_rng"]  # the state the steps were drawn from: the same steps again
            self.sampler.order_rng.setstate((saved[0], tuple(saved[1]), saved[2]))
            done, near = resumed["step"], resumed["near"]
            metrics.update({**resumed["metrics"], "warmup/resumed_from_step": float(done)})
            log.info("the warm start resumes after step %d of %d", done, steps)
        drawn_from = self.sampler.order_rng.getstate()
        last = self.trainer.warm_start(self.sampler.warm_start_steps(steps), tc.warmup_lr, step_done, first=done)
        metrics.update({"warmup/steps": float(done), "warmup/loss_sft": last.get("loss/sft", float("nan"))})
        check = metrics.get("warmup/check_accuracy")
        if tc.warmup_until is not None and (check is None or check < tc.warmup_until):
            log.warning("the warm start ran all %d steps without reaching trainer.warmup_until %g (last check: "
                        "%s); the rounds start from there", done, tc.warmup_until,
                        "none" if check is None else f"{check:.3f}")
        return metrics

    def save(self, step: int, drawn_from: tuple, progress: dict[str, Any]) -> None:
        """Checkpoint the warm start after ``step`` steps (``WeightStore.write_warm_start``): the
        trainer (weights, optimizer, step count), torch's RNG, the sampler's RNG state its steps were
        drawn from (``drawn_from``) and ``progress`` (the ``warmup_until`` checks'). Not with
        ``trainer.fsdp`` (gathering the shards is a collective the other processes, stepping, would
        not join)."""
        if self.trainer.sharded:
            return
        with tempfile.TemporaryDirectory() as out:
            save_trainer(self.trainer, Path(out), base=self.base)
            resume = {"step": step, "order_rng": drawn_from, **progress,
                      "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
            (Path(out) / "warm_start.json").write_text(json.dumps(resume))
            self.weight_store.write_warm_start(step, Path(out), {"warmup_steps": self.settings.warmup_steps})
        self.step = step

    def resume(self) -> dict[str, Any] | None:
        """The newest whole warm-start checkpoint restored — the trainer (and its other processes),
        torch's RNG — and its ``warm_start.json`` returned; None when there is none (a corrupt one is
        reported in one line: the warm start then begins again)."""
        for manifest in reversed(self.weight_store.warm_starts()):
            try:
                with tempfile.TemporaryDirectory() as into:
                    self.weight_store.read_warm_start(manifest["step"], Path(into))
                    load_trainer(self.trainer, Path(into))
                    resume = json.loads((Path(into) / "warm_start.json").read_text())
            except CorruptCheckpoint as e:
                log.warning("%s: the warm start does not resume from it", e)
                continue
            self.trainer.share_state()
            rng = torch.frombuffer(bytearray(base64.b64decode(resume["torch_rng"])), dtype=torch.uint8)
            torch.set_rng_state(rng.clone())
            self.step = resume["step"]
            return resume
        return None

    def check_groups(self) -> list[list[Task]]:
        """The first ``trainer.warmup_check_tasks`` training tasks, grouped by metadata key
        ``trainer.warmup_check_by`` (one group without it)."""
        tasks, key = self.train_tasks()[:self.settings.warmup_check_tasks], self.settings.warmup_check_by
        if key is None:
            return [tasks]
        groups: dict[str, list[Task]] = {}
        for task in tasks:
            if key not in task.metadata:
                raise ValueError(f"trainer.warmup_check_by: task {task.task_id} ({task.question[:40]!r}) has no "
                                 f"metadata key {key!r}; it has {sorted(task.metadata)}")
            groups.setdefault(str(task.metadata[key]), []).append(task)
        return list(groups.values())

    def accuracy(self) -> float:
        """The ``trainer.warmup_until`` check: greedy accuracy of the trainer's own weights (no sync:
        the explorer keeps what it holds) on the first ``trainer.warmup_check_tasks`` training tasks, the
        lowest over ``check_groups``."""
        return self.lowest_accuracy(self.check_groups())
