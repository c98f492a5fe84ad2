"""``Campaign``: the parts of one running campaign, each built by ``campaign.assembly`` from the
checked config, and a method per step that hands explicit values from one room's stage to the next.

A round is ``schedule.ROUND``: explore → verify → buffer → train → sync. Each stage's work lives in
its room and takes what it needs as arguments — explore's round in ``explore.round.ExploreRound``
(tasks, workflows, staging, shards, leases, the explorer's waits), ``prepare_data`` and a round's check
in ``verify.stage``, the commit in ``buffer.commit``, the update in ``train.update``, the warm
start in ``train.warm_start``, the weight sync and its check in ``explore.sync``, held-out
evaluation in ``evaluation.greedy`` (over the campaign's workflows: ``assembly.held_out_evaluation``),
checkpoints in ``campaign.checkpoints`` — and the methods here call them with what this campaign
holds. Explore's rollouts are committed to the store (``staging/``) and read back by verify; verify
hands its verified rows to buffer in memory (``campaign.handover``); the taskset splits are read
from the store once (``data.splits``). Nothing here imports Prefect: the step table
(``campaign.steps``) names these methods, ``tasks/`` wraps them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.selectors import PassRates
from rftflow.components.buffer.weights import WeightStore
from rftflow.components.campaign import assembly
from rftflow.components.campaign.checkpoints import Checkpoints
from rftflow.components.campaign.handover import Handover
from rftflow.components.campaign.preflight import Preflight, preflight
from rftflow.components.campaign.schedule import ROUND, Step, needed_version, sync_due
from rftflow.components.config import CampaignConfig
from rftflow.components.data.report import ValidationLog
from rftflow.components.data.splits import TaskSplits
from rftflow.components.data.tasksets import Task
from rftflow.components.explore.engines import decoding
from rftflow.components.explore.round import ExploreRound
from rftflow.components.explore.sync import SyncCheck
from rftflow.components.stopping import StopFlag, wait_until
from rftflow.components.train.update import update
from rftflow.components.train.warm_start import WarmStart
from rftflow.components.verify.rewards import campaign_rewards
from rftflow.components.verify.scoring import score
from rftflow.components.verify.stage import prepare_data


class Campaign:
    """The parts of one campaign, each built by ``campaign.assembly`` from the checked config, and
    a method per step that hands each room's stage what it needs.

    ``checked`` is what ``preflight`` (the validation gate) returned: nothing else is taken, so the
    config is checked once, before anything is loaded or written. ``Campaign.from_config`` checks
    and makes one (a notebook's, a benchmark's entry).
    """

    def __init__(self, checked: Preflight, *, store: ExperienceStore | None = None, stop: StopFlag | None = None):
        if not isinstance(checked, Preflight):
            raise TypeError(f"Campaign takes preflight(config, run_dir, overrides)'s result, not a "
                            f"{type(checked).__name__}: Campaign.from_config(config, run_dir, overrides) checks it")
        cfg = self.cfg = checked.cfg
        self.run_dir, self.algorithm = checked.run_dir, checked.algorithm
        self.has_trainer, self.has_explorer = cfg.mode.trains, cfg.mode.explores
        assembly.seed(cfg)
        self.store = store or assembly.open_store(cfg, self.run_dir)
        self.weight_store = WeightStore(self.store.objects, cfg.name)  # checkpoints and published weights
        self.reward_fn = campaign_rewards(cfg)
        models = assembly.load_models(cfg)
        self.tokenizer, self.processor = models.tokenizer, models.processor
        self.engine = assembly.make_explorer_engine(cfg, models)
        self.workflow, self.workflows = assembly.make_workflows(cfg, models, self.reward_fn)
        self.parts = {p.name: p.weight for p in cfg.mixture}  # a mixture's parts and their weights
        self.trainer = self.sampler = self.warm = self.checkpoints = None
        if self.has_trainer:
            self.trainer = assembly.make_trainer(cfg, self.algorithm, models.policy, models.tokenizer.pad_token_id,
                                                 leads=True)
            self.sampler = assembly.make_sampler(cfg, self.store, self.algorithm)
        self.weights = assembly.make_weight_sync(cfg, self.weight_store, self.trainer,
                                                 self.engine if self.has_explorer else None)
        self.sync_check = SyncCheck(cfg.sync, cfg.explorer.temperature)
        self.policy_version = 0  # the trainer's: +1 after the warm start, +1 per trained round
        self.validation = ValidationLog()  # every batch checked in this run (the validation report's lines)
        self.splits = TaskSplits(self.store)
        self.stop = stop or StopFlag()  # set: stop after the current stage, end a wait or the warm start
        self.wait = functools.partial(wait_until, stop=self.stop, timeout=cfg.sync.timeout_seconds,
                                      where=self.store.url)  # for the other process of the campaign
        self.explorer = ExploreRound(
            cfg, self.store, self.engine, self.workflow, self.workflows, self.parts,
            train_tasks=lambda: self.splits.train, pass_rates=lambda: PassRates(self.store.read_state("pass_rates")),
            score=lambda table: score(table, self.splits.by_id, self.reward_fn, cfg.reward.function),
            dynamic_sampling=self.algorithm.dynamic_sampling, leases=assembly.make_leases(cfg, self.store),
            settle=lambda round_no: self.handover.settle(round_no))
        self.handover = Handover(cfg, self.store, self.validation, self.explorer,
                                 tasks_by_id=lambda: self.splits.by_id, reward_fn=self.reward_fn,
                                 version=lambda: self.weights.version, trains=self.has_trainer, wait=self.wait)
        self.held_out = assembly.held_out_evaluation(cfg, self.workflow, self.workflows, self.reward_fn)
        if self.trainer:
            self.warm = WarmStart(self.trainer, self.sampler, self.weight_store, cfg.trainer, base=cfg.model.path,
                                  stop=self.stop, train_tasks=lambda: self.splits.train,
                                  lowest_accuracy=self.trainer_accuracy)
            self.checkpoints = Checkpoints(self.trainer, self.sampler, self.store, self.weight_store, self.weights,
                                           self.validation, tokens=self.processor or self.tokenizer,
                                           base=cfg.model.path, explorer_state=self.has_explorer)

    @classmethod
    def from_config(cls, config: CampaignConfig | Mapping[str, Any] | str | Path | None,
                    run_dir: str | Path | None = None, overrides: Sequence[str] = (), **options: Any) -> Campaign:
        """``config`` (a ``CampaignConfig``, a mapping of its keys, a YAML path; ``overrides``:
        ``key.path=value``) checked by ``preflight``, then its campaign."""
        return cls(preflight(config, run_dir, overrides), **options)

    # the steps before the rounds -------------------------------------------------------------
    def prepare(self) -> dict[str, float]:
        """Store the taskset splits and expert demonstrations (``verify.stage.prepare_data``; idempotent)."""
        prepared = prepare_data(self.cfg, self.store, self.validation, self.explorer.expert_rows)
        if prepared.train is not None:  # the rounds' tasks are these: no reading back what was just written
            self.splits.keep_train(prepared.train)
        return prepared.metrics

    def warm_start(self, progress=None) -> dict[str, float]:
        """The warm start's steps (``WarmStart.run``; the policy's version 1 after them), then the start
        weights published (version 0 with no steps: an explorer process knows the trainer is there)."""
        metrics = self.warm.run(progress) if self.warm else {}
        self.policy_version += 1 if self.cfg.trainer.warmup_steps else 0
        self.weights.publish(self.policy_version)
        return metrics

    def await_taskset(self) -> dict[str, float]:
        """An explorer alone: wait until the trainer process has stored the taskset splits."""
        self.wait(lambda: self.store.tasks_committed(), "the taskset (the trainer's `prepare`)")
        return {"tasks/train": len(self.splits.train)}

    # the round's stages (ROUND) --------------------------------------------------------------
    def explore(self, round_no: int) -> dict[str, float]:
        """``ExploreRound.explore``; an explorer alone first waits for the weights the round needs."""
        if not self.has_trainer:  # an explorer alone: weights come from the store
            self.explorer.await_weights(self.weights, needed_version(self.cfg, round_no), round_no, self.wait)
        return self.explorer.explore(round_no, self.weights.version)

    def verify(self, round_no: int) -> dict[str, float]:
        """``Handover.verify``: the rows this process staged, verified and kept for buffer."""
        return self.handover.verify(round_no)

    def buffer(self, round_no: int) -> dict[str, float]:
        """``Handover.buffer``: verify's rows committed."""
        return self.handover.buffer(round_no)

    def train(self, round_no: int) -> dict[str, float]:
        """``update`` (the policy's version + 1); a trainer alone first waits for the explorer's round."""
        if not self.has_explorer:
            self.wait(lambda: self.store.round_committed(round_no), f"round {round_no}'s experiences (the explorer's)")
        metrics = update(self.trainer, self.sampler, self.policy_version, round_no, self.cfg.rounds)
        self.policy_version += 1
        return metrics

    def sync(self, round_no: int) -> dict[str, float]:
        """The round's queued writes waited for (a failed one fails this stage); the trainer's weights
        published when due (``sync_due``), checked where both share this process (``SyncCheck``)."""
        self.store.flush()
        metrics = {}
        if sync_due(self.cfg, round_no):
            self.weights.publish(self.policy_version)
            if self.cfg.sync.check and self.has_trainer and self.has_explorer:
                metrics = self.sync_check(self.trainer, self.engine, self.splits.train[0], self.policy_version,
                                          self.weights.version)
        return {"sync/weight_version": float(self.weights.version), **metrics}

    def run_round(self, round_no: int) -> dict[str, float]:
        """The round's stages in order, without tracking or Prefect (tests, benchmarks, notebooks)."""
        return {k: v for step in ROUND for k, v in self.stage(step, round_no).items()}

    def stage(self, step: Step, round_no: int) -> dict[str, float]:
        """Stage ``step`` (one of ``schedule.ROUND``, a method of its name) of round ``round_no``."""
        if step not in ROUND:
            raise ValueError(f"{step} is not a stage of a round")
        return getattr(self, step.value)(round_no)

    # evaluation, checkpoints, what the stages read -------------------------------------------
    def evaluate(self, tasks: Sequence[Task] | None = None, engine=None, answers: list | None = None
                 ) -> dict[str, float]:
        """Greedy accuracy of the explorer's (latest synced) model on the held-out split, or of ``engine``
        on ``tasks`` (``assembly.held_out_evaluation``); each task's ``Answer`` into ``answers``."""
        return self.held_out(self.splits.eval if tasks is None else tasks, engine or self.engine, answers)

    def trainer_accuracy(self, groups: list[list[Task]]) -> float:
        """The warm start's check: the greedy accuracy (``evaluate``) of the trainer's own weights (no
        sync: the explorer keeps what it holds), decoded as the ``hf`` engine decodes; the lowest over ``groups``."""
        with decoding(self.trainer.unwrapped, self.cfg.explorer, self.tokenizer, self.cfg.model) as engine:
            return min(self.evaluate(group, engine)["accuracy/held_out"] for group in groups)

    def checkpoint(self, round_no: int, out: Path, **meta: Any) -> dict[str, Any]:
        """``Checkpoints.write``: everything needed to continue after ``round_no``; its manifest."""
        return self.checkpoints.write(round_no, self.policy_version, out, **meta)

    def restore(self, version: int, into: Path) -> int:
        """Continue from committed checkpoint ``version`` (``Checkpoints.read``, into ``into``); its round."""
        round_no, self.policy_version = self.checkpoints.read(version, into)
        return round_no
