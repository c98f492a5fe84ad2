"""``Campaign``: the parts of one running campaign built from the checked config and wired
together, and a method per step that hands explicit values from one room's stage to the next.

A round is ``schedule.ROUND``: explore → verify → buffer → train → sync. Each stage's work lives in
its room and takes what it needs as arguments — explore's round in ``explore.round.ExploreRound``
(tasks, workflows, staging, shards, leases, the explorer's waits), ``prepare_data`` and a round's check
in ``verify.stage``, the commit in ``buffer.commit``, the update in ``train.update``, the warm
start in ``train.warm_start``, the weight sync and its check in ``explore.sync``, held-out
evaluation in ``evaluation.greedy``, checkpoints in ``campaign.checkpoints`` — and the methods here
call them with what this campaign holds. Explore's rollouts are committed to the store
(``staging/``) and read back by verify; verify hands its verified rows to buffer in memory, kept
until buffer has stored them, so a retried buffer has them. Nothing here imports Prefect: the step
table (``campaign.steps``) names these methods, ``tasks/`` wraps them.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from rftflow.components.buffer.commit import buffer_round
from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.layout import open_run_store
from rftflow.components.buffer.leases import ShardLeases
from rftflow.components.buffer.sampling import Sampler
from rftflow.components.buffer.selectors import PassRates
from rftflow.components.buffer.weights import WeightStore
from rftflow.components.campaign.checkpoints import Checkpoints
from rftflow.components.campaign.preflight import Preflight, preflight
from rftflow.components.campaign.schedule import ROUND, Step, needed_version, sync_due
from rftflow.components.config import CampaignConfig, Mode
from rftflow.components.data.report import ValidationLog
from rftflow.components.data.tasksets import Task, tasks_from_table
from rftflow.components.evaluation.greedy import held_out
from rftflow.components.explore.engines import decoding, make_engine
from rftflow.components.explore.models import load_model, load_processor
from rftflow.components.explore.round import ExploreRound
from rftflow.components.explore.sync import MemoryWeightSync, StoreWeightSync, SyncCheck
from rftflow.components.explore.workflows import make_workflow
from rftflow.components.stopping import StopFlag, wait_until
from rftflow.components.train import adapters
from rftflow.components.train.trainer import Trainer
from rftflow.components.train.update import update
from rftflow.components.train.warm_start import WarmStart
from rftflow.components.verify.rewards import campaign_rewards
from rftflow.components.verify.scoring import score
from rftflow.components.verify.stage import prepare_data, verify_round

def make_trainer(cfg: CampaignConfig, algorithm, policy, pad_id: int, *, leads: bool = False) -> Trainer:
    """The campaign's trainer of ``policy`` (``leads``: rank 0 of several, which announces each
    update to the others)."""
    processor = load_processor(cfg.model.path, allow_download=cfg.model.allow_download)  # a vision-language model's
    return Trainer(policy, pad_id, cfg.trainer, algorithm, temperature=cfg.explorer.temperature,
                   credit=cfg.workflow.credit, gamma=cfg.workflow.gamma, lora=cfg.model.lora, leads=leads,
                   processor=processor)


def make_sampler(cfg: CampaignConfig, store: ExperienceStore, algorithm) -> Sampler:
    """The trainer's sampler of each round's batch (and the warm start's) from ``store``."""
    return Sampler(store, cfg.buffer, algorithm, micro_batch_size=cfg.trainer.micro_batch_size,
                   epochs=cfg.trainer.epochs, round_rows=cfg.explorer.tasks_per_round * cfg.explorer.repeat_times,
                   groups_per_round=cfg.explorer.tasks_per_round, seed=cfg.seed,
                   # rows older than the trainer: a second lane or process, replay, or sync every k > 1
                   stale_possible=cfg.mode != Mode.BOTH or cfg.buffer.sampling == "replay" or cfg.sync.interval > 1)


def make_weight_sync(cfg: CampaignConfig, weight_store: WeightStore, trainer: Trainer | None, engine):
    """``sync.method``'s weight sync from ``trainer`` (None: a process without one) to ``engine`` (None:
    a process without an explorer); with LoRA, the adapter too, for a server that loads adapters itself."""
    source = trainer.policy_weights if trainer else None
    adapter = (functools.partial(adapters.save_adapter, trainer.unwrapped, base=cfg.model.path)
               if trainer and trainer.lora else None)
    return (MemoryWeightSync(source, engine, adapter=adapter) if cfg.sync.method == "memory"
            else StoreWeightSync(weight_store, source, engine))


def follow_trainer(cfg: CampaignConfig) -> None:
    """A trainer process of rank > 0 (``accelerate launch``): the campaign's model and trainer,
    stepping with rank 0's until the campaign ends (``Trainer.follow``). Nothing is written."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    policy, tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download, dtype=cfg.model.dtype)
    make_trainer(cfg, cfg.algorithm.resolve(), policy, tokenizer.pad_token_id).follow()


class Campaign:
    """Model copies (trainer + explorer), store, sampler, reward and weight sync of one campaign,
    and each room's stage built over them.

    ``checked`` is what ``preflight`` (the validation gate) returned: nothing else is taken, so
    the config is checked once, before anything is loaded or written. ``Campaign.from_config``
    checks and makes one (a notebook's, a benchmark's entry).
    """

    def __init__(self, checked: Preflight, *, store: ExperienceStore | None = None, stop: StopFlag | None = None):
        if not isinstance(checked, Preflight):
            raise TypeError(f"Campaign takes preflight(config, run_dir, overrides)'s result, not a "
                            f"{type(checked).__name__}: Campaign.from_config(config, run_dir, overrides) checks it")
        cfg = self.cfg = checked.cfg
        self.run_dir, self.algorithm = checked.run_dir, checked.algorithm
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        # a round's writes go to the store behind the compute; each round ends with them stored (``sync``)
        self.store = store or ExperienceStore(open_run_store(cfg.storage, self.run_dir), cfg.name,
                                              write_behind=cfg.storage.write_behind, shards=cfg.explorer.shards)
        self.weight_store = WeightStore(self.store.objects, cfg.name)  # checkpoints and published weights
        self.reward_fn = campaign_rewards(cfg)
        self.has_trainer, self.has_explorer = cfg.mode.trains, cfg.mode.explores
        policy, self.tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download,
                                            dtype=cfg.model.dtype)
        # a vision-language model's processor (None for text): saved with its checkpoints, as the tokenizer is
        self.processor = load_processor(cfg.model.path, allow_download=cfg.model.allow_download)
        # the explorer's own copy; a trainer alone evaluates with its policy itself (hf)
        explorer_model = copy.deepcopy(policy) if self.has_trainer and self.has_explorer else policy
        if torch.cuda.is_available() and cfg.explorer.engine == "hf":
            explorer_model.to("cuda")  # decode where the trainer trains (the Trainer's Accelerator picks cuda too)
        engine = cfg.explorer if self.has_explorer else cfg.explorer.model_copy(update={"engine": "hf"})
        self.engine = make_engine(engine, explorer_model, self.tokenizer, cfg.model, seed=cfg.seed)
        context = getattr(policy.config, "max_position_embeddings", None)
        self.workflow = make_workflow(cfg, self.tokenizer, reward_fn=self.reward_fn, context_limit=context)
        # a mixture's parts, each with its weight and the workflow of its taskset (``ExploreRound.by_workflow``)
        self.parts = {p.name: p.weight for p in cfg.mixture}
        self.workflows = {name: make_workflow(cfg.model_copy(update={"taskset": taskset}), self.tokenizer,
                                              reward_fn=self.reward_fn, context_limit=context)
                          for name, taskset in cfg.part_tasksets().items()}
        self.trainer: Trainer | None = None
        self.sampler: Sampler | None = None
        if self.has_trainer:
            self.trainer = make_trainer(cfg, self.algorithm, policy, self.tokenizer.pad_token_id, leads=True)
            self.sampler = make_sampler(cfg, self.store, self.algorithm)
        explorer_engine = self.engine if self.has_explorer else None
        self.weights = make_weight_sync(cfg, self.weight_store, self.trainer, explorer_engine)
        self.sync_check = SyncCheck(cfg.sync, cfg.explorer.temperature)
        self.policy_version = 0  # the trainer's: +1 after the warm start, +1 per trained round
        self.validation = ValidationLog()  # every batch checked in this run (the validation report's lines)
        self.verified: dict[int, pa.Table | None] = {}  # verify's rows of a round, until buffer has stored them
        self.stop = stop or StopFlag()  # set: stop after the current stage, end a wait or the warm start
        self.wait = functools.partial(wait_until, stop=self.stop, timeout=cfg.sync.timeout_seconds,
                                      where=self.store.url)  # for the other process of the campaign
        # several explorer processes: this one's leases on shards (the explorer keeps the shards it explored)
        self.leases = (ShardLeases(self.store.direct, cfg.name, cfg.explorer.lease_seconds)
                       if cfg.mode == Mode.EXPLORE and cfg.explorer.shards > 1 else None)
        self.explorer = ExploreRound(
            cfg, self.store, self.engine, self.workflow, self.workflows, self.parts,
            train_tasks=lambda: self.train_tasks, pass_rates=self.pass_rates,
            score=lambda table: score(table, self.tasks_by_id, self.reward_fn, cfg.reward.function),
            dynamic_sampling=self.algorithm.dynamic_sampling, leases=self.leases, settle=self._settle)
        self.warm = self.checkpoints = None
        if self.trainer:
            self.warm = WarmStart(self.trainer, self.sampler, self.weight_store, cfg.trainer, base=cfg.model.path,
                                  stop=self.stop, train_tasks=lambda: self.train_tasks,
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
            self.__dict__["train_tasks"] = prepared.train
        return prepared.metrics

    def warm_start(self, progress=None) -> dict[str, float]:
        """The warm start's steps (``train.warm_start.WarmStart.run``; the policy's version becomes 1
        after them), then the start weights go to the explorer (published even with no steps, as
        version 0, so an explorer process knows the trainer is there)."""
        metrics = self.warm.run(progress) if self.warm else {}
        self.policy_version += 1 if self.cfg.trainer.warmup_steps else 0
        self.weights.publish(self.policy_version)
        return metrics

    def await_taskset(self) -> dict[str, float]:
        """An explorer alone: wait until the trainer process has stored the taskset splits."""
        self.wait(lambda: self.store.tasks_committed(), "the taskset (the trainer's `prepare`)")
        return {"tasks/train": len(self.train_tasks)}

    # the round's stages (ROUND) --------------------------------------------------------------
    def explore(self, round_no: int) -> dict[str, float]:
        """Explore's stage (``explore.round.ExploreRound``) with the explorer's weights; an explorer
        alone first waits for the weights the round needs (``schedule.needed_version``)."""
        if not self.has_trainer:  # an explorer alone: weights come from the store
            self.explorer.await_weights(self.weights, needed_version(self.cfg, round_no), round_no, self.wait)
        return self.explorer.explore(round_no, self.weights.version)

    def verify(self, round_no: int) -> dict[str, float]:
        """Verify's stage (``verify.stage.verify_round``) on the rollouts this process staged; their
        verified rows kept for buffer (None: the other explorer processes hold every shard)."""
        rollouts = self.explorer.staged(round_no)
        if rollouts is None:
            self.verified[round_no] = None
            return {}
        self.verified[round_no], metrics = verify_round(self.cfg, self.store, self.validation, round_no, rollouts,
                                                        self.tasks_by_id, self.reward_fn, self.weights.version)
        return metrics

    def buffer(self, round_no: int) -> dict[str, float]:
        """Buffer's stage: ``buffer.commit.buffer_round``, or with several explorer processes
        ``ExploreRound.buffer_shards``; verify's rows let go once stored."""
        verified = self.verified.get(round_no)
        if self.leases is not None:
            self.verified.pop(round_no, None)
            return self.explorer.buffer_shards(round_no, verified, self.weights.version,
                                               last=round_no == self.cfg.rounds, wait=self.wait)
        if verified is None:
            raise RuntimeError(f"round {round_no}: buffer runs after verify in the same process (its verified rows "
                               "are handed over in memory)")
        metrics = buffer_round(self.store, round_no, verified, trains=self.has_trainer)
        del self.verified[round_no]
        return metrics

    def _settle(self, round_no: int) -> None:
        """A shard taken over (``ExploreRound.take_over``), verified and committed here."""
        self.verify(round_no)
        self.explorer.commit_held(round_no, self.verified.pop(round_no, None))

    def train(self, round_no: int) -> dict[str, float]:
        """Train's stage (``train.update.update``); the policy's version + 1. A trainer alone first
        waits for the explorer process's round."""
        if not self.has_explorer:  # a trainer alone: the round's experiences come from the explorer process
            self.wait(lambda: self.store.round_committed(round_no), f"round {round_no}'s experiences (the explorer's)")
        metrics = update(self.trainer, self.sampler, self.policy_version, round_no, self.cfg.rounds)
        self.policy_version += 1
        return metrics

    def sync(self, round_no: int) -> dict[str, float]:
        """End the round: its queued writes are waited for (a failed one fails this stage); then the
        trainer's weights go to the explorer when due (``schedule.sync_due``), checked where both
        share this process (``explore.sync.SyncCheck``). Returns the explorer's version."""
        self.store.flush()
        metrics = {}
        if sync_due(self.cfg, round_no):
            self.weights.publish(self.policy_version)
            if self.cfg.sync.check and self.has_trainer and self.has_explorer:
                metrics = self.sync_check(self.trainer, self.engine, self.train_tasks[0], self.policy_version,
                                          self.weights.version)
        return {"sync/weight_version": float(self.weights.version), **metrics}

    def run_round(self, round_no: int) -> dict[str, float]:
        """The round's stages (``schedule.ROUND``) in order, without tracking or Prefect (tests,
        benchmarks, notebooks); their metrics."""
        return {k: v for step in ROUND for k, v in self.stage(step, round_no).items()}

    def stage(self, step: Step, round_no: int) -> dict[str, float]:
        """Stage ``step`` (one of ``schedule.ROUND``, a method of its name) of round ``round_no``."""
        if step not in ROUND:
            raise ValueError(f"{step} is not a stage of a round")
        return getattr(self, step.value)(round_no)

    # evaluation, checkpoints, what the stages read -------------------------------------------
    def evaluate(self, tasks: Sequence[Task] | None = None, engine=None, answers: list | None = None
                 ) -> dict[str, float]:
        """Greedy accuracy of the explorer's (latest synced) model on the held-out split (or of
        ``engine`` on ``tasks``): ``evaluation.greedy.held_out`` over each workflow's episodes; each
        task's ``Answer`` into ``answers``."""
        tasks, engine = self.eval_tasks if tasks is None else tasks, engine or self.engine

        def evaluate(part: str | None, some: list[Task]) -> dict[str, float]:  # a workflow's greedy episodes
            workflow = self.workflow if part is None else self.workflows[part]
            return workflow.evaluate(engine, some, self.reward_fn, self.cfg.reward.function,
                                     self.cfg.eval.max_new_tokens, answers)

        return held_out(tasks, evaluate, mixture=bool(self.parts))

    def trainer_accuracy(self, groups: list[list[Task]]) -> float:
        """Greedy accuracy (``evaluate``) of the trainer's own weights (no sync: the explorer keeps
        what it holds), decoded as the explorer's ``hf`` engine decodes; the lowest over ``groups``."""
        with decoding(self.trainer.unwrapped, self.cfg.explorer, self.tokenizer, self.cfg.model) as engine:
            return min(self.evaluate(group, engine)["accuracy/held_out"] for group in groups)

    def checkpoint(self, round_no: int, out: Path, **meta: Any) -> dict[str, Any]:
        """Everything needed to continue after ``round_no`` into ``out`` and the store
        (``campaign.checkpoints.Checkpoints.write``); its manifest."""
        return self.checkpoints.write(round_no, self.policy_version, out, **meta)

    def restore(self, version: int, into: Path) -> int:
        """Continue from committed checkpoint ``version`` (``Checkpoints.read``, into ``into``); its round."""
        round_no, self.policy_version = self.checkpoints.read(version, into)
        return round_no

    def pass_rates(self) -> PassRates:
        """Measured pass rates of the training tasks (``state/pass_rates.json``)."""
        return PassRates(self.store.read_state("pass_rates"))

    @functools.cached_property
    def train_tasks(self) -> list[Task]:
        """The stored train split (a fresh ``prepare`` hands over the list it stored)."""
        return tasks_from_table(self.store.read_tasks("train"))

    @functools.cached_property
    def tasks_by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.train_tasks}

    @functools.cached_property
    def eval_tasks(self) -> list[Task]:
        return tasks_from_table(self.store.read_tasks("eval"))
