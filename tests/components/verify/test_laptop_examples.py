"""The judge and reward-model examples of the docs (docs/examples/judge, docs/examples/reward-model)
run on a laptop: a local OpenAI-compatible judge scores through the `judge` reward, a small reward
model built by the example's script scores through the `reward_model` reward, correct at 0.5."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rftflow.components.config import RewardConfig, TasksetConfig
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.rewards import is_correct, make_rewards

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
TASK = Task("t", "Ann has 23 pens and buys 4 more. How many pens?", "Ann has 23 pens and buys 4 more. How many pens? =",
            "27")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_local_judge_grades_through_the_judge_reward():
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "judge" / "judge_server.py"), str(port)])
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        rewards = make_rewards(RewardConfig(function="judge", judge={
            "base_url": f"http://127.0.0.1:{port}", "model": "local-judge", "retries": 0}),
            TasksetConfig(source="t.csv"))
        try:
            scores = rewards.score_many(["It is 27.", "26", "I do not know\nmaybe 27"], [TASK] * 3)
        finally:
            rewards.close()
        assert [s.value for s in scores] == [1.0, 0.0, 1.0]
        assert [is_correct(s.value) for s in scores] == [True, False, True]
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow  # trains the example's classifier, 300 steps
def test_the_example_reward_model_scores_and_counts_correct_at_its_decision_boundary(tmp_path):
    script = EXAMPLES / "reward-model" / "make_reward_model.py"
    made = subprocess.run([sys.executable, str(script), str(tmp_path / "rm"),
                           "300"], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]
    rewards = make_rewards(RewardConfig(function="reward_model", reward_model={"path": str(tmp_path / "rm")}),
                           TasksetConfig(source="t.csv"))
    try:
        right, wrong = [s.value for s in rewards.score_many(["27", "23"], [TASK] * 2)]
    finally:
        rewards.close()
    assert 0 < wrong < right < 1  # a sigmoid that never reaches 1: a copied 23 scores lower
    assert rewards.accuracy_rule == "share of responses with reward_model ≥ 0.5"
    assert is_correct(right) == (right >= 0.5) and is_correct(wrong) == (wrong >= 0.5)
