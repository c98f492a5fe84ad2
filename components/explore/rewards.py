"""Reward functions: response text + task → a score in [0, 1].

- ``score_answer``: the reasoning-gym dataset's own verifier (``Dataset.score_answer``); for file
  tasksets, which have no verifier, exact match.
- ``exact_match``: 1.0 if the stripped response equals the stripped gold answer, else 0.0.
"""

from __future__ import annotations

from collections.abc import Callable

from components.data.tasksets import REASONING_GYM_PREFIX, Task

RewardFn = Callable[[str, Task], float]


def exact_match(response: str, task: Task) -> float:
    return float(response.strip() == task.answer.strip())


def make_reward_fn(name: str, taskset_source: str) -> RewardFn:
    """The reward function ``name`` for tasks from ``taskset_source``."""
    if name == "exact_match":
        return exact_match
    if name == "score_answer":
        if not taskset_source.startswith(REASONING_GYM_PREFIX):
            return exact_match
        import reasoning_gym

        verifier = reasoning_gym.get_score_answer_fn(taskset_source[len(REASONING_GYM_PREFIX):])
        return lambda response, task: float(verifier(response.strip(), task.entry))
    raise ValueError(f"unknown reward function {name!r}; known: score_answer, exact_match")
