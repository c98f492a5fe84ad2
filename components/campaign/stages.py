"""``Campaign``: the parts of one running campaign wired together, and a method per stage that
hands explicit values from one room's stage to the next.

A round is ``schedule.ROUND``: explore → verify → buffer → train → sync. Each stage's work lives in
its room — explore's round in ``explore.round.ExploreRound`` (tasks, workflows, staging, shards,
leases), scoring and the contract in ``verify.check``, the commit in ``buffer.commit``, the update in
``train.update``, held-out evaluation in ``evaluation.greedy`` — and the methods here call them with
what this campaign holds: its store, engine, workflows, trainer, sampler and weight sync, built from
the checked config (``preflight``'s result, nothing else). Explore's rollouts are committed to the
store (``staging/``) and read back by verify; verify hands its verified rows to buffer in memory,
kept until buffer has stored them, so a retried buffer has them. The warm start, checkpoints and
restore are here too (they span the trainer, the store and the explorer). Nothing here imports
Prefect: the step table (``campaign.steps``) names these methods, ``tasks/`` wraps them.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import logging
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from rftflow.components.buffer.commit import commit_round, commit_shards
from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.layout import campaigns_in, open_run_store, round_dir
from rftflow.components.buffer.leases import ShardLeases
from rftflow.components.buffer.sampling import Sampler
from rftflow.components.buffer.selectors import PassRates, measured_rewards
from rftflow.components.buffer.weights import CorruptCheckpoint, WeightStore
from rftflow.components.campaign.preflight import Preflight, preflight
from rftflow.components.campaign.schedule import ROUND, Step, sync_due
from rftflow.components.config import CampaignConfig, Mode
from rftflow.components.data.contracts import ContractBounds, ContractError, check_experiences, enforce
from rftflow.components.data.images import task_images
from rftflow.components.data.pipelines import run_pipeline
from rftflow.components.data.report import ValidationEntry
from rftflow.components.data.tasksets import (Task, load_mixture, load_tasks, recheck_tasks, tasks_from_table,
                                               tasks_to_table)
from rftflow.components.evaluation.greedy import held_out
from rftflow.components.explore.decode import forget_fused
from rftflow.components.explore.engines import make_engine
from rftflow.components.explore.models import load_model, load_processor
from rftflow.components.explore.round import ExploreRound
from rftflow.components.explore.sync import MemoryWeightSync, StoreWeightSync, check_sync
from rftflow.components.explore.workflows import make_workflow
from rftflow.components.train import adapters
from rftflow.components.train.checkpoints import load_trainer, save_trainer
from rftflow.components.train.trainer import Trainer
from rftflow.components.train.update import update
from rftflow.components.verify.check import check_round, per_taskset_rewards
from rftflow.components.verify.rewards import campaign_rewards
from rftflow.components.verify.scoring import score

# buffer state a checkpoint restores: the trainer's (sampling cursors) and the explorer's (pass rates)
TRAINER_STATE, EXPLORER_STATE = ("fifo_cursor", "replay_uses"), ("pass_rates",)
RESUMABLE_STATE = TRAINER_STATE + EXPLORER_STATE
log = logging.getLogger("rftflow")
POLL_MAX_SECONDS = 0.5  # the longest pause between two looks at the store while waiting for the other process
WARMUP_CHECK_TASKS = 64  # training tasks the `trainer.warmup_until` check solves greedily


def make_trainer(cfg: CampaignConfig, algorithm, policy, pad_id: int, *, leads: bool = False) -> Trainer:
    """The campaign's trainer of ``policy`` (``leads``: rank 0 of several, which announces each
    update to the others)."""
    processor = load_processor(cfg.model.path, allow_download=cfg.model.allow_download)  # a vision-language model's
    return Trainer(policy, pad_id, cfg.trainer, algorithm, temperature=cfg.explorer.temperature,
                   credit=cfg.workflow.credit, gamma=cfg.workflow.gamma, lora=cfg.model.lora, leads=leads,
                   processor=processor)


def follow_trainer(cfg: CampaignConfig) -> None:
    """A trainer process of rank > 0 (``accelerate launch``): the campaign's model and trainer,
    stepping with rank 0's until the campaign ends (``Trainer.follow``). Nothing is written."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    policy, tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download, dtype=cfg.model.dtype)
    make_trainer(cfg, cfg.algorithm.resolve(), policy, tokenizer.pad_token_id).follow()


