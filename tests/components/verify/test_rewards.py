"""Reward functions: exact match, the dataset's verifier, and math-verify on free-form answers."""

import pytest

from rftflow.components.data.tasksets import Task
from rftflow.components.config import RewardConfig, TasksetConfig
from rftflow.components.verify.rewards import make_rewards

TASK = Task(task_id="t", question="47 + 38", prompt="What is 47 + 38?", answer="85")


@pytest.mark.parametrize("response, reward", [
    ("47 + 38 = 85.", 1.0), ("The answer is 85", 1.0), ("\\boxed{85}", 1.0), ("85", 1.0),
    ("47 + 38 = 114.", 0.0), ("I cannot say.", 0.0), ("", 0.0),
    # the question restated: math-verify alone evaluates it to 85
    ("47 + 38", 0.0), ("The answer is 47 + 38", 0.0), ("$47 + 38$", 0.0), ("85 + 0", 0.0),
])
def test_math_verify_reads_the_final_answer_of_a_free_form_response(response, reward):
    assert make_rewards(RewardConfig(function="math_verify"), TasksetConfig(source="reasoning_gym:chain_sum"))(response, TASK) == reward


@pytest.mark.parametrize("gold, response, reward", [
    ("-7", "It is -7.", 1.0), ("1/2", "1/2", 1.0), ("1/2", "\\frac{1}{2}", 1.0), ("3.5", "3.50", 1.0),
    ("x + 1", "1 + x", 1.0), ("x + 1", "x + 2", 0.0),  # a gold expression still takes an equal expression
])
def test_math_verify_wants_a_number_for_a_number_and_an_expression_for_an_expression(gold, response, reward):
    task = Task(task_id="g", question="?", prompt="?", answer=gold)
    assert make_rewards(RewardConfig(function="math_verify"), TasksetConfig(source="reasoning_gym:chain_sum"))(response, task) == reward


def test_math_verify_works_off_the_main_thread():  # async mode verifies in a worker thread
    from concurrent.futures import ThreadPoolExecutor

    fn = make_rewards(RewardConfig(function="math_verify"), TasksetConfig(source="reasoning_gym:chain_sum"))
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(fn, "= 85", TASK).result() == 1.0


def test_exact_match_needs_the_answer_alone():
    fn = make_rewards(RewardConfig(function="exact_match"), TasksetConfig(source="tasks.jsonl"))
    assert fn(" 85 ", TASK) == 1.0 and fn("47 + 38 = 85", TASK) == 0.0
