"""Trainer updates of builtin:tiny (float64) on fixed batches, for several algorithms, in however
many processes it is launched in (``accelerate launch --multi_gpu --num_processes P``, or plain
``python``); rank 0 saves each case's parameters. Run by ``test_data_parallel.py``, which compares
1 and 2 processes."""

from __future__ import annotations

import os
import random
import sys

import torch

from rftflow.components.algorithms import resolve
from rftflow.components.config import TrainerConfig
from rftflow.components.explore.models import load_model
from rftflow.components.train.trainer import Trainer

# name: (algorithm, its options, rows, micro-batch size, expert share). 15 rows in micro-batches of 7
# are split 4+3, 4+3 and — one row for two processes — computed whole by each
CASES = {
    "grpo": ("grpo", {"agg": "token-mean"}, 15, 7, 0.0),
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


def run(case: str, model, pad_id: int, processes: int) -> Trainer:
    algorithm, options, n, micro, expert = CASES[case]
    torch.manual_seed(0)
    trainer = Trainer(model, pad_id, TrainerConfig(lr=3e-3, micro_batch_size=micro, processes=processes),
                      resolve(algorithm, **options))
    batch = rows(1, n, model.config.vocab_size, expert)
    if case == "grpo":  # and an SFT warm start before it
        trainer.warm_start([batch[:7], batch[7:14], batch[14:]], peak_lr=1e-2)
    order = list(range(n))
    for k in range(STEPS):
        if algorithm != "dpo":
            random.Random(k).shuffle(order)
        trainer.train(batch, [order[s:s + micro] for s in range(0, n, micro)])
    return trainer


def main(out: str) -> None:
    torch.set_num_threads(1)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    params = {"processes": processes}
    for case in CASES:
        model, tokenizer = load_model("builtin:tiny")
        trainer = run(case, model.double(), tokenizer.pad_token_id, processes)
        params[case] = {name: p.detach().cpu() for name, p in trainer.unwrapped.named_parameters()}
        if trainer.critic is not None:
            critic = trainer.accelerator.unwrap_model(trainer.critic.model)
            params[case] |= {f"critic.{name}": p.detach().cpu() for name, p in critic.named_parameters()}
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(params, out)


if __name__ == "__main__":
    main(sys.argv[1])
