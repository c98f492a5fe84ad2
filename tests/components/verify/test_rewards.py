"""Reward functions: exact match, the dataset's verifier, math-verify on free-form answers; a team's own by
import path and its failures; weighted combinations; accuracy from the task's own reward."""

import logging
import re

import pytest

from rftflow.components.data.contracts import ContractBounds
from rftflow.components.data.tasksets import Task
from rftflow.components.config import RewardConfig, TasksetConfig
from rftflow.components.verify.check import check_round
from rftflow.components.verify.rewards import Rewards, check_rewards, is_correct, make_rewards
from tests.flows.processes import outliving

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


# rewards by import path -----------------------------------------------------------------------
TEAM = "tests.components.verify.team_rewards"
SUM = Task(task_id="s", question="23 + 45", prompt="23 + 45 =", answer="68")


def _rewards(**reward) -> "Rewards":
    return make_rewards(RewardConfig(**reward), TasksetConfig(source="tasks.jsonl"))


@pytest.mark.parametrize("path, message", [
    ("no_such_team.rewards:correct", r"reward 'no_such_team.rewards:correct': cannot import 'no_such_team.rewards' "
                                     r"\(ModuleNotFoundError: No module named 'no_such_team'; is its folder on "
                                     r"PYTHONPATH"),
    (f"{TEAM}:absent", rf"reward '{TEAM}:absent': module '{TEAM}' has no 'absent'"),
    (f"{TEAM}:three", r"takes \(response, task, extra\); a reward takes \(response, task\), \(responses, tasks\)"),
    (f"{TEAM}:NOT_CALLABLE", r"not a function or a class but int"),
])
def test_a_reward_that_cannot_be_used_fails_in_one_line_naming_its_path(path, message):
    with pytest.raises(ValueError, match=message) as failed:
        check_rewards(RewardConfig(function=path), {None: [SUM]})
    assert "\n" not in str(failed.value)


def test_a_reward_failing_on_a_sample_task_fails_the_check_and_options_reach_only_classes():
    with pytest.raises(ValueError, match=rf"sample task .*{TEAM}:raises raised ZeroDivisionError: division by zero"):
        check_rewards(RewardConfig(function=f"{TEAM}:raises"), {None: [Task("b", "q", "q", "boom")]})
    with pytest.raises(ValueError, match=r"a function takes no reward options \(got credit\)"):
        check_rewards(RewardConfig(function=f"{TEAM}:last_number", options={"credit": 1}), {None: [SUM]})
    with pytest.raises(ValueError, match=r"cannot be made with reward options \{'weight': 1\}"):
        check_rewards(RewardConfig(function=f"{TEAM}:Partial", options={"weight": 1}), {None: [SUM]})
    check_rewards(RewardConfig(function=f"{TEAM}:last_number"), {None: [SUM]})  # the gold answer scores: passes
    by_domain = RewardConfig(function="exact_match", domains={"code": f"{TEAM}:raises"})
    math, code = Task("m", "q", "q", "boom"), Task("c", "q", "q", "1", {"domain": "code"})
    check_rewards(by_domain, {None: [math, code]})  # called on a task of its domain only
    with pytest.raises(ValueError, match="raises raised ZeroDivisionError"):
        check_rewards(by_domain, {None: [math, Task("c", "q", "q", "boom", {"domain": "code"})]})


def test_preflight_refuses_a_reward_that_cannot_import_in_one_line(tmp_path):
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.config import ConfigError

    with pytest.raises(ConfigError, match=r"^reward 'teamless:correct': cannot import 'teamless'") as failed:
        preflight({"reward": {"function": "teamless:correct"}, "taskset": {"size": 50, "eval_size": 5}}, tmp_path / "r")
    assert "\n" not in str(failed.value)
    with pytest.raises(ConfigError, match=r"reward.function.*'teamless' is neither a built-in reward"):
        preflight({"reward": {"function": "teamless"}}, tmp_path / "r")


