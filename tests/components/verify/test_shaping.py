"""Length shaping: DAPO's overlong penalty and Kimi k1.5's length reward on hand-computed values,
and both added to a round's rows (each logged as its own term; accuracy never reads them)."""

import pytest

from rftflow.components.config import CampaignConfig, RewardConfig, ShapingConfig, TasksetConfig
from rftflow.components.data.contracts import ContractBounds
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.check import check_round
from rftflow.components.verify.rewards import is_correct, make_rewards
from rftflow.components.verify.shaping import length_rewards, overlong_penalty, shaping_range
from tests.components.verify.rows import rollouts


@pytest.mark.parametrize("length, penalty", [
    (10, 0.0), (15, 0.0),  # within L_max − L_cache = 20 − 5
    (16, -0.2), (18, -0.6), (20, -1.0),  # (15 − |y|) / 5 in the last 5 tokens
    (21, -1.0), (400, -1.0),  # past L_max
])
def test_dapo_overlong_penalty(length, penalty):
    assert overlong_penalty(length, max_tokens=20, cache_tokens=5) == pytest.approx(penalty)


def test_kimi_length_reward_within_each_group():
    lengths = [10, 20, 30, 10, 7, 7]
    groups = ["g", "g", "g", "g", "h", "h"]
    correct = [True, True, False, False, True, False]
    # g: min 10, max 30, λ = 0.5 − (len − 10) / 20 → 0.5, 0, −0.5, 0.5; h: one length, no signal
    assert length_rewards(lengths, groups, correct) == pytest.approx([0.5, 0.0, -0.5, 0.0, 0.0, 0.0])


def test_shaping_is_added_to_each_row_and_logged_but_accuracy_reads_the_task_reward():
    shaping = {"overlong": {"cache_tokens": 4, "weight": 1.0}, "length": {"weight": 0.1}}
    cfg = CampaignConfig(reward={"function": "exact_match", "shaping": shaping}, explorer={"max_new_tokens": 8})
    rewards = make_rewards(cfg.reward, TasksetConfig(source="t.jsonl"), max_new_tokens=cfg.explorer.max_new_tokens)
    task = Task("s", "q", "q", "68")
    table, tasks = rollouts(["68", "68     ", "6", "67   67"], task)  # 2, 7, 1, 7 tokens of a budget of 8
    checked = check_round(table, tasks, rewards, "exact_match", ContractBounds(), [], 0)
    overlong = [0.0, (4 - 7) / 4, 0.0, (4 - 7) / 4]  # L_max 8, L_cache 4
    # lengths 2, 7, 1, 7 (min 1, max 7): λ = 0.5 − (len − 1) / 6; correct rows 1 and 2
    length = [0.5 - 1 / 6, 0.5 - 1.0, min(0.0, 0.5), min(0.0, 0.5 - 1.0)]
    task_reward = [1.0, 1.0, 0.0, 0.0]  # exact_match strips "68     "
    expected = [r + o + 0.1 * n for r, o, n in zip(task_reward, overlong, length)]
    assert checked.scored.column("reward").to_pylist() == pytest.approx(expected)
    assert checked.verdict.counts["quarantined"] == 0  # the bounds took the shaping's range: [0 − 1 − 0.05, 1 + 0.05]
    metrics = checked.metrics()
    assert metrics["reward/fn/overlong/mean"] == pytest.approx(sum(overlong) / 4)
    assert metrics["reward/fn/length/mean"] == pytest.approx(sum(length) / 4)
    assert metrics["reward/fn/exact_match/mean"] == 0.5
    assert shaping_range(ShapingConfig(**shaping)) == (-1.05, 0.05)
    assert [is_correct(rewards(r, task)) for r in ("68", "6")] == [True, False]  # evaluation: never shaped


def test_shaping_is_off_by_default_and_its_budget_must_leave_room():
    assert RewardConfig().shaping.overlong is None and RewardConfig().shaping.length is None
    with pytest.raises(ValueError, match="cache_tokens 16 must be below its max_tokens 16"):
        CampaignConfig(reward={"shaping": {"overlong": {"cache_tokens": 16}}}, explorer={"max_new_tokens": 16})