class StopRequested(Exception):
    """The campaign was asked to stop (a signal, a cancel in Prefect) and stopped at a safe point;
    the message says where."""


class StopFlag:
    """Why the campaign should stop at its next safe point: a signal's name or a cancel (set by a
    signal handler or a watcher thread); None: go on. Checked between stages, between warm-start
    steps and while waiting for the other process."""

    def __init__(self) -> None:
        self.reason: str | None = None


class Campaign:
    """Model copies (trainer + explorer), store, sampler, reward and weight sync of one campaign.

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
            self.sampler = Sampler(self.store, cfg.buffer, self.algorithm,
                                   micro_batch_size=cfg.trainer.micro_batch_size, epochs=cfg.trainer.epochs,
                                   round_rows=cfg.explorer.tasks_per_round * cfg.explorer.repeat_times,
                                   groups_per_round=cfg.explorer.tasks_per_round, seed=cfg.seed,
                                   # rows older than the trainer: a second lane or process, replay, or sync every k > 1
                                   stale_possible=cfg.mode != Mode.BOTH or cfg.buffer.sampling == "replay"
                                   or cfg.sync.interval > 1)
        source = self.trainer.policy_weights if self.trainer else None
        target = self.engine if self.has_explorer else None
        adapter = (functools.partial(adapters.save_adapter, self.trainer.unwrapped, base=cfg.model.path)
                   if self.trainer and self.trainer.lora else None)  # for a server that loads adapters itself
        self.weights = (MemoryWeightSync(source, target, adapter=adapter) if cfg.sync.method == "memory"
                        else StoreWeightSync(self.weight_store, source, target))
        self.policy_version = 0  # the trainer's: +1 after the warm start, +1 per trained round
        self.syncs_checked = 0  # by ``check_sync`` in this process
        self.validation_log: list[ValidationEntry] = []
        self.verified: dict[int, pa.Table | None] = {}  # verify's rows of a round, until buffer has stored them
        # several explorer processes: this one's leases on shards (the explorer keeps the shards it explored)
        self.leases = (ShardLeases(self.store.direct, cfg.name, cfg.explorer.lease_seconds)
                       if cfg.mode == Mode.EXPLORE and cfg.explorer.shards > 1 else None)
        self.explorer = ExploreRound(
            cfg, self.store, self.engine, self.workflow, self.workflows, self.parts,
            train_tasks=lambda: self.train_tasks, pass_rates=self.pass_rates,
            score=lambda table: score(table, self.tasks_by_id, self.reward_fn, cfg.reward.function),
            dynamic_sampling=self.algorithm.dynamic_sampling, leases=self.leases, settle=self._settle)
        self.stop = stop or StopFlag()  # set: stop after the current stage, end a wait or the warm start
        self.warm_step: int | None = None  # steps of the newest warm-start checkpoint written or restored here

    @classmethod
    def from_config(cls, config: CampaignConfig | Mapping[str, Any] | str | Path | None,
                    run_dir: str | Path | None = None, overrides: Sequence[str] = (), **options: Any) -> Campaign:
        """``config`` (a ``CampaignConfig``, a mapping of its keys, a YAML path; ``overrides``:
        ``key.path=value``) checked by ``preflight``, then its campaign."""
        return cls(preflight(config, run_dir, overrides), **options)

    # setup -----------------------------------------------------------------------------------
    def prepare(self) -> dict[str, float]:
        """Build the taskset splits and expert demonstrations and store them (idempotent)."""
        cfg = self.cfg
        taskset = (load_mixture(cfg.part_tasksets(), cfg.seed, cfg.contracts) if cfg.mixture
                   else load_tasks(cfg.taskset, cfg.seed, cfg.contracts))
        train_table = tasks_to_table(taskset.train)
        metrics: dict[str, float] = {}
        if cfg.pipelines.tasks:
            result = run_pipeline("tasks", train_table, cfg.pipelines.tasks, seed=cfg.seed,
                                  prompt_template=cfg.taskset.prompt_template, pass_rates=self.store_pass_rates())
            train_table, rejected = recheck_tasks(result.kept, taskset.held_out, cfg.contracts)
            dropped = pa.concat_tables([result.dropped, rejected], promote_options="default")
            self._record("tasks pipeline", 0, train_table.num_rows + dropped.num_rows, dropped)
            self.store.write_quarantine("tasks-pipeline", dropped)
            metrics |= {"tasks/pipeline_dropped": dropped.num_rows, "tasks/pipeline_added": result.added}
        self.store.write_quarantine("tasks", taskset.quarantined)
        self._record("tasks contract", 0, taskset.rows_checked, taskset.quarantined)
        fresh = not self.store.tasks_committed("train")  # else an earlier attempt's split stays, and is read back
        self.store.write_tasks("train", train_table)
        self.store.write_tasks("eval", tasks_to_table(taskset.held_out))
        train = tasks_from_table(train_table)
        if fresh:  # the rounds' tasks are these: no reading back what was just written (slow for large tasksets)
            self.__dict__["train_tasks"] = train
        expert = pa.concat_tables([workflow.expert_table(self.engine, tasks, campaign=cfg.name,
                                                         limit=cfg.taskset.expert_tasks or None)
                                   for workflow, tasks in self.explorer.by_workflow(train)])
        verdict = check_experiences(expert, ContractBounds.of(cfg.contracts), kind="expert")
        self._record("expert contract", 0, expert.num_rows, verdict.quarantined)
        self.store.write_quarantine("expert", verdict.quarantined)  # kept even if the batch fails below
        enforce(verdict, cfg.contracts.max_bad_fraction, "expert demonstrations")
        self.store.write_expert(verdict.accepted)
        return {**metrics, "tasks/train": len(train), "tasks/eval": len(taskset.held_out),
                "tasks/quarantined": taskset.quarantined.num_rows, "tasks/expert": verdict.accepted.num_rows}

    def validation_entries(self, ingested: bool = True) -> list[ValidationEntry]:
        """Every checked batch for the validation report: the files ingested into the campaign's
        store (by ``rftflow ingest``, before or during the run; read from the store unless
        ``ingested`` is False), then this run's checks."""
        files = [ValidationEntry(f"ingested {r['kind']} file", 0, r["rows"], r["accepted"], r["quarantined"],
                                 r["reasons"]) for r in (self.store.ingest_reports() if ingested else [])]
        return [*files, *self.validation_log]

    def _record(self, stage: str, round_no: int, rows: int, rejected: pa.Table) -> None:
        """Add a line to the validation log (the campaign's validation report); a retried stage
        replaces its earlier line for the same round."""
        reasons = rejected.column("reason").to_pylist() if rejected.num_rows else []
        self.validation_log = [e for e in self.validation_log if (e.stage, e.round) != (stage, round_no)]
        self.validation_log.append(ValidationEntry(stage, round_no, rows, rows - rejected.num_rows, len(reasons),
                                                   dict(Counter(p for r in reasons for p in r.split("; ")))))

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

    def warm_start(self, progress=None) -> dict[str, float]:
        """Expert-only SFT steps before the RL rounds (``trainer.warmup_steps``; the policy's version
        becomes 1), then the start weights go to the explorer (published even with no steps, as
        version 0, so an explorer process knows the trainer is there). Every
        ``trainer.warmup_checkpoint_every`` steps (or ``warmup_checkpoint_minutes``) the warm start
        is checkpointed (``save_warm_start``); a stop asked for meanwhile ends it after the current
        step (``StopRequested``), checkpointed there. A resumed campaign continues from the newest
        (``resume_warm_start``) and ends where an uninterrupted one ends. With
        ``trainer.warmup_until`` it ends at the first check (every ``warmup_check_every`` steps,
        every step after one that reached ``warmup_check_near``) where ``warm_accuracy`` reaches it
        (on every group of ``warmup_check_by``)."""
        tc = self.cfg.trainer
        steps, metrics, done, near = tc.warmup_steps, {}, 0, False
        saved_at = time.monotonic()

        def step_done(step: int, step_metrics: dict[str, float]) -> bool:
            nonlocal done, near, saved_at
            done = step
            reached = False
            if tc.warmup_until is not None and (near or step % tc.warmup_check_every == 0):
                metrics["warmup/check_accuracy"] = accuracy = self.warm_accuracy()
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
                self.save_warm_start(step, drawn_from, {"near": near, "metrics": metrics})
                saved_at = time.monotonic()
            if self.stop.reason:
                raise StopRequested(f"stopped ({self.stop.reason}) at step {step} of the warm start")
            return False

        if steps:
            if tc.warmup_until is not None:
                self.warm_check_groups()  # a missing metadata key fails here, before any step
            resumed = self.resume_warm_start()
            if resumed is not None:
                saved = resumed["order_rng"]  # the state the steps were drawn from: the same steps again
                self.sampler.order_rng.setstate((saved[0], tuple(saved[1]), saved[2]))
                done, near = resumed["step"], resumed["near"]
                metrics.update({**resumed["metrics"], "warmup/resumed_from_step": float(done)})
                log.info("the warm start resumes after step %d of %d", done, steps)
            drawn_from = self.sampler.order_rng.getstate()
            last = self.trainer.warm_start(self.sampler.warm_start_steps(steps), tc.warmup_lr, step_done, first=done)
            self.policy_version += 1
            metrics.update({"warmup/steps": float(done), "warmup/loss_sft": last.get("loss/sft", float("nan"))})
            check = metrics.get("warmup/check_accuracy")
            if tc.warmup_until is not None and (check is None or check < tc.warmup_until):
                log.warning("the warm start ran all %d steps without reaching trainer.warmup_until %g (last check: "
                            "%s); the rounds start from there", done, tc.warmup_until,
                            "none" if check is None else f"{check:.3f}")
        self.weights.publish(self.policy_version)
        return metrics

    def save_warm_start(self, step: int, drawn_from: tuple, progress: dict[str, Any]) -> None:
        """Checkpoint the warm start after ``step`` steps (``WeightStore.write_warm_start``): the
        trainer (weights, optimizer, step count), torch's RNG, the sampler's RNG state its steps were
        drawn from (``drawn_from``) and ``progress`` (the ``warmup_until`` checks'). Not with
        ``trainer.fsdp`` (gathering the shards is a collective the other processes, stepping, would
        not join)."""
        if self.trainer.sharded:
            return
        with tempfile.TemporaryDirectory() as out:
            save_trainer(self.trainer, Path(out), base=self.cfg.model.path)
            resume = {"step": step, "order_rng": drawn_from, **progress,
                      "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
            (Path(out) / "warm_start.json").write_text(json.dumps(resume))
            self.weight_store.write_warm_start(step, Path(out), {"warmup_steps": self.cfg.trainer.warmup_steps})
        self.warm_step = step

    def resume_warm_start(self) -> dict[str, Any] | None:
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
            self.warm_step = resume["step"]
            return resume
        return None

    def warm_check_groups(self) -> list[list[Task]]:
        """The first ``WARMUP_CHECK_TASKS`` training tasks, grouped by metadata key
        ``trainer.warmup_check_by`` (one group without it)."""
        tasks, key = self.train_tasks[:WARMUP_CHECK_TASKS], self.cfg.trainer.warmup_check_by
        if key is None:
            return [tasks]
        groups: dict[str, list[Task]] = {}
        for task in tasks:
            if key not in task.metadata:
                raise ValueError(f"trainer.warmup_check_by: task {task.task_id} ({task.question[:40]!r}) has no "
                                 f"metadata key {key!r}; it has {sorted(task.metadata)}")
            groups.setdefault(str(task.metadata[key]), []).append(task)
        return list(groups.values())

    def warm_accuracy(self) -> float:
        """Greedy accuracy of the trainer's own weights (no sync: the explorer keeps what it holds)
        on the first ``WARMUP_CHECK_TASKS`` training tasks, the lowest over ``warm_check_groups``: the
        ``trainer.warmup_until`` check."""
        model = self.trainer.unwrapped
        training = model.training
        engine = make_engine(self.cfg.explorer.model_copy(update={"engine": "hf"}), model, self.tokenizer,
                             self.cfg.model)  # as the explorer's hf engine decodes
        try:
            return min(self.evaluate(group, engine)["accuracy/held_out"] for group in self.warm_check_groups())
        finally:
            forget_fused(model)  # its fused decode weights: a copy of the model, not needed until the next check
            model.train(training)

    def start_version(self) -> int:
        """The policy's version when the rounds start: 1 after a warm start, else 0."""
        return 1 if self.cfg.trainer.warmup_steps else 0

    def needed_version(self, round_no: int) -> int:
        """The oldest weights the explorer may explore ``round_no`` with, when it runs ``sync.offset``
        rounds ahead: those the trainer published after round p = ⌊(round − 1 − offset) / interval⌋ ·
        interval (the start weights while p ≤ 0). Rows of the round are then at most
        offset + interval − 1 versions behind the trainer that trains on them."""
        sync = self.cfg.sync
        published = (round_no - 1 - sync.offset) // sync.interval * sync.interval
        return self.start_version() + max(0, published)

    # the round's stages (ROUND) --------------------------------------------------------------
    def explore(self, round_no: int) -> dict[str, float]:
        """Explore's stage (``explore.round.ExploreRound``) with the explorer's weights; an explorer
        alone first waits for the weights the round needs (``needed_version``) and meanwhile takes
        over earlier shards whose explorer died."""
        if not self.has_trainer:  # an explorer alone: weights come from the store
            needed = self.needed_version(round_no)

            def arrived() -> bool:
                if self.leases is not None:  # meanwhile, earlier shards whose explorer died (the trainer waits)
                    self.explorer.take_over(round_no - 1, self.weights.version)
                return self.weights.pull() >= needed

            self._wait(arrived, f"weights of version >= {needed} (the trainer's)")
        return self.explorer.explore(round_no, self.weights.version)

    def _settle(self, round_no: int) -> None:
        """A shard taken over (``ExploreRound.take_over``), verified and committed here."""
        self.verify(round_no)
        self._commit_held(round_no, self.verified.get(round_no))

    def verify(self, round_no: int) -> dict[str, float]:
        """Score the rollouts, check the experience contract and run the experience pipeline
        (``verify.check``) → the verified rows (with ``reason``), for buffer. A round past the
        contract's bad-row threshold fails here, its bad rows kept under ``quarantine/failed``."""
        contracts = self.cfg.contracts
        bounds = ContractBounds.of(contracts, max_model_version=self.weights.version,
                                   group_size=self.cfg.explorer.repeat_times)
        rollouts = self.explorer.staged(round_no)
        if rollouts is None:  # several explorer processes: the others hold every shard of this round
            self.verified[round_no] = None
            return {}
        checked = check_round(rollouts, self.tasks_by_id, self.reward_fn,
                              self.cfg.reward.function, bounds, self.cfg.pipelines.experiences, self.cfg.seed)
        verdict = checked.verdict
        self._record("experience contract", round_no, checked.scored.num_rows, verdict.quarantined)
        try:
            enforce(verdict, contracts.max_bad_fraction, f"round {round_no} experiences")
        except ContractError:  # the stage fails; its bad rows stay where `buffer show --kind failed` finds them
            self.store.write_quarantine(f"failed/{round_dir(round_no)}", verdict.quarantined)
            raise
        if checked.dropped is not None:
            self._record("experience pipeline", round_no, verdict.accepted.num_rows, checked.dropped)
        self.verified[round_no] = checked.verified
        return {**checked.metrics(), **per_taskset_rewards(checked.scored, self.tasks_by_id)}

    def buffer(self, round_no: int) -> dict[str, float]:
        """Commit verified rows: accepted → experiences/usual, rejected → quarantine; pass rates."""
        verified = self.verified.get(round_no)
        if self.leases is not None:
            return self._buffer_shards(round_no, verified)
        if verified is None:
            raise RuntimeError(f"round {round_no}: buffer runs after verify in the same process (its verified rows "
                               "are handed over in memory)")
        accepted = commit_round(self.store, round_no, verified, keep=self.has_trainer)
        rates = self.pass_rates()
        if rates.add_round(round_no, measured_rewards(verified)):
            self.store.write_state("pass_rates", rates.to_state())
        if not self.has_trainer:  # an explorer process: the round is the trainer process's to take now
            self.store.flush()
        del self.verified[round_no]
        return {"buffer/usual_rows": accepted, "tasks/mean_pass_rate": rates.mean()}

    def _buffer_shards(self, round_no: int, verified: pa.Table | None) -> dict[str, float]:
        """One of several explorer processes: the shards it holds committed (``_commit_held``). The
        round's other shards are not waited for (the next round's free shards go to whichever
        explorer is free first), except after the last round: then every round's shards are
        waited for, and any whose explorer died is redone here (``explorer.lease_seconds``).
        Pass rates are not kept (each process sees only its shards)."""
        accepted, taken = self._commit_held(round_no, verified), 0
        if round_no == self.cfg.rounds:
            def all_committed() -> bool:
                nonlocal taken
                taken += self.explorer.take_over(round_no, self.weights.version)
                return self.explorer.first_open > round_no

            # looked at often: the other shards end about when this one did
            self._wait(all_committed, "the other explorer processes' last shards", most=0.05)
        return {"buffer/usual_rows": accepted, "buffer/shards_taken_over": taken}

    def _commit_held(self, round_no: int, verified: pa.Table | None) -> int:
        """The shards this process holds in ``round_no`` committed (``buffer.commit.commit_shards``)."""
        self.verified.pop(round_no, None)
        return commit_shards(self.store, self.leases, self.explorer.held.pop(round_no, []), round_no, verified,
                             tasks_per_round=self.cfg.explorer.tasks_per_round, shards=self.cfg.explorer.shards)

    def train(self, round_no: int) -> dict[str, float]:
        """Train's stage (``train.update.update``: the round's batch, the update, the rows consumed);
        the policy's version + 1. A trainer alone first waits for the explorer process's round."""
        if not self.has_explorer:  # a trainer alone: the round's experiences come from the explorer process
            self.await_round(round_no)
        metrics = update(self.trainer, self.sampler, self.policy_version, round_no, self.cfg.rounds)
        self.policy_version += 1
        return metrics

    def await_taskset(self) -> dict[str, float]:
        """An explorer alone: wait until the trainer process has stored the taskset splits."""
        self._wait(lambda: self.store.tasks_committed(), "the taskset (the trainer's `prepare`)")
        return {"tasks/train": len(self.train_tasks)}

    def await_round(self, round_no: int) -> None:
        """Wait until round ``round_no``'s experiences are committed (by an explorer process)."""
        self._wait(lambda: self.store.round_committed(round_no), f"round {round_no}'s experiences (the explorer's)")

    def _wait(self, ready, what: str, most: float = POLL_MAX_SECONDS) -> None:
        """Poll ``ready()`` until true, every 2 ms at first and then twice as long each time up to
        ``most`` seconds (a round of the other process can take milliseconds; a long wait should
        not hammer the store); ``TimeoutError`` naming ``what`` after ``sync.timeout_seconds``."""
        start, pause = time.monotonic(), 0.002
        while not ready():
            if self.stop.reason:
                raise StopRequested(f"stopped ({self.stop.reason}) while waiting for {what}")
            if time.monotonic() - start > self.cfg.sync.timeout_seconds:
                raise TimeoutError(f"waited {self.cfg.sync.timeout_seconds:.0f} s for {what} in {self.store.url}: "
                                   "is the other process (`rftflow run --mode explore|train`) running?")
            time.sleep(pause)
            pause = min(2 * pause, most)

    def sync(self, round_no: int) -> dict[str, float]:
        """End the round: its queued writes are waited for (a failed one fails this stage); then the
        trainer's weights go to the explorer when due (``schedule.sync_due``). Returns the explorer's version."""
        self.store.flush()
        metrics = {}
        if sync_due(self.cfg, round_no):
            self.weights.publish(self.policy_version)
            metrics = self.check_sync()
        return {"sync/weight_version": float(self.weights.version), **metrics}

    def check_sync(self) -> dict[str, float]:
        """``sync.check_sync`` after a publish, where trainer and explorer share this process (``sync.check``);
        the log-probs every ``sync.check_logprobs_every``-th time, the first included."""
        sync = self.cfg.sync
        if not (sync.check and self.has_trainer and self.has_explorer):
            return {}
        every, self.syncs_checked = sync.check_logprobs_every, self.syncs_checked + 1
        task = self.train_tasks[0]
        images = task_images(task)  # a vision task's: both sides read them
        probe = self.engine.encode(task.prompt, images) if images else self.engine.encode(task.prompt)
        return check_sync(self.trainer, self.engine, self.policy_version, self.weights.version, probe,
                          logprobs=bool(every) and (self.syncs_checked - 1) % every == 0,
                          tolerance=sync.logprob_tolerance, temperature=self.cfg.explorer.temperature, images=images)

    def run_round(self, round_no: int) -> dict[str, float]:
        """The round's stages (``schedule.ROUND``) in order, without tracking or Prefect (tests,
        benchmarks, notebooks); their metrics."""
        return {k: v for step in ROUND for k, v in self.stage(step, round_no).items()}

    def stage(self, step: Step, round_no: int) -> dict[str, float]:
        """Stage ``step`` (one of ``schedule.ROUND``, a method of its name) of round ``round_no``."""
        if step not in ROUND:
            raise ValueError(f"{step} is not a stage of a round")
        return getattr(self, step.value)(round_no)

    # pass rates, evaluation, results ---------------------------------------------------------
    def pass_rates(self) -> PassRates:
        """Measured pass rates of the training tasks (``state/pass_rates.json``)."""
        return PassRates(self.store.read_state("pass_rates"))

    def store_pass_rates(self) -> PassRates:
        """Pass rates measured by every campaign in this store (tasks are keyed by question hash,
        so a task explored by an earlier campaign on the same source has a measured rate)."""
        return PassRates.merged(ExperienceStore(self.store.objects, name).read_state("pass_rates")
                                for name in campaigns_in(self.store.objects))

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

    # checkpoints -----------------------------------------------------------------------------
    def checkpoint(self, round_no: int, out: Path, **meta: Any) -> dict[str, Any]:
        """Write everything needed to continue after ``round_no`` into ``out`` — the trainer (a
        Hugging Face model directory with the tokenizer, optimizer, critic, reference), the
        samplers' and torch's RNG states, the buffer's state files, the validation log — and commit
        it to the store as ``checkpoints/vNNNNNN`` (NNNNNN = the weight version). Returns its manifest."""
        save_trainer(self.trainer, out, base=self.cfg.model.path)
        (self.processor or self.tokenizer).save_pretrained(out)
        resume = {
            "round": round_no, "weight_version": self.policy_version,
            "sampler": {"pick": self.sampler.pick_rng.getstate(), "order": self.sampler.order_rng.getstate()},
            "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "buffer_state": {name: self.store.read_state(name) for name in RESUMABLE_STATE},
            "validation_log": [asdict(e) for e in self.validation_log],
        }
        (out / "campaign.json").write_text(json.dumps(resume))
        meta = {**meta, "round": round_no, "weight_version": self.policy_version}
        self.weight_store.write_checkpoint(self.policy_version, out, meta)
        return {**meta, "prefix": self.weight_store.checkpoint_prefix(self.policy_version)}

    def restore(self, version: int, into: Path) -> int:
        """Continue from committed checkpoint ``version`` (downloaded into ``into``): trainer,
        explorer weights, RNG states, buffer state and validation log as they were when it was
        written. Returns its round."""
        self.weight_store.read_checkpoint(version, into)
        load_trainer(self.trainer, into)
        self.trainer.share_state()  # the trainer's other processes, if any, take it from here
        resume = json.loads((into / "campaign.json").read_text())
        self.policy_version = resume["weight_version"]
        self.weights.publish(self.policy_version)  # checkpoints follow a sync: the explorer had these weights
        for rng, saved in ((self.sampler.pick_rng, resume["sampler"]["pick"]),
                           (self.sampler.order_rng, resume["sampler"]["order"])):
            rng.setstate((saved[0], tuple(saved[1]), saved[2]))
        for name in RESUMABLE_STATE if self.has_explorer else TRAINER_STATE:  # an explorer process keeps its own
            value = resume["buffer_state"][name]
            if value is None:
                self.store.delete_state(name)
            else:
                self.store.write_state(name, value)
        self.validation_log = [ValidationEntry(**e) for e in resume["validation_log"]]
        rng = torch.frombuffer(bytearray(base64.b64decode(resume["torch_rng"])), dtype=torch.uint8)
        torch.set_rng_state(rng.clone())
        return resume["round"]
