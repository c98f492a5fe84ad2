"""Campaigns' held-out accuracy before and after their rounds, without Prefect or MLflow: the pure
``Campaign`` (prepare, warm start, rounds), so a machine with torch, transformers and the
components' libraries runs it. It decodes and trains on the GPU when there is one.

One JSON line per campaign and variant: the device, the held-out accuracy before and after, split
into format (``finished``: the share of greedy answers that end within the token budget) and
skill (``of_finished``: the accuracy of those), the mean sampled reward of the first and of the
last five rounds, and the seconds (warm start and rounds; not the two evaluations).

    python benchmarks/before_after.py gsm8k-smollm2 humaneval-smollm2 --rounds 20
    python benchmarks/before_after.py smollm2-arith --variant full= \\
        --variant "lora=model.lora={rank: 16, alpha: 32};trainer.lr=1e-4"
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import rftflow.flows  # noqa: F401  (quiet defaults, before transformers draws a bar; imports no service)
import torch
from rftflow.components.campaign.stages import Campaign


def device() -> str:
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"


def run(config: str, overrides: list[str], run_dir: Path) -> dict:
    """One campaign from its warm start: accuracy before and after, reward of the first and last rounds."""
    campaign = Campaign.from_config(config, run_dir, overrides)
    campaign.prepare()
    began = time.perf_counter()
    campaign.warm_start()
    warm = time.perf_counter() - began
    before = campaign.evaluate()
    began = time.perf_counter()
    rewards = [campaign.run_round(r)["reward/mean"] for r in range(1, campaign.cfg.rounds + 1)]
    rounds = time.perf_counter() - began
    after = campaign.evaluate()
    pick = ("accuracy/held_out", "accuracy/finished", "accuracy/of_finished")
    return {"rounds": campaign.cfg.rounds, "held_out": len(campaign.splits.eval),
            "before": {k.split("/")[1]: before[k] for k in pick if k in before},
            "after": {k.split("/")[1]: after[k] for k in pick if k in after},
            "reward_first_5": statistics.mean(rewards[:5]), "reward_last_5": statistics.mean(rewards[-5:]),
            "warm_start_s": round(warm, 1), "rounds_s": round(rounds, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("configs", nargs="+", help="Shipped config names or YAML files.")
    parser.add_argument("--rounds", type=int, help="Rounds (default: the config's).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="An override for every run.")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=K=V;K=V",
                        help="Run each config once per variant, with these overrides (default: one run as is).")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    variants = dict(v.split("=", 1) for v in args.variant) or {"as_is": ""}
    common = [f"seed={args.seed}", "promotion.after_campaign=false", "checkpoint.every=100000",
              *([f"rounds={args.rounds}"] if args.rounds else []), *args.set]
    with tempfile.TemporaryDirectory() as root:
        for config in args.configs:
            for name, more in variants.items():
                run_dir = Path(root) / f"{Path(config).stem}-{name}"
                result = run(config, [*common, *filter(None, more.split(";"))], run_dir)
                print(json.dumps({"config": config, "variant": name, "seed": args.seed, "device": device(),
                                  **result}), flush=True)


if __name__ == "__main__":
    main()