@pytest.mark.parametrize("path, response, reason", [
    ("raises", "boom", r"raises raised ZeroDivisionError: division by zero"),
    ("nan", "nan", r"nan returned nan"),
    ("too_big", "big", r"too_big returned 2, outside its reward_range \[0, 1\]"),
    ("text", "85", r"text returned str 'yes', not a number"),
])
def test_a_reward_that_raises_or_returns_nan_or_leaves_its_range_is_never_scored(path, response, reason):
    scores = _rewards(function=f"{TEAM}:{path}").score_many([response], [SUM])
    assert scores[0].value is None and re.search(reason, scores[0].reason)


def test_such_rows_are_quarantined_with_the_reason_and_the_others_kept():
    from tests.components.verify.rows import rollouts

    table, tasks = rollouts(["boom", "85", "boom 2", "7"], SUM)
    checked = check_round(table, tasks, _rewards(function=f"{TEAM}:raises"), "x", ContractBounds(), [], 0)
    reasons = checked.verdict.quarantined.column("reason").to_pylist()
    assert checked.verdict.counts == {"rows": 4, "accepted": 2, "quarantined": 2}
    assert reasons == [f"reward unavailable: {TEAM}:raises raised ZeroDivisionError: division by zero"] * 2
    from rftflow.components.data.contracts import ContractError, enforce

    with pytest.raises(ContractError, match=r"round 1 experiences: 2 of 4 rows .*reward unavailable: .*raises raised"):
        enforce(checked.verdict, 0.1, "round 1 experiences")  # repeated failures stop the round, as a bad sandbox's


def test_a_timed_out_call_is_killed_and_its_rows_quarantined_while_the_others_score(tmp_path, monkeypatch):
    monkeypatch.setenv("HANGS_PIDS", str(tmp_path))  # each stuck call leaves its process id here
    rewards = _rewards(function=f"{TEAM}:hangs", timeout_seconds=2, workers=2)
    hostile = Task("h", "(a+)+$", "(a+)+$", "1")
    try:
        scores = rewards.score_many(["fine", "a" * 40 + "!", "sleep", "fine"], [SUM, hostile, SUM, SUM])
        assert [s.value for s in scores] == [1.0, None, None, 1.0]
        assert scores[1].reason == f"{TEAM}:hangs timed out after 2 s (reward.timeout_seconds)"
        # both stuck calls' processes were killed (they would sleep an hour, backtrack for years), not waited for
        stuck = [int(f.read_text()) for f in tmp_path.iterdir()]
        assert len(stuck) == 2 and not outliving(set(stuck), 60), stuck  # killed: ended in milliseconds
        assert rewards.score_many(["fine"], [SUM])[0].value == 1.0  # a new process took the killed one's place
    finally:
        rewards.close()



def test_functions_batched_functions_and_classes_score_and_classes_are_closed():
    from tests.components.verify import team_rewards

    assert _rewards(function=f"{TEAM}:last_number")("so 23 + 45 = 68", SUM) == 1.0
    assert [s.value for s in _rewards(function=f"{TEAM}:lengths").score_many(["12345", "x" * 30], [SUM] * 2)] \
        == [0.5, 1.0]
    rewards = _rewards(function=f"{TEAM}:Partial", options={"credit": 0.25})
    scores = rewards.score_many(["68", "67"], [SUM] * 2)
    assert [(s.value, s.reason) for s in scores] == [(1.0, None), (0.25, "partial")]
    rewards.close()
    assert len(team_rewards.Partial.closed) == 1


