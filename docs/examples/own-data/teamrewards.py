"""The team's own rewards (on PYTHONPATH; rftflow imports them by path: `teamrewards:correct`)."""

import re


def correct(response, task):
    """1.0 when the last number in the response is the gold answer, else 0.0."""
    numbers = re.findall(r"-?\d+", response)
    return float(bool(numbers) and numbers[-1] == task.answer.strip())


def brevity(response, task):
    """A penalty for rambling: 0 for an answer of a few characters, down to -1 at 40 or more."""
    return -min(1.0, len(response.strip()) / 40)


brevity.reward_range = (-1.0, 0.0)  # the values it may return; anything else quarantines the row
