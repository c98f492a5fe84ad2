"""A mixture of tasksets in one campaign: each round keeps the parts' weights, each part has its
own held-out split, reward and metrics, and promotion checks every part."""

from __future__ import annotations

from collections import Counter

import pytest

from rftflow.components.campaign.preflight import ConfigError, preflight
from rftflow.components.campaign.promotion import Decision, guard_regressions
from rftflow.components.campaign.run import CampaignRun
from tests.components.conftest import write_code_tasks


def _mixture(tmp_path) -> list[str]:
    code = write_code_tasks(tmp_path / "code.jsonl")
    return ["mixture=[{name: arith, weight: 3, taskset: {source: 'reasoning_gym:chain_sum', eval_size: 6}}, "
            f"{{name: code, weight: 1, reward: code, taskset: {{source: '{code}', prompt_template: '{{question}}', "
            "eval_size: 4, domain: code}}]",
            "reward.code.timeout_seconds=5", "promotion.min_accuracy=0", "rounds=2"]


def test_a_mixture_keeps_its_weights_and_reports_each_taskset(tmp_path, default_config, small):
    run = CampaignRun(preflight(default_config, tmp_path / "run", [*small, *_mixture(tmp_path)]))
    summary = run.run()
    campaign = run.campaign
    parts = Counter((r, campaign.splits.by_id[t].metadata["taskset"]) for r, t in zip(
        *campaign.store.read_kind("usual").select(["round", "task_id"]).to_pydict().values()))
    # 4 tasks a round split 3:1, 4 responses each, every round
    assert parts == {(1, "arith"): 12, (1, "code"): 4, (2, "arith"): 12, (2, "code"): 4}
    assert Counter(t.metadata["taskset"] for t in campaign.splits.eval) == {"arith": 6, "code": 4}
    client, run_id = run.tracker.client, run.tracker.run_id
    for metric in ("reward/arith/mean", "reward/code/mean"):
        assert [m.step for m in client.get_metric_history(run_id, metric)] == [1, 2]
    arith = client.get_metric_history(run_id, "accuracy/arith/held_out")[-1].value
    code = client.get_metric_history(run_id, "accuracy/code/held_out")[-1].value
    overall = client.get_metric_history(run_id, "accuracy/held_out")[-1].value
    assert overall == pytest.approx((6 * arith + 4 * code) / 10)
    version = client.get_model_version(campaign.cfg.tracking.registered_model, "1")
    assert {"promotion.accuracy.arith", "promotion.accuracy.code"} <= set(version.tags), version.tags
    assert summary["eval_accuracy_after"] == pytest.approx(overall)
    from rftflow.flows.monitor import UIMonitor  # the Prefect round table's rows (no flow run: not written)

    rows = {row["round"]: row for row in UIMonitor(run, None).rows()}
    assert set(rows) == {0, 1, 2} and rows[2]["reward code"] != "" and rows[2]["accuracy arith"] != ""


def test_a_part_that_regresses_blocks_a_promotion_the_overall_result_would_give():
    won = Decision("m", "2", "1", 0.8, 0.6, 30, 2, 1e-6, True, "accuracy 0.800 vs champion v1 0.600")
    parts = ["a"] * 8 + ["b"] * 2
    challenger = [True] * 8 + [False, False]
    champion = [False] * 4 + [True] * 4 + [True, True]
    blocked = guard_regressions(won, parts, challenger, champion, max_regression=0.05)
    assert not blocked.promoted and blocked.tasksets == {"a": (1.0, 0.5), "b": (0.0, 1.0)}
    assert blocked.reason.startswith("regresses on taskset b 0.000 vs 1.000 (more than promotion.max_regression 0.05)")
    kept = guard_regressions(won, parts, challenger, champion, max_regression=1.0)
    assert kept.promoted and kept.reason == won.reason


def test_mixture_parts_are_checked_before_any_work(tmp_path, default_config, small):
    with pytest.raises(ConfigError, match=r"mixture part missing: taskset file not found: "):
        preflight(default_config, tmp_path / "a", [*small, "mixture=[{name: missing, weight: 1, taskset: "
                                                          f"{{source: {tmp_path / 'none.jsonl'}}}}}]"])
    with pytest.raises(ConfigError, match=r"mixture\[0\] \(x\)\.taskset\.eval_size: Input should be greater than 0"):
        preflight(default_config, tmp_path / "b", [*small, "mixture=[{name: x, weight: 1, taskset: {eval_size: 0}}]"])


def test_a_mixture_runs_each_part_with_its_own_workflow_and_reward(tmp_path, default_config, small):
    game = ("mixture=[{name: sums, weight: 1}, {name: game, weight: 1, reward: env_return, taskset: "
            "{source: 'builtin:guess_number', workflow: multi_turn, domain: game, params: {low: 1, high: 32}, "
            "prompt_template: 'guess {low}-{high}:', eval_size: 4}}]")
    run = CampaignRun(preflight(default_config, tmp_path / "run", [
        *small, game, "workflow.environment=builtin:guess_number", "workflow.max_turns=3",
        "explorer.max_new_tokens=4", "eval.max_new_tokens=4", "rounds=1", "promotion.after_campaign=false"]))
    run.run()
    tasks = run.campaign.splits.by_id
    rows = run.campaign.store.read_kind("usual").to_pylist()
    parts = Counter(tasks[r["task_id"]].metadata["taskset"] for r in rows)
    assert parts == {"sums": 8, "game": 8}
    for r in rows:
        if tasks[r["task_id"]].metadata["taskset"] == "game":  # an episode, scored by its environment's return
            assert r["turns"] and r["reward"] == sum(r["step_rewards"]) and r["rewards"] == [("env_return", r["reward"])]
        else:  # one answer, scored by reasoning-gym's verifier
            assert r["turns"] is None and r["rewards"] == [("score_answer", r["reward"])]
    history = run.tracker.client.get_metric_history(run.tracker.run_id, "episode/turns_mean")
    assert history and 1 <= history[-1].value <= 3