# composition and correctness ---------------------------------------------------------------------
def test_combine_weighs_its_terms_and_accuracy_reads_the_task_reward_alone():
    rewards = _rewards(function=f"{TEAM}:last_number", combine=[
        {"reward": "task", "weight": 0.8}, {"reward": f"{TEAM}:brevity", "weight": 0.5},
        {"reward": "format", "weight": 0.1}], format={"pattern": r"\d+"})
    right_but_long, wrong_and_short = "the sum of 23 and 45 is 68", "67"
    long, short = [s.value for s in rewards.score_many([right_but_long, wrong_and_short], [SUM] * 2)]
    assert long == pytest.approx(0.8 * 1 + 0.5 * -(26 / 40) + 0.1 * 0) and is_correct(long)
    assert short == pytest.approx(0.8 * 0 + 0.5 * -(2 / 40) + 0.1 * 1) and not is_correct(short)
    assert long.terms == {"last_number": 1.0, "brevity": pytest.approx(-0.65), "format": 0.0}
    assert rewards.bounds == pytest.approx((0.8 * 0 + 0.5 * -1 + 0, 0.8 + 0 + 0.1))  # the declared ranges
    assert rewards.accuracy_rule == "share of responses with last_number ≥ 1"


def test_each_term_is_logged_beside_the_total_and_the_contract_bounds_follow_the_ranges():
    from tests.components.verify.rows import rollouts

    rewards = _rewards(function=f"{TEAM}:last_number", combine=[
        {"reward": "task", "weight": 1.0}, {"reward": f"{TEAM}:brevity", "weight": 1.0}])
    table, tasks = rollouts(["68", "the answer is 68, I am sure", "67", "x" * 50], SUM)
    checked = check_round(table, tasks, rewards, "x", ContractBounds(), [], 0)
    metrics = checked.metrics()
    assert metrics["reward/fn/last_number/mean"] == 0.5
    assert metrics["reward/fn/brevity/mean"] == pytest.approx(-(2 + 27 + 2 + 40) / 160)
    assert metrics["reward/mean"] == pytest.approx(0.5 - (2 + 27 + 2 + 40) / 160)
    assert checked.verdict.counts["quarantined"] == 0  # −1 is within [0 − 1, 1 + 0], not the contract's default [0, 1]


def test_the_deprecated_format_weight_is_a_case_of_combine(caplog, monkeypatch):
    from rftflow.components.verify import rewards as module

    monkeypatch.setattr(module, "_SAID", set())  # said once per process: this test's process may have said it
    old = _rewards(function="exact_match", format={"pattern": r"\d+", "weight": 0.2})
    new = _rewards(function="exact_match", format={"pattern": r"\d+"}, combine=[
        {"reward": "task", "weight": 0.8}, {"reward": "format", "weight": 0.2}])
    for response in ("68", "67", "sixty-eight"):
        assert old(response, SUM) == pytest.approx(new(response, SUM))
    assert old("67", SUM) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="reward.format.weight is a case of reward.combine"):
        RewardConfig(format={"pattern": "x", "weight": 0.2}, combine=[{"reward": "task", "weight": 1}])
    with caplog.at_level(logging.WARNING, logger="rftflow"):
        check_rewards(RewardConfig(function="exact_match", format={"pattern": r"\d+", "weight": 0.2}))
    assert "reward.format.weight is deprecated: it reads as reward.combine [{reward: task, weight: 0.8}, " \
           "{reward: format, weight: 0.2}]" in caplog.messages
    with pytest.raises(ValueError, match=r"a term named exact_match like a task's own reward"):
        RewardConfig(function="exact_match", combine=[{"reward": f"{TEAM}:exact_match", "weight": 1}])


def test_a_continuous_reward_states_its_accuracy_threshold():
    assert _rewards(function=f"{TEAM}:lengths").accuracy_rule == "share of responses with lengths ≥ 1"
    rewards = _rewards(function=f"{TEAM}:lengths", correct_at=0.5)
    assert rewards.accuracy_rule == "share of responses with lengths ≥ 0.5"
    assert [is_correct(s.value) for s in rewards.score_many(["1234", "12345"], [SUM] * 2)] == [False, True]
    assert make_rewards(RewardConfig(function="reward_model", reward_model={"path": "/nonexistent"}),
                        TasksetConfig(source="t.jsonl")).threshold("reward_model") == 0.5
