"""Rewards a team might write, imported by path in the reward tests (``tests.components.verify.team_rewards:…``),
good and broken."""

import math
import os
import re
import time
from pathlib import Path

from rftflow.components.verify.scores import Score


def last_number(response, task):
    """1 when the last number in the response is the gold answer."""
    numbers = re.findall(r"-?\d+", response)
    return float(bool(numbers) and numbers[-1] == task.answer.strip())


def brevity(response, task):
    """0 for a short response, down to -1 for a long one."""
    return -min(1.0, len(response) / 40)


brevity.reward_range = (-1.0, 0.0)


def lengths(responses, tasks):  # batched: called once per batch
    return [min(1.0, len(r) / 10) for r in responses]


class Partial:
    """A class reward: made with options, scores a batch, closed at the end."""

    closed = []

    def __init__(self, credit=0.5):
        self.credit = credit

    def score_many(self, responses, tasks):
        return [Score(1.0) if r.strip() == t.answer else Score(self.credit, "partial")
                for r, t in zip(responses, tasks)]

    def close(self):
        Partial.closed.append(self)


def raises(response, task):
    if "boom" in response:
        return 1 / 0
    return 1.0


def nan(response, task):
    return math.nan if "nan" in response else 0.0


def too_big(response, task):
    return 2.0 if "big" in response else 1.0


def text(response, task):
    return "yes"


def hangs(response, task):
    """Stuck for good on two inputs; each stuck call first writes its process id to a file in
    ``$HANGS_PIDS`` (when set), so a test can see that process killed."""
    if os.environ.get("HANGS_PIDS") and ("(a+)+$" in task.question or "sleep" in response):
        (Path(os.environ["HANGS_PIDS"]) / f"{os.getpid()}-{len(response)}").write_text(str(os.getpid()))
    if "(a+)+$" in task.question:  # a hostile response against a backtracking pattern: no timeout in C code
        re.match(r"(a+)+$", response)
    if "sleep" in response:
        time.sleep(3600)
    return 1.0


def three(response, task, extra):
    return 1.0


NOT_CALLABLE = 3
