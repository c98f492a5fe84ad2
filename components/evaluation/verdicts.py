"""A reward's verdict on one response, and when it counts as correct. Rewards (``components/verify``)
make these; scoring, evaluation and promotion read them."""

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


class Graded(float):
    """A response's reward — the total, a float — that also says whether the response is correct
    (its task's own reward reached its threshold) and each term's value (``terms``, name → value).
    A float, so every consumer of rewards reads the total; accuracy reads ``is_correct``."""

    correct: bool
    terms: dict[str, float]

    def __new__(cls, total: float, correct: bool, terms: dict[str, float]):
        graded = super().__new__(cls, total)
        graded.correct, graded.terms = correct, terms
        return graded

    def __reduce__(self):
        return Graded, (float(self), self.correct, self.terms)


def is_correct(value: float) -> bool:
    """Whether a reward value counts as a correct response: its ``Graded.correct``; a plain value
    (an episode's return) when it is at least 1."""
    return value.correct if isinstance(value, Graded) else value >= 1.0
