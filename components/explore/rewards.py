"""Reward functions: response text + task → a score in [0, 1].

- ``score_answer``: the reasoning-gym dataset's own verifier (``Dataset.score_answer``); for file
  tasksets, which have no verifier, exact match.
- ``exact_match``: 1.0 if the stripped response equals the stripped gold answer, else 0.0.
- ``math_verify``: 1.0 if the final answer of a free-form response ("47 + 38 = 85.", "\\boxed{85}")
  equals the gold answer mathematically (the ``math-verify`` package: ``verify(parse(gold),
  parse(response))``), else 0.0. For chatty instruct models.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from components.data.tasksets import REASONING_GYM_PREFIX, Task

RewardFn = Callable[[str, Task], float]


def exact_match(response: str, task: Task) -> float:
    return float(response.strip() == task.answer.strip())


# math-verify warns on every call that its timeouts are off; they are, on purpose (below)
logging.getLogger("math_verify").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> list:
    """math-verify's reading of ``text``; a gold answer is parsed once for its whole group. No
    timeouts: math-verify's use signal.alarm, which only works in the main thread."""
    from math_verify import parse

    return parse(text, parsing_timeout=None)


def math_verify(response: str, task: Task) -> float:
    from math_verify import parse, verify

    answer = parse(response, parsing_timeout=None)
    return float(bool(answer) and verify(_parsed(task.answer), answer, timeout_seconds=None))


def make_reward_fn(name: str, taskset_source: str) -> RewardFn:
    """The reward function ``name`` for tasks from ``taskset_source``."""
    if name == "exact_match":
        return exact_match
    if name == "math_verify":
        return math_verify
    if name == "score_answer":
        if not taskset_source.startswith(REASONING_GYM_PREFIX):
            return exact_match
        import reasoning_gym

        verifier = reasoning_gym.get_score_answer_fn(taskset_source[len(REASONING_GYM_PREFIX):])
        return lambda response, task: float(verifier(response.strip(), task.entry))
    raise ValueError(f"unknown reward function {name!r}; known: score_answer, exact_match, math_verify")
