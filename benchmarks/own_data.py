"""The "Train on your data" walkthrough's campaign (docs/examples/own-data), per seed, as a team runs
it: the example's folder copied outside the repository, its problems file made, its reward module
only on PYTHONPATH, ``rftflow run campaign.yaml --set seed=N``. Then both ends of the rounds — the
checkpoint after the warm start and the last one (the registered weights) — are scored on the same
held-out tasks with the team's reward, paired by task: accuracy before and after, tasks only one of them solves,
and the one-sided exact McNemar p-value. Prints a markdown table (docs/benchmarks.md).

    nice -n 5 python benchmarks/own_data.py --seeds 0 1 2 --jobs 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "own-data"


def campaign(seed: int, work: Path, threads: int, sets: list[str]) -> dict:
    """One seed's campaign in its own folder, and its wall seconds."""
    folder = work / f"seed{seed}"
    shutil.copytree(EXAMPLE, folder)
    # the team's folder first on PYTHONPATH; entries already there stay (rftflow from a checkout, say)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HOME": str(folder / "home")}
    subprocess.run([sys.executable, "make_problems.py"], cwd=folder, env=env, check=True, capture_output=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "rftflow.flows.cli", "run", "campaign.yaml", "--set", f"seed={seed}",
                           "--set", f"threads={threads}", *(a for s in sets for a in ("--set", s)),
                           "--run-dir", "runs/word-problems", "--no-progress"],
                          cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: exit {done.returncode} (its folder kept: {folder})\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return {"seed": seed, "folder": folder, "wall": time.monotonic() - started, "sets": sets}


def paired(result: dict) -> dict:
    """The warm-started and the final model on the same held-out tasks, with the team's reward."""
    folder = result["folder"]
    sys.path.insert(0, str(folder))
    from rftflow.components.buffer.layout import open_run_store
    from rftflow.components.buffer.weights import WeightStore
    from rftflow.components.campaign.bench import eval_engine
    from rftflow.components.campaign.promotion import mcnemar_p
    from rftflow.components.config import load_config
    from rftflow.components.data.tasksets import load_tasks
    from rftflow.components.explore.workflows import make_workflow
    from rftflow.components.verify.rewards import campaign_rewards, is_correct

    cfg = load_config(folder / "campaign.yaml", [f"seed={result['seed']}", *result["sets"]])
    run_dir = folder / "runs" / "word-problems"
    tasks = load_tasks(cfg.taskset, cfg.seed, cfg.contracts).held_out
    rewards = campaign_rewards(cfg)
    store = WeightStore(open_run_store(cfg.storage, run_dir), cfg.name)

    def solved(ref: str) -> list[bool]:
        engine = eval_engine(ref, store, f"sqlite:///{run_dir / 'mlflow.db'}", cfg)
        workflow = make_workflow(cfg, engine.tokenizer, reward_fn=rewards)
        return [is_correct(s) for s in workflow.greedy_scores(engine, tasks, rewards, cfg.reward.function,
                                                              cfg.eval.max_new_tokens)]

    # weight version 1: after the warm start; the latest: after the last round (the registered weights)
    before, after = solved("checkpoint:1"), solved("checkpoint:latest")
    only_before = sum(b and not a for b, a in zip(before, after))
    only_after = sum(a and not b for b, a in zip(before, after))
    return {"tasks": len(tasks), "before": sum(before) / len(tasks), "after": sum(after) / len(tasks),
            "only_before": only_before, "only_after": only_after, "p": mcnemar_p(only_before, only_after)}


def report(results: list[dict]) -> None:
    print("| seed | held-out tasks | accuracy after the warm start → after the rounds | gain | solved only "
          "before / only after | McNemar p | campaign wall |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for result in results:
        row = paired(result)
        print(f"| {result['seed']} | {row['tasks']} | {row['before']:.3f} → {row['after']:.3f} | "
              f"{row['after'] - row['before']:+.3f} | {row['only_before']} / {row['only_after']} | "
              f"{row['p']:.2g} | {result['wall']:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="campaigns at once")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each campaign")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a config override (smoke sizes)")
    parser.add_argument("--work", help="the folder the seeds run in, kept (default: a temporary one, removed after)")
    args = parser.parse_args()
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="own-data-"))
    with ThreadPoolExecutor(args.jobs) as pool:  # a failed seed leaves the folders for a look
        results = list(pool.map(lambda s: campaign(s, work, args.threads, args.sets), args.seeds))
    report(results)
    if not args.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
