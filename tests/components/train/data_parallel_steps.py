"""Trainer updates of builtin:tiny (float64) on fixed batches, for several algorithms, in however
many processes it is launched in (``accelerate launch --multi_gpu --num_processes P``, or plain
``python``); rank 0 saves each case's parameters under ``plain`` (the model whole in each process).
With ``--fsdp`` the same processes then run the cases again sharding the model (``trainer.fsdp``),
saved under ``sharded``. ``resumed:<case>`` is the case saved after its first round and continued
by a new trainer from the checkpoint (with its reference model or critic). ``--pretrained``: also
a round of SmolLM2-135M-Instruct in float32 (``pretrained``; sharded only with ``--fsdp``). Run by
``test_data_parallel.py``, which compares 1 and 2 processes (one launch each: a process's imports
cost more than its updates)."""

from __future__ import annotations

import os
import random
import sys

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from rftflow.components.algorithms import resolve
from rftflow.components.config import LoraConfig, TrainerConfig
from rftflow.components.explore.models import load_model
from rftflow.components.train.checkpoints import load_trainer, save_trainer
from rftflow.components.train.trainer import Trainer

# name: (algorithm, its options, rows, micro-batch size, expert share). 15 rows in micro-batches of 7
# are split 4+3, 4+3 and — one row for two processes — computed whole by each
CASES = {
    "grpo": ("grpo", {"agg": "token-mean"}, 15, 7, 0.0),
    "grpo-kl": ("grpo", {"agg": "token-mean", "kl_coef": 0.1, "kl_mode": "loss"}, 15, 7, 0.0),  # a reference
    "grpo-lora": ("grpo", {"agg": "token-mean", "kl_coef": 0.1, "kl_mode": "loss"}, 15, 7, 0.0),  # LoRA; the base
    "mix": ("mix", {"agg": "seq-mean-token-mean"}, 15, 7, 0.3),
    "ppo": ("ppo", {"agg": "seq-mean-token-sum-norm", "kl_coef": 0.1, "kl_mode": "loss"}, 15, 7, 0.0),
    "dpo": ("dpo", {}, 20, 10, 0.0),  # (chosen, rejected) pairs, never split: 5 pairs as 2 + 3
}
STEPS = 2  # rounds, each a pass over the rows in a new order (2 to 3 updates each)


def rows(seed: int, n: int, vocab: int, expert: float) -> list[dict]:
    """``n`` rows in groups of 4: random prompts and responses of mixed lengths, rewards, behaviour
    log-probs off the policy's (ratios get clipped); a share ``expert`` of them expert rows."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        response = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 9))]
        row = {"prompt_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(3, 7))], "response_ids": response,
               "source": "explorer", "group_id": f"g{i // 4}", "reward": float(rng.random() < 0.5),
               "response_logprobs": [-rng.uniform(2, 6) for _ in response]}
        if rng.random() < expert:
            row.update(source="expert", reward=1.0, response_logprobs=None)
        out.append(row)
    return out


RESUMED = ("grpo-kl", "grpo-lora", "ppo")  # also run as "resumed:<case>"


def run(case: str, processes: int, fsdp: bool) -> Trainer:
    resumed = case.startswith("resumed:")
    case = case.removeprefix("resumed:")
    algorithm, options, n, micro, expert = CASES[case]

    def new_trainer() -> Trainer:
        model, tokenizer = load_model("builtin:tiny")
        torch.manual_seed(0)
        return Trainer(model.double(), tokenizer.pad_token_id,
                       TrainerConfig(lr=3e-3, micro_batch_size=micro, processes=processes, fsdp=fsdp),
                       resolve(algorithm, **options), lora=LoraConfig(rank=4, alpha=8) if case == "grpo-lora" else None)

    trainer = new_trainer()
    batch = rows(1, n, trainer.unwrapped.config.vocab_size, expert)
    if case.startswith("grpo"):  # and an SFT warm start before it (before the reference is made)
        trainer.warm_start([batch[:7], batch[7:14], batch[14:]], peak_lr=1e-2)
    order = list(range(n))
    for k in range(STEPS):
        if resumed and k == 1:  # a checkpoint after the first round, continued by a new trainer
            with tempfile.TemporaryDirectory() as out:
                shared = [out]
                if processes > 1:
                    dist.broadcast_object_list(shared, src=0)  # rank 0's directory, written by rank 0
                save_trainer(trainer, Path(shared[0]) / "checkpoint")
                if processes > 1:
                    dist.barrier()
                trainer = new_trainer()
                load_trainer(trainer, Path(shared[0]) / "checkpoint")
                if processes > 1:
                    dist.barrier()  # all have read it before rank 0 removes it
        if algorithm != "dpo":
            random.Random(k).shuffle(order)
        trainer.train(batch, [order[s:s + micro] for s in range(0, n, micro)])
    return trainer


def pretrained(processes: int, fsdp: bool) -> Trainer:
    """SmolLM2-135M-Instruct in float32: one GRPO round of two steps (8 rows each) at lr 1e-5."""
    model, tokenizer = load_model("builtin:smollm2-135m-instruct")
    torch.manual_seed(0)
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model, tokenizer.pad_token_id,
                      TrainerConfig(lr=1e-5, micro_batch_size=8, processes=processes, fsdp=fsdp), resolve("grpo"))
    trainer.start = start  # for the test: how far the round moved the weights
    batch = rows(1, 16, model.config.vocab_size, 0.0)
    trainer.train(batch, [list(range(8)), list(range(8, 16))])
    return trainer


def parameters(trainer: Trainer, case: str, fsdp: bool) -> dict:
    """The case's parameters (the critic's too) and, with fsdp, the share of the policy this process holds."""
    params = {case: {name: p.detach().cpu() for name, p in trainer.unwrapped.named_parameters()}}
    if case == "pretrained" and trainer.processes == 1:
        params["start"] = trainer.start
    if fsdp:  # the share of the policy's elements this process holds
        held = sum(p.to_local().numel() for p in trainer.model.parameters())
        params[f"{case}.held"] = held / sum(p.numel() for p in trainer.unwrapped.parameters())
    if trainer.critic is not None:
        if fsdp:  # the critic's shards gathered (on every process; whole on rank 0)
            critic = trainer.checkpoint_state()["critic"][0].items()
        else:
            critic = trainer.accelerator.unwrap_model(trainer.critic.model).named_parameters()
        params[case] |= {f"critic.{name}": p.detach().cpu() for name, p in critic}
    return params


def main(out: str, fsdp: bool, real: bool) -> None:
    torch.set_num_threads(1)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    saved = {"processes": processes}
    cases = (*CASES, *(f"resumed:{c}" for c in RESUMED))
    for mode in ("plain", "sharded") if fsdp else ("plain",):
        sharded = mode == "sharded"
        saved[mode] = {}
        for case in cases:
            saved[mode] |= parameters(run(case, processes, sharded), case, sharded)
        if real and sharded == fsdp:  # SmolLM2 sharded when the processes shard, else whole
            saved[mode] |= parameters(pretrained(processes, sharded), "pretrained", sharded)
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(saved, out)


if __name__ == "__main__":
    main(sys.argv[1], "--fsdp" in sys.argv[2:], "--pretrained" in sys.argv[2:])
