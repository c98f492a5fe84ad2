"""Held-out accuracy per algorithm on the default task, with the same budget for each.

Budget: the default campaign's warm start, then the same number of rounds, each training on the
same number of rows (1024 by default): `mix` 256 explorer rows + 768 demonstrations, the RL presets
1024 explorer rows (128 tasks x 8), `sft` 1024 demonstrations. Same learning-rate schedule.

    python benchmarks/algorithms.py                       # sft, grpo, mix at the default budget
    python benchmarks/algorithms.py --rounds 20 --warmup-steps 1500 --algorithms sft,grpo,mix,dr_grpo
    python benchmarks/algorithms.py --algorithms grpo --set trainer.lr=5e-5   # any config override
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import flows  # noqa: F401  (quiet service defaults)
from components.campaign import Campaign
from components.config import load_config

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "arith-mix.yaml"


def budget(algorithm: str, rows_per_round: int, repeat_times: int) -> list[str]:
    if algorithm == "sft":
        return [f"buffer.expert_per_round={rows_per_round}"]
    if algorithm == "mix":
        return [f"explorer.tasks_per_round={rows_per_round // 4 // repeat_times}",
                f"buffer.expert_per_round={rows_per_round * 3 // 4}"]
    return [f"explorer.tasks_per_round={rows_per_round // repeat_times}", "buffer.expert_per_round=0"]


def run(algorithm: str, args: argparse.Namespace) -> dict[str, float]:
    overrides = [f"name=bench-{algorithm}", f"algorithm.name={algorithm}", f"rounds={args.rounds}",
                 f"trainer.warmup_steps={args.warmup_steps}", *budget(algorithm, args.rows_per_round, 8), *args.set]
    cfg = load_config(CONFIG, overrides)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign(cfg, run_dir)
        campaign.prepare()
        campaign.warm_start()
        before = campaign.evaluate()["eval/accuracy"]
        for r in range(1, cfg.rounds + 1):
            campaign.run_round(r)
        after = campaign.evaluate()["eval/accuracy"]
    return {"before": before, "after": after, "seconds": time.perf_counter() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", default="sft,grpo,mix")
    default = load_config(CONFIG)
    parser.add_argument("--rounds", type=int, default=default.rounds)
    parser.add_argument("--warmup-steps", type=int, default=default.trainer.warmup_steps)
    parser.add_argument("--rows-per-round", type=int, default=1024)
    parser.add_argument("--set", action="append", default=[], help="config override for every run, key=value")
    args = parser.parse_args()
    results = {}
    for algorithm in args.algorithms.split(","):
        results[algorithm] = run(algorithm, args)
        r = results[algorithm]
        print(f"{algorithm}: {r['before']:.3f} -> {r['after']:.3f} ({r['seconds']:.0f} s)", flush=True)
    print(f"\nwarm start {args.warmup_steps} SFT steps, then {args.rounds} rounds x {args.rows_per_round} rows "
          f"{' '.join(args.set)}; held-out greedy accuracy (200 distinct tasks)\n")
    print("| algorithm | after warm start | after rounds | seconds |\n| --- | --- | --- | --- |")
    for algorithm, r in results.items():
        print(f"| {algorithm} | {r['before']:.3f} | {r['after']:.3f} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
