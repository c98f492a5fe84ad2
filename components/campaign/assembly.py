"""The parts of one campaign, each built from the checked config and the parts it needs: ``Campaign``
(``campaign.stages``) calls these in order; a trainer process of rank > 0 (``follow_trainer``)
builds its model and trainer here too.

The order matters where a part draws from torch's generator (a built-in model's weights, a LoRA
adapter's): ``Campaign`` seeds first (``seed``), then loads the models, then builds the trainer.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.layout import open_run_store
from rftflow.components.buffer.leases import ShardLeases
from rftflow.components.buffer.sampling import Sampler
from rftflow.components.buffer.weights import WeightStore
from rftflow.components.config import CampaignConfig, Mode
from rftflow.components.data.tasksets import Task
from rftflow.components.evaluation.greedy import Answer, held_out
from rftflow.components.explore.engines import make_engine
from rftflow.components.explore.models import load_model, load_processor
from rftflow.components.explore.sync import MemoryWeightSync, StoreWeightSync
from rftflow.components.explore.workflows import make_workflow
from rftflow.components.train import adapters
from rftflow.components.train.trainer import Trainer

Evaluate = Callable[[list[Task], Any, list[Answer] | None], dict[str, float]]


@dataclass(frozen=True)
class Models:
    """The campaign's model: the trainer's ``policy``, the ``explorer``'s copy (the policy itself
    in a process with one role), its tokenizer and a vision-language model's processor (None for text)."""

    policy: Any
    explorer: Any
    tokenizer: Any
    processor: Any


def seed(cfg: CampaignConfig) -> None:
    """torch's threads (``threads``) and generator (``seed``) for this process."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)


def open_store(cfg: CampaignConfig, run_dir: Path) -> ExperienceStore:
    """The campaign's experience store; a round's writes go behind the compute (``write_behind``)
    and each round ends with them stored (``Campaign.sync``)."""
    return ExperienceStore(open_run_store(cfg.storage, run_dir), cfg.name,
                           write_behind=cfg.storage.write_behind, shards=cfg.explorer.shards)


def load_models(cfg: CampaignConfig) -> Models:
    """``model.path`` loaded, and the explorer's own copy where this process trains too (on cuda
    when there is one and the ``hf`` engine decodes: where the trainer's Accelerator trains)."""
    policy, tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download, dtype=cfg.model.dtype)
    processor = load_processor(cfg.model.path, allow_download=cfg.model.allow_download)
    explorer = copy.deepcopy(policy) if cfg.mode.trains and cfg.mode.explores else policy
    if torch.cuda.is_available() and cfg.explorer.engine == "hf":
        explorer.to("cuda")
    return Models(policy, explorer, tokenizer, processor)


def make_explorer_engine(cfg: CampaignConfig, models: Models):
    """The engine over the explorer's model: ``explorer.engine``'s; a trainer alone evaluates
    with its policy itself (``hf``)."""
    settings = cfg.explorer if cfg.mode.explores else cfg.explorer.model_copy(update={"engine": "hf"})
    return make_engine(settings, models.explorer, models.tokenizer, cfg.model, seed=cfg.seed)


def make_workflows(cfg: CampaignConfig, models: Models, reward_fn) -> tuple[Any, dict[str, Any]]:
    """The taskset's workflow, and a mixture's parts' (part → the workflow of its taskset; empty
    without a mixture)."""
    context = getattr(models.policy.config, "max_position_embeddings", None)
    workflow = make_workflow(cfg, models.tokenizer, reward_fn=reward_fn, context_limit=context)
    parts = {name: make_workflow(cfg.model_copy(update={"taskset": taskset}), models.tokenizer,
                                 reward_fn=reward_fn, context_limit=context)
             for name, taskset in cfg.part_tasksets().items()}
    return workflow, parts


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


def make_leases(cfg: CampaignConfig, store: ExperienceStore) -> ShardLeases | None:
    """This explorer process's leases on shards, where several share the rounds (None otherwise)."""
    if cfg.mode == Mode.EXPLORE and cfg.explorer.shards > 1:
        return ShardLeases(store.direct, cfg.name, cfg.explorer.lease_seconds)
    return None


def held_out_evaluation(cfg: CampaignConfig, workflow, workflows: dict[str, Any], reward_fn) -> Evaluate:
    """``evaluate(tasks, engine, answers)``: ``evaluation.greedy.held_out`` of ``engine`` on
    ``tasks``, each through its workflow's greedy episodes (a mixture part's for its tasks); each
    task's ``Answer`` into ``answers``."""

    def evaluate(tasks: list[Task], engine, answers: list[Answer] | None = None) -> dict[str, float]:
        def episodes(part: str | None, some: list[Task]) -> dict[str, float]:
            return (workflow if part is None else workflows[part]).evaluate(
                engine, some, reward_fn, cfg.reward.function, cfg.eval.max_new_tokens, answers)

        return held_out(tasks, episodes, mixture=bool(cfg.mixture))

    return evaluate


def follow_trainer(cfg: CampaignConfig) -> None:
    """A trainer process of rank > 0 (``accelerate launch``): the campaign's model and trainer,
    stepping with rank 0's until the campaign ends (``Trainer.follow``). Nothing is written."""
    seed(cfg)
    policy, tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download, dtype=cfg.model.dtype)
    make_trainer(cfg, cfg.algorithm.resolve(), policy, tokenizer.pad_token_id).follow()
