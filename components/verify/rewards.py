"""Reward functions: response text + task → a score in [0, 1].

- ``score_answer``: the reasoning-gym dataset's own verifier (``Dataset.score_answer``); for file
  tasksets, which have no verifier, exact match.
- ``exact_match``: 1.0 if the stripped response equals the stripped gold answer, else 0.0.
- ``env_return``: an episode's return in its environment (``scoring.reward_of`` sums its step rewards).
- ``math_verify``: 1.0 if the final answer of a free-form response ("47 + 38 = 85.", "\\boxed{85}")
  equals the gold answer mathematically (the ``math-verify`` package: ``verify(parse(gold),
  parse(response))``), else 0.0. For chatty instruct models. When the gold answer is a number,
  the response's final answer must be a number too: math-verify evaluates expressions, so
  "47 + 38" would equal 85 and restating the question would score 1 (a policy learns that in a
  few rounds).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from rftflow.components.data.tasksets import REASONING_GYM_PREFIX, Task

RewardFn = Callable[[str, Task], float]


def exact_match(response: str, task: Task) -> float:
    return float(response.strip() == task.answer.strip())


# math-verify warns on every call that its timeouts are off; they are, on purpose (below)
logging.getLogger("math_verify").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> list:
    """math-verify's reading of ``text`` (a gold answer is read once for its whole group). No
    timeouts: math-verify's use signal.alarm, which only works in the main thread."""
    from math_verify import parse

    return parse(text, parsing_timeout=None)


def _number(parsed: list) -> bool:
    """math-verify's reading is a number as written: a sympy number ("85", "-7", "3.5",
    "\\frac{1}{2}") or a fraction of integers ("1/2"), not an expression to evaluate ("47 + 38")."""
    return bool(getattr(parsed[0], "is_Number", False)) or re.fullmatch(r"-?\d+\s*/\s*\d+", str(parsed[-1]).strip()) is not None


def math_verify(response: str, task: Task) -> float:
    from math_verify import verify

    answer, gold = _parsed(response), _parsed(task.answer)
    if not answer or (gold and _number(gold) and not _number(answer)):
        return 0.0
    return float(verify(gold, answer, timeout_seconds=None))


def make_reward_fn(name: str, taskset_source: str) -> RewardFn:
    """The reward function ``name`` for tasks from ``taskset_source``."""
    if name == "exact_match":
        return exact_match
    if name == "math_verify":
        return math_verify
    if name == "env_return":  # scored from the episode's step rewards (``scoring.reward_of``), not its text
        return lambda response, task: 0.0
    if name == "score_answer":
        if not taskset_source.startswith(REASONING_GYM_PREFIX):
            return exact_match
        import reasoning_gym

        verifier = reasoning_gym.get_score_answer_fn(taskset_source[len(REASONING_GYM_PREFIX):])
        return lambda response, task: float(verifier(response.strip(), task.entry))
    raise ValueError(f"unknown reward function {name!r}; known: score_answer, exact_match, math_verify")
