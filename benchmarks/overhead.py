"""Where a campaign's round time goes: rollout and training compute against everything else.

Runs the real flow (``rft_campaign`` on the embedded Prefect API, MLflow on SQLite, the store on
``file://``) in this process, with timers around:

- compute: the rollout engine's ``generate`` (explore, evaluate), the reward function (verify) and
  ``Trainer.train`` (forward, backward, optimizer steps);
- each stage's ``Campaign`` method: what is not compute in it is the stage's own data work (Parquet
  in the store, contracts, Arrow tables, checkpoints);
- each step's ``CampaignRun.do``: what it adds is tracking (MLflow metrics and artifacts, the
  state file);
- the rounds' span: what no step covers is Prefect (task runs, their states and logs).

Rounds 2 to ``--rounds`` are counted (round 1 also pays one-time costs, such as reading the taskset,
and with ``task_runs: auto``, the default, it runs a task run per stage whatever comes after it).

Prints per step the seconds in each part and the non-compute share of the rounds' wall time, for
the default campaign (``configs/arith-mix.yaml``) and for TRL-sized rounds (``benchmarks/vs_trl.py``'s:
8 prompts x 8 responses, one optimizer step). Both start from a short warm start (``--warmup-steps``,
which is not counted) and run ``--rounds`` rounds.

    python benchmarks/overhead.py                      # both settings, 10 rounds each
    python benchmarks/overhead.py --setting default --rounds 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")  # not the task runs' INFO lines

import rftflow.flows  # noqa: E402,F401  (quiet service defaults)
from rftflow.components.campaign import stages as campaign_module
from rftflow.components.campaign.schedule import ROUND
from rftflow.components.campaign.stages import Campaign
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.campaign.run import CampaignRun
from rftflow.flows.orchestration import task_run_span
from rftflow.components.train.trainer import Trainer
from vs_trl import LR as TRL_LR, work as trl_work  # benchmarks/ is on sys.path when a script in it runs

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "arith-mix.yaml"
SETTINGS = {
    "default": [],
    "trl-sized": [*trl_work(), f"trainer.lr={TRL_LR}", "explorer.max_new_tokens=8"],
}
STEPS_IN_ROUNDS = (*(s.value for s in ROUND), "evaluate", "checkpoint")
FIRST_ROUND = 2  # round 1 also pays one-time costs (the taskset read into memory): not counted


class Timers:
    """Seconds per (step, part), and each round step's wrapper interval."""

    def __init__(self):
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.count: dict[str, int] = defaultdict(int)
        self.step: str | None = None
        self.intervals: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.step is not None:
                self.seconds[self.step][name] += time.perf_counter() - start

    def patch(self, monkey: contextlib.ExitStack) -> None:
        """Wrap the compute calls, the stage methods and the step wrapper (undone when ``monkey`` closes)."""
        def wrap(owner, attr, around):
            original = getattr(owner, attr)
            setattr(owner, attr, around(original))
            monkey.callback(setattr, owner, attr, original)

        def compute(name):
            def around(fn):
                def timed(*a, **k):
                    with self.part(name):
                        return fn(*a, **k)
                return timed
            return around

        wrap(HFRolloutEngine, "generate", compute("generate"))
        wrap(Trainer, "train", compute("train"))

        def reward_factory(make):
            def made(*a, **k):
                rewards = make(*a, **k)
                rewards.score_many = compute("reward")(rewards.score_many)  # the campaign scores through it
                return rewards
            return made
        wrap(campaign_module, "campaign_rewards", reward_factory)

        for step in STEPS_IN_ROUNDS:
            def around(fn, step=step):
                def timed(*a, **k):
                    with self.part("stage"):
                        return fn(*a, **k)
                return timed
            wrap(Campaign, step, around)

        def stepped(fn):
            def timed(run, planned):
                name, round_no = planned.step.value, planned.round
                if name not in STEPS_IN_ROUNDS or round_no < FIRST_ROUND:
                    return fn(run, planned)
                self.step, start = name, time.perf_counter()
                try:
                    with self.part("step"):
                        return fn(run, planned)
                finally:
                    self.intervals.append((start, time.perf_counter()))
                    self.count[name] += 1
                    self.step = None
            return timed
        wrap(CampaignRun, "do", stepped)  # every step goes through it: the stage and its tracking


def measure(setting: str, args: argparse.Namespace) -> None:
    from rftflow.flows.campaign import rft_campaign
    from rftflow.flows.prefect_api import embedded_prefect_api

    overrides = [f"name=overhead-{setting}", f"rounds={args.rounds}", f"trainer.warmup_steps={args.warmup_steps}",
                 "promotion.after_campaign=false", *SETTINGS[setting], *args.set]
    timers = Timers()
    with tempfile.TemporaryDirectory() as run_dir, contextlib.ExitStack() as monkey, embedded_prefect_api():
        timers.patch(monkey)
        state = rft_campaign(str(CONFIG), run_dir, overrides, show_progress=False, return_state=True)
        if not state.is_completed():
            raise SystemExit(f"{setting}: the campaign did not finish: {state.message}")
        summary = state.result()
        task_runs = task_run_span(summary["task_runs"], summary["rounds_per_task_run"])
    span = timers.intervals[-1][1] - timers.intervals[0][0]
    covered = sum(end - start for start, end in timers.intervals)
    rows, totals = [], defaultdict(float)
    for step in STEPS_IN_ROUNDS:
        parts = timers.seconds.get(step)
        if not parts:
            continue
        compute = parts["generate"] + parts["train"] + parts["reward"]
        data = parts["stage"] - compute
        tracking = parts["step"] - parts["stage"]
        rows.append((step, timers.count[step], parts["step"], compute, data, tracking))
        for key, value in (("compute", compute), ("data", data), ("tracking", tracking)):
            totals[key] += value
    prefect = span - covered
    counted = args.rounds - FIRST_ROUND + 1
    print(f"\n{setting}: rounds {FIRST_ROUND}-{args.rounds}, {span:.1f} s from round {FIRST_ROUND}'s explore to the "
          f"last step ({span / counted:.2f} s a round), a Prefect task run per {task_runs}; {' '.join(overrides)}\n")
    print("| step | runs | wall s | compute s | store, contracts, other s | MLflow + state s | non-compute |\n"
          "| --- | --- | --- | --- | --- | --- | --- |")
    for step, n, wall, compute, data, tracking in rows:
        print(f"| {step} | {n} | {wall:.2f} | {compute:.2f} | {data:.2f} | {tracking:.2f} | "
              f"{(wall - compute) / wall:.1%} |")
    print(f"| Prefect and the flow (between steps) | | {prefect:.2f} | | | | 100% |")
    orchestration = prefect + totals["tracking"]
    print(f"\n{setting}: non-compute {1 - totals['compute'] / span:.1%} of the rounds' wall time: "
          f"orchestration (Prefect {prefect / span:.1%} + MLflow and state {totals['tracking'] / span:.1%}) "
          f"{orchestration / span:.1%}, store, contracts and other data work {totals['data'] / span:.1%}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", choices=(*SETTINGS, "both"), default="both")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup-steps", type=int, default=300)
    parser.add_argument("--set", action="append", default=[], help="config override, key=value")
    args = parser.parse_args()
    for setting in SETTINGS if args.setting == "both" else (args.setting,):
        measure(setting, args)


if __name__ == "__main__":
    main()
