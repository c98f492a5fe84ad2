"""Campaigns scored by the rewards that need more than a string comparison: the code reward's
positive path (builtin:tiny, taught by a short warm start, writes programs that pass their tests in
the sandbox, and only right ones score 1) and a reward model (every row scored by the model, the
same scores as the model gives the pairs on its own). The judge's campaign runs against a real
vLLM server in tests/components/explore/test_server_engines.py, beside the server it shares."""

from __future__ import annotations

import ast
import copy
import json
import operator

import pytest
import torch

from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun

pytestmark = pytest.mark.slow  # two whole campaigns

# f(x) = x + 1 or x * 2, 30 inputs each: two answers a warm start of 60 steps teaches builtin:tiny
EXPRESSIONS = {"x+1": lambda v: v + 1, "x*2": lambda v: v * 2}
CODE_TASKS = [{"question": f"f(x)={expr} #{i}", "answer": f"    return {expr}\n", "domain": "code",
               "code_prompt": "def f(x):\n", "entry_point": "f", "tests": f"assert f({i}) == {fn(i)}\n"}
              for i in range(1, 31) for expr, fn in EXPRESSIONS.items()]
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def _value(node: ast.AST, x: int) -> int:
    """The value of an arithmetic expression of ``x`` and integers (``ValueError`` for anything else)."""
    if isinstance(node, ast.Name) and node.id == "x":
        return x
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left, x), _value(node.right, x))
    raise ValueError(ast.dump(node))


def _right(response: str, task: dict) -> bool:
    """Whether the response's first line returns the task's value at its test input (read, never run)."""
    x = int(task["question"].rsplit("#", 1)[1])
    try:
        (statement,) = ast.parse(response.split("\n")[0].strip()).body if response.strip() else [None]
        return isinstance(statement, ast.Return) and _value(statement.value, x) == EXPRESSIONS[
            task["question"].split("=")[1].split()[0]](x)
    except (SyntaxError, ValueError):
        return False


def test_the_code_reward_scores_programs_that_pass_in_a_campaign(tmp_path, default_config, small):
    source = tmp_path / "code.jsonl"
    source.write_text("".join(json.dumps(t) + "\n" for t in CODE_TASKS))
    run = CampaignRun(preflight(default_config, tmp_path / "run", [
        *small, f"taskset.source={source}", "taskset.eval_size=6", "taskset.prompt_template='{question}'",
        "reward.function=code", "reward.code.timeout_seconds=5", "explorer.max_new_tokens=20",
        "eval.max_new_tokens=20", "trainer.warmup_steps=60"]))
    summary = run.run()
    by_question = {t["question"]: t for t in CODE_TASKS}
    tasks = run.campaign.splits.by_id
    rows = run.campaign.store.read_kind("usual").select(["task_id", "response", "reward", "info"]).to_pylist()
    passed = [r for r in rows if r["reward"] == 1.0]
    assert passed, [r["response"] for r in rows]  # the positive path: programs ran in the sandbox and passed
    assert all(r["reward"] in (0.0, 1.0) for r in rows)
    for r in passed:  # and only right programs pass
        assert _right(r["response"], by_question[tasks[r["task_id"]].question]), r
    for r in rows:
        if r["reward"] == 0.0:
            assert json.loads(r["info"]).get("reward_reason"), r  # a failed program says why
    assert summary["eval_accuracy_after"] > 0  # held-out programs pass too


def _reward_model(tiny, path) -> None:
    """A sequence-classification model on builtin:tiny's configuration (random head, seed 0) at ``path``."""
    from transformers import AutoModelForSequenceClassification

    model, tokenizer = tiny
    config = copy.deepcopy(model.config)
    config.num_labels, config.pad_token_id = 1, tokenizer.pad_token_id
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def test_a_campaign_scored_by_a_reward_model_stores_the_models_scores(tmp_path, default_config, small, tiny):
    from rftflow.components.config import RewardModelConfig
    from rftflow.components.verify.reward_model import RewardModelReward

    _reward_model(tiny, tmp_path / "rm")
    run = CampaignRun(preflight(default_config, tmp_path / "run", [
        *small, "reward.function=reward_model", f"reward.reward_model={{path: '{tmp_path / 'rm'}', batch_size: 8}}"]))
    summary = run.run()
    rows = run.campaign.store.read_kind("usual").select(["round", "task_id", "response", "reward"]).to_pylist()
    assert len(rows) == 32 and len({r["reward"] for r in rows}) > 1 and all(0 < r["reward"] < 1 for r in rows)
    alone = RewardModelReward(RewardModelConfig(path=str(tmp_path / "rm"), batch_size=8))
    tasks = [run.campaign.splits.by_id[r["task_id"]] for r in rows]
    scores = [s.value for s in alone.score_many([r["response"] for r in rows], tasks)]
    assert [r["reward"] for r in rows] == pytest.approx(scores, abs=1e-6)
    last = [r["reward"] for r in rows if r["round"] == 2]
    assert summary["reward_mean_last_round"] == pytest.approx(sum(last) / len(last), abs=1e-6)
