"""``Campaign``: the parts of one running campaign, wired together, with one method per stage.

Stage methods take a round number and return small metric dicts (namespaced keys); data passes
between stages through the object store (``ExperienceBuffer`` staging), so each stage can be
retried on its own. Nothing here imports Prefect: ``tasks/`` wrap these methods.
"""

from __future__ import annotations

import copy
import functools
import random
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import torch

from components import explorer
from components.buffer import ExperienceBuffer, campaigns_in, open_run_store, round_dir
from components.config import CampaignConfig
from components.models import load_model
from components.rewards import make_reward_fn
from components.rollout import HFRolloutEngine
from components.sampling import (
    drop_stale, drop_zero_variance_groups, first_groups, informative_groups, preference_pairs,
)
from components.sync import MemoryWeightSync
from components.selectors import PassRates, measured_rewards, select_tasks
from components.tasksets import Task, load_tasks, recheck_tasks, tasks_from_table, tasks_to_table
from components.trainer import Trainer
from components.pipelines import run_pipeline
from components.validation import ContractError, ValidationEntry, check_experiences, enforce


class Campaign:
    """Model copies (trainer + explorer), store, buffer, reward, weight sync for one campaign."""

    def __init__(self, cfg: CampaignConfig, run_dir: str | Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        torch.manual_seed(cfg.seed)
        self.store = open_run_store(cfg.storage, self.run_dir)
        self.buffer = ExperienceBuffer(self.store, cfg.name)
        self.reward_fn = make_reward_fn(cfg.reward.function, cfg.taskset.source)
        policy, self.tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download,
                                            dtype=cfg.model.dtype)
        explorer_model = copy.deepcopy(policy)
        self.engine = HFRolloutEngine(explorer_model, self.tokenizer, batch_size=cfg.explorer.batch_size,
                                      chat_template=cfg.model.chat_template)
        self.trainer = Trainer(policy, self.tokenizer.pad_token_id, cfg.trainer, cfg.algorithm,
                               temperature=cfg.explorer.temperature, seed=cfg.seed)
        self.weights = MemoryWeightSync(self.trainer.unwrapped, explorer_model)
        self.rng = random.Random(cfg.seed)
        self.validation_log: list[ValidationEntry] = []

    # setup -----------------------------------------------------------------------------------
    def prepare(self) -> dict[str, float]:
        """Build the taskset splits and expert demonstrations and store them (idempotent)."""
        taskset = load_tasks(self.cfg.taskset, self.cfg.seed, self.cfg.contracts)
        train_table = tasks_to_table(taskset.train)
        metrics: dict[str, float] = {}
        if self.cfg.pipelines.tasks:
            result = run_pipeline("tasks", train_table, self.cfg.pipelines.tasks, seed=self.cfg.seed,
                                  prompt_template=self.cfg.taskset.prompt_template,
                                  pass_rates=self.store_pass_rates())
            train_table, rejected = recheck_tasks(result.kept, taskset.held_out, self.cfg.contracts)
            dropped = pa.concat_tables([result.dropped, rejected], promote_options="default")
            self._record("tasks pipeline", 0, train_table.num_rows + dropped.num_rows, dropped)
            self.buffer.write_quarantine("tasks-pipeline", dropped)
            metrics |= {"tasks/pipeline_dropped": dropped.num_rows, "tasks/pipeline_added": result.added}
        self.buffer.write_quarantine("tasks", taskset.quarantined)
        self._record("tasks contract", 0, taskset.rows_checked, taskset.quarantined)
        self.buffer.write_tasks("train", train_table)
        self.buffer.write_tasks("eval", tasks_to_table(taskset.held_out))
        train = tasks_from_table(train_table)
        expert = explorer.expert_demonstrations(self.engine, train, campaign=self.cfg.name,
                                                limit=self.cfg.algorithm.expert_tasks or None)
        verdict = check_experiences(expert, self.cfg.contracts.bounds(), kind="expert")
        self._record("expert contract", 0, expert.num_rows, verdict.quarantined)
        self.buffer.write_quarantine("expert", verdict.quarantined)  # kept even if the batch fails below
        enforce(verdict, self.cfg.contracts.max_bad_fraction, "expert demonstrations")
        self.buffer.write_expert(verdict.accepted)
        return {**metrics, "tasks/train": len(train), "tasks/eval": len(taskset.held_out),
                "tasks/quarantined": taskset.quarantined.num_rows, "tasks/expert": verdict.accepted.num_rows}

    def validation_entries(self) -> list[ValidationEntry]:
        """Every checked batch for the validation report: the files ingested into the campaign's
        store (by ``rftflow ingest``, before or during the run), then this run's checks."""
        ingested = [ValidationEntry(f"ingested {r['kind']} file", 0, r["rows"], r["accepted"], r["quarantined"],
                                    r["reasons"]) for r in self.buffer.ingest_reports()]
        return [*ingested, *self.validation_log]

    def _record(self, stage: str, round_no: int, rows: int, rejected: pa.Table) -> None:
        """Add a line to the validation log (the campaign's validation report); a retried stage
        replaces its earlier line for the same round."""
        reasons = rejected.column("reason").to_pylist() if rejected.num_rows else []
        self.validation_log = [e for e in self.validation_log if (e.stage, e.round) != (stage, round_no)]
        self.validation_log.append(ValidationEntry(stage, round_no, rows, rows - rejected.num_rows, len(reasons),
                                                   dict(Counter(p for r in reasons for p in r.split("; ")))))

    @functools.cached_property
    def train_tasks(self) -> list[Task]:
        return tasks_from_table(self.buffer.read_tasks("train"))

    @functools.cached_property
    def tasks_by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.train_tasks}

    @functools.cached_property
    def eval_tasks(self) -> list[Task]:
        return tasks_from_table(self.buffer.read_tasks("eval"))

    def warm_start(self, progress=None) -> dict[str, float]:
        """Expert-only SFT steps before the RL rounds (``trainer.warmup_steps``), then sync."""
        steps = self.cfg.trainer.warmup_steps
        if steps == 0:
            return {}
        rows = self.buffer.read_expert().to_pylist()
        last = self.trainer.warm_start(rows, steps, self.cfg.trainer.warmup_lr, progress)
        self.weights.sync()
        return {"warmup/steps": float(steps), "warmup/loss_sft": last.get("loss/sft", float("nan"))}

    # stages ----------------------------------------------------------------------------------
    def explore(self, round_no: int) -> dict[str, float]:
        """Sample the round's tasks and generate ``repeat_times`` responses each → staging/rollouts.

        With dynamic sampling (DAPO), further task batches are explored while fewer than
        ``tasks_per_round`` groups have unequal rewards (at most ``max_explore_batches`` batches).
        """
        ex, algo = self.cfg.explorer, self.cfg.algorithm
        torch.manual_seed(self.cfg.seed * 1_000_003 + round_no)
        tables, batches = [], 0
        rates = self.pass_rates() if ex.task_selector == "curriculum" else None
        while True:
            tasks = select_tasks(self.train_tasks, round_no, ex.tasks_per_round, self.cfg.seed,
                                 selector=ex.task_selector, batch=batches, pass_rates=rates,
                                 target=ex.curriculum_target)
            tables.append(explorer.explore(
                self.engine, tasks, campaign=self.cfg.name, round_no=round_no, repeat_times=ex.repeat_times,
                temperature=ex.temperature, max_new_tokens=ex.max_new_tokens, model_version=self.weights.version,
                first_slot=batches * ex.tasks_per_round))
            batches += 1
            if not algo.setting("dynamic_sampling") or batches == algo.max_explore_batches:
                break
            scored = explorer.score(pa.concat_tables(tables), self.tasks_by_id, self.reward_fn,
                                    self.cfg.reward.function)
            if informative_groups(scored) >= ex.tasks_per_round:
                break
        table = pa.concat_tables(tables)
        self.buffer.write_staging(round_no, "rollouts", table)
        lengths = pc.list_value_length(table.column("response_ids"))
        return {"explore/rows": table.num_rows, "explore/batches": batches,
                "explore/response_len": pc.mean(lengths).as_py() or 0.0}

    def verify(self, round_no: int) -> dict[str, float]:
        """Score the rollouts and check the experience contract → staging/verified (with ``reason``)."""
        scored = explorer.score(self.buffer.read_staging(round_no, "rollouts"), self.tasks_by_id, self.reward_fn,
                                self.cfg.reward.function)
        contracts = self.cfg.contracts
        verdict = check_experiences(scored, contracts.bounds(max_model_version=self.weights.version,
                                                             group_size=self.cfg.explorer.repeat_times))
        self._record("experience contract", round_no, scored.num_rows, verdict.quarantined)
        try:
            enforce(verdict, contracts.max_bad_fraction, f"round {round_no} experiences")
        except ContractError:  # the stage fails; its bad rows stay where `buffer show --kind failed` finds them
            self.buffer.write_quarantine(f"failed/{round_dir(round_no)}", verdict.quarantined)
            raise
        accepted, rejected = verdict.accepted, verdict.quarantined
        metrics = {}
        if self.cfg.pipelines.experiences:
            result = run_pipeline("experiences", accepted, self.cfg.pipelines.experiences, seed=self.cfg.seed)
            accepted, rejected = result.kept, pa.concat_tables([rejected, result.dropped], promote_options="default")
            self._record("experience pipeline", round_no, verdict.accepted.num_rows, result.dropped)
            metrics["pipeline/dropped"] = result.dropped.num_rows
        reasons = pa.array([None] * accepted.num_rows, pa.string())
        verified = pa.concat_tables([accepted.append_column("reason", reasons), rejected])
        self.buffer.write_staging(round_no, "verified", verified)
        rewards = scored.column("reward")
        return {**metrics, "reward/mean": pc.mean(rewards).as_py(), "reward/std": pc.stddev(rewards).as_py() or 0.0,
                "contract/accepted": verdict.counts["accepted"], "contract/quarantined": verdict.counts["quarantined"]}

    def store_round(self, round_no: int) -> dict[str, float]:
        """Commit verified rows to the buffer: accepted → experiences/usual, rejected → quarantine."""
        verified = self.buffer.read_staging(round_no, "verified")
        rejected = pc.is_valid(verified.column("reason"))
        accepted = verified.filter(pc.invert(rejected)).drop_columns(["reason"])
        self.buffer.write_usual(round_no, accepted)
        self.buffer.write_quarantine(round_no, verified.filter(rejected))
        rates = self.pass_rates()
        if rates.add_round(round_no, measured_rewards(verified)):
            self.buffer.write_state("pass_rates", rates.to_state())
        return {"buffer/usual_rows": accepted.num_rows, "tasks/mean_pass_rate": rates.mean()}

    def pass_rates(self) -> PassRates:
        """Measured pass rates of the training tasks (``state/pass_rates.json``)."""
        return PassRates(self.buffer.read_state("pass_rates"))

    def store_pass_rates(self) -> PassRates:
        """Pass rates measured by every campaign in this store (tasks are keyed by question hash,
        so a task explored by an earlier campaign on the same source has a measured rate)."""
        return PassRates.merged(ExperienceBuffer(self.store, name).read_state("pass_rates")
                                for name in campaigns_in(self.store))

    def train(self, round_no: int) -> dict[str, float]:
        """Update the policy on explorer experiences taken from the buffer (FIFO or replay, see
        ``buffer``) plus sampled expert rows, per algorithm; then mark those experiences consumed."""
        algo, buf = self.cfg.algorithm, self.cfg.buffer
        parts, metrics, commit = [], {}, None
        if algo.uses_explorer:
            if buf.sampling == "replay":
                n_rows = buf.train_rows or self.cfg.explorer.tasks_per_round * self.cfg.explorer.repeat_times
                usual, commit = self.buffer.take_replay(n_rows, self.weights.version, self.rng,
                                                        decay=buf.priority_decay, reuse_limit=buf.reuse_limit,
                                                        max_staleness=algo.max_staleness)
            else:
                usual, commit = self.buffer.take_fifo(buf.train_rows)
                if algo.max_staleness is not None:
                    usual, stale = drop_stale(usual, self.weights.version, algo.max_staleness)
                    metrics["sample/dropped_stale"] = float(stale)
            metrics["sample/usual_rows"] = float(usual.num_rows)
            if algo.setting("dynamic_sampling"):
                usual, dropped = drop_zero_variance_groups(usual)
                usual = first_groups(usual, self.cfg.explorer.tasks_per_round)
                metrics["sample/dropped_groups"] = float(dropped)
            if self.trainer.pairwise:
                usual, pairs = preference_pairs(usual)
                metrics["sample/pairs"] = float(pairs)
            parts.append(usual)
        if algo.uses_expert:
            n_expert = algo.expert_per_round
            if algo.expert_ratio is not None and algo.uses_explorer:  # a share of the batch, set by the explorer rows
                n_expert = round(sum(p.num_rows for p in parts) * algo.expert_ratio / (1 - algo.expert_ratio))
            parts.append(self.buffer.sample_expert(n_expert, self.rng, algo.human_min_reward))
        batch = pa.concat_tables(parts)
        sources = Counter(batch.column("source").to_pylist())
        metrics |= {"sample/expert_rows": sources["expert"], "sample/human_rows": sources["human"]}
        rows = batch.to_pylist()
        lr = self.trainer.round_lr(round_no, self.cfg.rounds)
        self.trainer.set_lr(lr)
        metrics = {**self.trainer.train(rows), **metrics, "train/lr": lr}
        if commit is not None:
            commit()
        return metrics

    def sync(self, round_no: int) -> dict[str, float]:
        """Push the trainer's weights to the explorer; bump the weight version."""
        return {"sync/weight_version": float(self.weights.sync())}

    def run_round(self, round_no: int) -> dict[str, float]:
        """All five stages of a round in order, without Prefect (tests, benchmarks, notebooks)."""
        metrics: dict[str, float] = {}
        for stage in (self.explore, self.verify, self.store_round, self.train, self.sync):
            metrics |= stage(round_no)
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy of the explorer's (latest synced) model on the held-out split."""
        return explorer.evaluate(self.engine, self.eval_tasks, self.reward_fn, self.cfg.eval.max_new_tokens)

    # results ---------------------------------------------------------------------------------
    def save_model(self, out_dir: str | Path) -> Path:
        """The trained policy + tokenizer in Hugging Face format, also copied to the store."""
        out = Path(out_dir)
        self.trainer.unwrapped.save_pretrained(out)
        self.tokenizer.save_pretrained(out)
        prefix = self.buffer.checkpoint_prefix(self.weights.version)
        for f in sorted(out.iterdir()):
            self.store.put(f"{prefix}/{f.name}", f.read_bytes())
        return out
