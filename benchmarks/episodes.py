"""Multi-turn rollout: episodes/s stepping all live episodes together against one episode at a time.

The same engine (``hf``, builtin:tiny after a short warm start on binary-search games, so that it
plays) runs the same tasks of the built-in guess-a-number game both ways: batched (the
``multi_turn`` workflow: each turn one generation over every live episode) and one at a time (the
same workflow on one task, one episode, in a loop). Prints episodes/s of each, their ratio, the
mean model turns per episode, and the share of the batched run's wall time spent in the
environments' steps (all live episodes' steps of a turn run together, on threads).

    python benchmarks/episodes.py                      # 64 tasks x 4 episodes, 2 repeats
    python benchmarks/episodes.py --tasks 128 --repeat-times 8 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import rftflow.flows  # noqa: F401  (quiet service defaults)
from rftflow.components.campaign.stages import Campaign
from rftflow.components.explore.workflows import Sampling

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "guess-number.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--repeat-times", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of each way (the median is printed)")
    parser.add_argument("--warmup-steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(CONFIG, run_dir, [f"trainer.warmup_steps={args.warmup_steps}",
                                                          f"threads={args.threads}"])
        campaign.prepare()
        campaign.warm_start()
        workflow, engine = campaign.workflow, campaign.engine
        tasks = campaign.splits.train[:args.tasks]
        sampling = Sampling(max_new_tokens=campaign.cfg.explorer.max_new_tokens,
                            temperature=campaign.cfg.explorer.temperature)
        n = len(tasks) * args.repeat_times

        def batched() -> list:
            return [e for g in workflow.run(tasks, engine, n=args.repeat_times, sampling=sampling) for e in g]

        def one_at_a_time() -> list:
            return [workflow.run([t], engine, n=1, sampling=sampling)[0][0] for t in tasks
                    for _ in range(args.repeat_times)]

        results = {}
        for name, fn in (("batched", batched), ("one at a time", one_at_a_time)):
            times, env, episodes = [], [], []
            for r in range(args.repeats):
                torch.manual_seed(r)
                workflow.env_wall_seconds, start = 0.0, time.perf_counter()
                if name == "batched":
                    episodes = fn()
                    env.append(workflow.env_wall_seconds)
                else:
                    episodes = fn()
                times.append(time.perf_counter() - start)
            wall = statistics.median(times)
            results[name] = (n / wall, episodes, wall, statistics.median(env) if env else None)
        print(f"guess-number, builtin:tiny, {args.tasks} tasks x {args.repeat_times} episodes at temperature "
              f"{sampling.temperature:g}, {args.threads} thread(s), median of {args.repeats}")
        for name, (rate, episodes, wall, _) in results.items():
            turns = sum(e.model_turns for e in episodes) / len(episodes)
            print(f"  {name:14s} {rate:8.1f} episodes/s   {turns:.2f} model turns/episode   {wall:.2f} s")
        rate, episodes, wall, env = results["batched"]
        print(f"  batched / one at a time: {rate / results['one at a time'][0]:.1f}x")
        print(f"  share of the batched run's wall time in the environments' steps: {env / wall:.1%}")


if __name__ == "__main__":
    main()
