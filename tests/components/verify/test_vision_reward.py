"""The ``vision`` reward: the whole response is the picture's answer, and nothing that only contains
it, lists several, or writes a number another way scores; chosen by name for the vision domain."""

from __future__ import annotations

import pytest

from rftflow.components.data.tasksets import Task
from rftflow.components.verify.vision import vision_answer


def _task(answer: str) -> Task:
    return Task("t", "How many shapes are in the picture?", "How many shapes are in the picture?", answer)


@pytest.mark.parametrize("response, answer", [
    ("3", "3"), (" 3\n", "3"), ("3.", "3"), ("03", "3"), ("3.0", "3"), ("+3", "3"),
    ("left", "left"), ("Left", "left"), (" LEFT. ", "left"), ("right", "right"), ("7", "7"),
])
def test_the_answer_alone_scores_one(response, answer):
    assert vision_answer(response, _task(answer)) == 1.0


@pytest.mark.parametrize("response, answer", [
    ("4", "3"), ("right", "left"), ("", "3"), ("", "left"), (" ", "left"), (".", "left"),
    # answers hedged or listed: a policy rewarded for containing the answer would learn to write them all
    ("3 4", "3"), ("1234", "3"), ("1, 2, 3, 4", "3"), ("3 or 4", "3"), ("left or right", "left"),
    ("leftright", "left"), ("left right", "right"), ("There are 3 shapes.", "3"), ("3 shapes", "3"),
    ("the answer is left", "left"),
    # numbers written some other way, or not numbers at all
    ("three", "3"), ("3e0", "3"), ("0x3", "3"), ("３", "3"), ("٣", "3"), ("3/1", "3"), ("nan", "3"), ("inf", "3"),
    ("3\x00", "3"), ("\u200b3", "3"), ("3..", "3"), ("-3", "3"),
    # long responses are not short answers, whatever they end with
    ("x" * 10_000 + " 3", "3"), ("9" * 100_000, "3"), (" " * 100 + "3", "3"),
])
def test_anything_else_scores_zero(response, answer):
    assert vision_answer(response, _task(answer)) == 0.0


def test_the_vision_domain_is_scored_by_its_reward_by_name():
    from rftflow.components.config import RewardConfig, TasksetConfig
    from rftflow.components.verify.rewards import make_rewards

    rewards = make_rewards(RewardConfig(function="exact_match", domains={"vision": "vision"}),
                           TasksetConfig(source="builtin:vision", domain="vision"))
    task = _task("3")
    assert rewards.reward_of(task)[0] == "vision"
    assert [float(s.value) for s in rewards.score_many(["3.0", "3 4", "3"], [task] * 3)] == [1.0, 0.0, 1.0]
    assert "vision ≥ 1" in rewards.accuracy_rule
