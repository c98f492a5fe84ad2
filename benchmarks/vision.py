"""The vision campaign's held-out accuracy after its warm start and after its GRPO rounds, paired by
task, and the anti-toy control: the trained policy with every picture blanked.

The pure ``Campaign`` of the config (prepare, warm start, rounds: what ``rftflow run`` computes,
without Prefect, MLflow and the checkpoints, which change no update), each held-out task answered
greedily after the warm start and after the rounds, then by the final policy with each picture
replaced by a white one of its size. Per task kind: accuracy after the warm start and after the
rounds, the paired difference (tasks gained and lost; exact McNemar p of the gain), the blanked
accuracy and the kind's chance (a policy that ignores the picture). One JSON line per seed.

    HOME=$(mktemp -d) python benchmarks/vision.py --seed 0
    python benchmarks/vision.py --seed 1 --set rounds=20
    python benchmarks/vision.py --seed 0 --at 40 --at 80   # also after rounds 40 and 80
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import rftflow.flows  # noqa: F401  (quiet defaults, before transformers draws a bar; imports no service)
import torch
from rftflow.components.campaign.promotion import mcnemar_p
from rftflow.components.campaign.stages import Campaign
from rftflow.components.data.images import blank_pictures
from rftflow.components.data.vision_tasks import chance
from rftflow.components.verify.rewards import is_correct


def solved(campaign: Campaign, tasks) -> list[bool]:
    """Whether the explorer's greedy answer to each task is correct (its own reward at its threshold)."""
    cfg = campaign.cfg
    scores = campaign.workflow.greedy_scores(campaign.engine, tasks, campaign.reward_fn, cfg.reward.function,
                                             cfg.eval.max_new_tokens)
    return [is_correct(s) for s in scores]


def paired(before: list[bool], after: list[bool]) -> dict:
    gained = sum(a and not b for b, a in zip(before, after))
    lost = sum(b and not a for b, a in zip(before, after))
    n = len(before)
    return {"tasks": n, "warm_start": round(sum(before) / n, 3), "rounds": round(sum(after) / n, 3),
            "gain": round((sum(after) - sum(before)) / n, 3), "gained": gained, "lost": lost,
            "mcnemar_p": float(f"{mcnemar_p(lost, gained):.2g}")}


def run(config: str, overrides: list[str], run_dir: Path, at: tuple[int, ...] = ()) -> dict:
    campaign = Campaign.from_config(config, run_dir, overrides)
    began = time.perf_counter()
    campaign.prepare()
    campaign.warm_start()
    warm_s, warm_steps = time.perf_counter() - began, campaign.trainer.steps
    tasks = campaign.splits.eval
    before = solved(campaign, tasks)
    began = time.perf_counter()
    on_the_way = {}  # held-out accuracy after the rounds of ``at`` (measured between rounds, off the clock)
    for round_no in range(1, campaign.cfg.rounds + 1):
        campaign.run_round(round_no)
        if round_no in at and round_no < campaign.cfg.rounds:
            paused = time.perf_counter()
            on_the_way[str(round_no)] = round(sum(solved(campaign, tasks)) / len(tasks), 3)
            began += time.perf_counter() - paused
    rounds_s = time.perf_counter() - began
    after = solved(campaign, tasks)
    blank = solved(campaign, [blank_pictures(t) for t in tasks])
    kinds = sorted({t.metadata["kind"] for t in tasks})
    params = campaign.cfg.taskset.params
    result = {"seed": campaign.cfg.seed, "rounds": campaign.cfg.rounds, "warm_start_steps": warm_steps,
              "all": {**paired(before, after), "blanked": round(sum(blank) / len(blank), 3)}}
    if on_the_way:
        result["all"]["after_round"] = on_the_way
    for kind in kinds:
        mine = [i for i, t in enumerate(tasks) if t.metadata["kind"] == kind]
        result[kind] = {**paired([before[i] for i in mine], [after[i] for i in mine]),
                        "blanked": round(sum(blank[i] for i in mine) / len(mine), 3), "chance": chance(kind, params)}
    result["all"]["chance"] = round(sum(result[k]["chance"] * result[k]["tasks"] for k in kinds) / len(tasks), 3)
    result |= {"warm_start_s": round(warm_s, 1), "rounds_s": round(rounds_s, 1), "threads": torch.get_num_threads()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="vision-tiny", help="A shipped config name or a YAML file.")
    parser.add_argument("--seed", type=int, action="append", help="Seeds (repeat; default 0).")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="An override for every run.")
    parser.add_argument("--at", type=int, action="append", default=[], metavar="ROUND",
                        help="Also measure held-out accuracy after this round (repeat).")
    args = parser.parse_args()
    for seed in args.seed or [0]:
        with tempfile.TemporaryDirectory() as run_dir:
            print(json.dumps(run(args.config, [*args.set, f"seed={seed}"], Path(run_dir), tuple(args.at))), flush=True)


if __name__ == "__main__":
    main()
