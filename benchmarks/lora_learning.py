"""LoRA against full weights at the same budget: held-out greedy accuracy and sampled reward of
GRPO campaigns on builtin:tiny, per seed.

The recipe is ``arith-grpo`` (two 2-digit terms summed, 128 tasks × 8 responses a round, 200
held-out tasks). Its warm start (full-weight SFT on demonstrations) makes one base per seed: a
LoRA adapter trains on a model that has learnt something, as it does in practice, and a
random-init tiny model under LoRA could not learn at all (its tied embeddings and final norm stay
frozen). From that base a LoRA campaign (rank ``--rank``, alpha ``--alpha``, learning rate
``--lora-lr`` falling to the same share of it as the config's rate does) and a full-weight campaign (the
config's learning rates) each run the same ``--rounds`` rounds. One JSON line per seed and variant: held-out
accuracy before and after, the mean sampled reward of the first and of the last 10 rounds, the
seconds of the rounds.

    python benchmarks/lora_learning.py                    # seeds 0 1 2
    python benchmarks/lora_learning.py --seeds 0 --rounds 30
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import rftflow.flows  # noqa: F401  (quiet defaults, before transformers draws a bar; imports no service)
from rftflow.components.campaign.stages import Campaign
from rftflow.components.config import load_config

COMMON = ["promotion.after_campaign=false", "checkpoint.every=100000"]


def base_model(args: argparse.Namespace, seed: int, root: Path) -> Path:
    """The config's warm start with full weights, saved as the seed's base model."""
    base = Campaign.from_config(args.config, root / f"base-{seed}",
                                [f"seed={seed}", f"threads={args.threads}", *COMMON, *args.set])
    base.prepare()
    base.warm_start()
    out = root / f"base-model-{seed}"
    base.trainer.unwrapped.save_pretrained(out)
    base.tokenizer.save_pretrained(out)
    return out


def run(args: argparse.Namespace, seed: int, root: Path):
    """(variant, its figures) for LoRA, then full weights, from the seed's base."""
    base = base_model(args, seed, root)
    trainer = load_config(args.config).trainer  # the adapter's rate falls to the same share of it (min_lr / lr)
    floor = [f"trainer.min_lr={args.lora_lr * trainer.min_lr / trainer.lr}"] if trainer.min_lr is not None else []
    variants = {"LoRA": [f"model.lora={{rank: {args.rank}, alpha: {args.alpha}}}", f"trainer.lr={args.lora_lr}", *floor],
                "full": []}
    for name, overrides in variants.items():
        c = Campaign.from_config(args.config, root / f"{name}-{seed}", [
            f"seed={seed}", f"threads={args.threads}", f"model.path={base}", "trainer.warmup_steps=0",
            f"rounds={args.rounds}", *COMMON, *args.set, *overrides])
        c.prepare()
        c.warm_start()
        before = c.evaluate()["accuracy/held_out"]
        began = time.perf_counter()
        rewards = [c.run_round(r)["reward/mean"] for r in range(1, c.cfg.rounds + 1)]
        seconds = time.perf_counter() - began
        yield name, {"rounds": c.cfg.rounds, "before": before, "after": c.evaluate()["accuracy/held_out"],
                     "reward_first_10": statistics.mean(rewards[:10]), "reward_last_10": statistics.mean(rewards[-10:]),
                     "rounds_s": round(seconds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="arith-grpo")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rounds", type=int, default=100,
                        help="GRPO rounds of each variant (100: within 10 minutes a campaign on 2 cores).")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--alpha", type=float, default=32.0)
    parser.add_argument("--lora-lr", type=float, default=5e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="An override for every run.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        for seed in args.seeds:
            for name, r in run(args, seed, Path(root)):
                print(json.dumps({"seed": seed, "variant": name, **r}), flush=True)


if __name__ == "__main__":
    main()
