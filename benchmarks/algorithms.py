"""Held-out accuracy per algorithm preset on the default task, from the same warm start, over seeds.

Per seed, one warm start (the default campaign's SFT steps on demonstrations, or ``--warmup-steps``)
is made once; every preset then starts from its weights and optimizer state and runs the same
number of rounds, each training on the same number of rows (1024 by default): `mix` 256 explorer
rows + 768 demonstrations, the RL presets 1024 explorer rows (128 tasks x 8), `sft` 1024
demonstrations. Presets run at their defaults (the RL presets' ``lr_scale`` included); ``--set``
adds config overrides for every run. Prints each seed's figures, then per preset the mean gain
over the warm start and its spread (min..max over seeds).

    python benchmarks/algorithms.py                                     # every preset, seeds 0-2
    python benchmarks/algorithms.py --config configs/arith-grpo.yaml    # the GRPO-only campaign's task
    python benchmarks/algorithms.py --algorithms grpo --warmup-steps 1000 --rounds 30
    python benchmarks/algorithms.py --algorithms grpo --set algorithm.lr_scale=1   # any config override
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import rftflow.flows  # noqa: F401  (quiet service defaults)
from rftflow.components.algorithms.presets import PRESET_NAMES
from rftflow.components.campaign.stages import Campaign
from rftflow.components.config import load_config

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "arith-mix.yaml"


def budget(algorithm: str, rows_per_round: int, repeat_times: int) -> list[str]:
    if algorithm == "sft":
        return [f"buffer.expert_per_round={rows_per_round}"]
    if algorithm == "mix":
        return [f"explorer.tasks_per_round={rows_per_round // 4 // repeat_times}",
                f"buffer.expert_per_round={rows_per_round * 3 // 4}"]
    return [f"explorer.tasks_per_round={rows_per_round // repeat_times}", "buffer.expert_per_round=0"]


def common(seed: int, args: argparse.Namespace) -> list[str]:
    return [f"seed={seed}", f"rounds={args.rounds}", *args.set]


def warm_start(seed: int, args: argparse.Namespace) -> dict:
    """The seed's warm start: trainer weights, optimizer state and held-out accuracy."""
    cfg = load_config(args.config, ["name=bench-warm", f"trainer.warmup_steps={args.warmup_steps}", *common(seed, args)])
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(cfg, run_dir)
        campaign.prepare()
        campaign.warm_start()
        return {"model": copy.deepcopy(campaign.trainer.unwrapped.state_dict()),
                "optimizer": copy.deepcopy(campaign.trainer.optimizer.state_dict()),
                "accuracy": campaign.evaluate()["accuracy/held_out"]}


def run(algorithm: str, seed: int, warm: dict, args: argparse.Namespace) -> dict[str, float]:
    """``algorithm``'s rounds from the warm start ``warm``: held-out accuracy after them."""
    overrides = [f"name=bench-{algorithm}", f"algorithm.name={algorithm}", "trainer.warmup_steps=0",
                 *budget(algorithm, args.rows_per_round, 8), *common(seed, args)]
    cfg = load_config(args.config, overrides)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(cfg, run_dir)
        campaign.prepare()
        campaign.trainer.unwrapped.load_state_dict(warm["model"])
        campaign.trainer.optimizer.load_state_dict(warm["optimizer"])
        campaign.policy_version = 1  # as after a warm start
        campaign.weights.publish(campaign.policy_version)
        for r in range(1, cfg.rounds + 1):
            campaign.run_round(r)
        after = campaign.evaluate()["accuracy/held_out"]
    return {"before": warm["accuracy"], "after": after, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default=",".join(PRESET_NAMES))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="campaign config: the task, model, warm start and rounds (default: the default campaign's)")
    known, _ = parser.parse_known_args()
    default = load_config(known.config)
    parser.add_argument("--rounds", type=int, default=default.rounds)
    parser.add_argument("--warmup-steps", type=int, default=default.trainer.warmup_steps)
    parser.add_argument("--rows-per-round", type=int, default=1024)
    parser.add_argument("--set", action="append", default=[], help="config override for every run, key=value")
    args = parser.parse_args()
    algorithms, seeds = args.algorithms.split(","), [int(s) for s in args.seeds.split(",")]
    results: dict[str, dict[int, dict[str, float]]] = {a: {} for a in algorithms}
    for seed in seeds:
        start = time.perf_counter()
        warm = warm_start(seed, args)
        print(f"seed {seed}: warm start {args.warmup_steps} steps -> {warm['accuracy']:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
        for algorithm in algorithms:
            r = results[algorithm][seed] = run(algorithm, seed, warm, args)
            print(f"  {algorithm}: {r['before']:.3f} -> {r['after']:.3f} ({r['seconds']:.0f} s)", flush=True)
    print(f"\n{args.config.name}: warm start {args.warmup_steps} SFT steps, then {args.rounds} rounds x {args.rows_per_round} rows "
          f"{' '.join(args.set)}; held-out greedy accuracy (200 tasks); seeds {args.seeds}\n")
    print("| algorithm | after warm start (per seed) | after rounds (per seed) | gain mean | gain min..max |\n"
          "| --- | --- | --- | --- | --- |")
    for algorithm, per_seed in results.items():
        gains = [r["after"] - r["before"] for r in per_seed.values()]
        before = " / ".join(f"{r['before']:.3f}" for r in per_seed.values())
        after = " / ".join(f"{r['after']:.3f}" for r in per_seed.values())
        print(f"| {algorithm} | {before} | {after} | {statistics.mean(gains):+.3f} | "
              f"{min(gains):+.3f}..{max(gains):+.3f} |")


if __name__ == "__main__":
    main()
