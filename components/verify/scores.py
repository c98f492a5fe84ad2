"""A reward's verdict on one response."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Score:
    """``value`` in [0, 1], with ``reason`` saying why when there is something to say (a failed
    test); ``value`` None when the reward could not be computed (its sandbox, judge or model
    failed: ``reason`` says how): such a row is quarantined, never scored 0 or 1."""

    value: float | None
    reason: str | None = None


class RewardUnavailable(RuntimeError):
    """A reward's own infrastructure failed where no row can be quarantined instead (greedy
    evaluation); the message is one line."""
