"""What ``rftflow run`` prints on stderr when stdout is not a terminal (a log file, a scheduler): a
plain line at each phase's start and end and one every ``PLAIN_EVERY_SECONDS`` in between, each
with the step, the loss or reward, the last ``warmup_until`` check and the time left; the warm
start's time left is an upper bound where ``trainer.warmup_until`` can end it sooner. Driven by a
clock the test moves, on the campaign config as loaded."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from rftflow.components.config import load_config
from rftflow.flows.progress import CampaignProgress, Pace, duration, eta_text


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _plain(cfg, clock) -> tuple[CampaignProgress, io.StringIO]:
    out = io.StringIO()
    progress = CampaignProgress(cfg, console=Console(file=out, force_terminal=False, width=200), clock=clock)
    assert progress.plain
    return progress, out


def test_the_warm_start_prints_a_line_every_30_seconds_with_its_step_loss_check_and_an_upper_bound(default_config,
                                                                                                 small):
    cfg = load_config(default_config, [*small, "trainer.warmup_steps=100", "trainer.warmup_until=0.9",
                                       "trainer.warmup_check_every=10"])
    clock = Clock()
    progress, out = _plain(cfg, clock)
    for step in range(1, 101):  # 2 s a step: 200 s in all
        clock.now += 2.0
        metrics = {"loss/sft": 1.0 / step, **({"warmup/check_accuracy": step / 200} if step % 10 == 0 else {})}
        progress.warmup(step, metrics)
    lines = out.getvalue().splitlines()
    steps = [int(re.search(r"progress warm start (\d+)/100", line).group(1)) for line in lines]
    # the first step, then one a 30 s (15 steps), and the last
    assert steps == [1, 16, 31, 46, 61, 76, 91, 100], lines
    assert "eta" not in lines[0]  # no pace yet after one step
    # 84 steps left at 2 s a step: at most (warmup_until may end it sooner), with the last check
    assert lines[1].endswith("progress warm start 16/100: sft loss 0.062, check 0.050, eta ≤ 3 min (32 s)"), lines[1]
    assert lines[-2].endswith("warm start 91/100: sft loss 0.011, check 0.450, eta ≤ 18 s (182 s)"), lines[-2]
    assert lines[-1].endswith("warm start 100/100: sft loss 0.010, check 0.500 (200 s)"), lines[-1]  # done: no eta


def test_without_warmup_until_the_warm_start_eta_is_not_a_bound_and_rounds_show_the_campaign_eta(default_config,
                                                                                                 small):
    cfg = load_config(default_config, [*small, "trainer.warmup_steps=10", "rounds=20"])
    clock = Clock()
    progress, out = _plain(cfg, clock)
    for step in range(1, 11):
        clock.now += 5.0
        progress.warmup(step, {"loss/sft": 0.5})
    progress.start_rounds(0.25, done=4)  # a resumed campaign: rounds 1-4 were an earlier attempt's
    for round_no in range(5, 21):
        clock.now += 10.0
        progress.round_done(round_no, reward=0.5, accuracy=0.3)
    lines = out.getvalue().splitlines()
    warm = [line.split(" ", 1)[1] for line in lines if "warm start" in line]
    assert warm == ["progress warm start 1/10: sft loss 0.500 (5 s)",
                    "progress warm start 7/10: sft loss 0.500, eta 15 s (35 s)",  # 3 steps of 5 s, no bound
                    "progress warm start 10/10: sft loss 0.500 (50 s)"], warm
    rounds = [line.split(" ", 1)[1] for line in lines if " progress round" in line]
    # a resumed campaign: rounds 1-4 were an earlier attempt's, the pace is this attempt's (10 s a round)
    assert rounds[0] == "progress rounds 4/20: acc 0.250 (50 s)"
    assert rounds[1] == "progress round 7/20: reward 0.500  acc 0.300  eta 2 min (80 s)"  # 13 rounds left
    assert rounds[-2] == "progress round 19/20: reward 0.500  acc 0.300  eta 10 s (200 s)"
    assert rounds[-1] == "progress round 20/20: reward 0.500  acc 0.300 (210 s)"  # the end: no eta


def test_pace_counts_only_this_attempts_units_and_eta_text_reads_as_people_do():
    clock = Clock()
    pace = Pace(50, clock)
    pace.update(10)  # done by an earlier attempt
    assert pace.seconds_left() is None
    clock.now += 30.0
    pace.update(13)  # 3 units in 30 s
    assert pace.seconds_left() == pytest.approx(370.0)
    assert duration(42) == "42 s" and duration(370) == "6 min" and duration(3 * 3600 + 300) == "3 h 05 min"
    assert eta_text(None) is None and eta_text(370, upper_bound=True) == "≤ 6 min"
    assert re.fullmatch(r"6 min, until \d\d:\d\d UTC", eta_text(370, clock=True))
