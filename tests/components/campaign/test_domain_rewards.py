"""A campaign whose taskset mixes domains: each task scored by its domain's reward (math by
math-verify, code by running it in the sandbox), a bad program's reason kept in its row, and a
sandbox that breaks mid-campaign quarantining the rows it could not score, never scoring them."""

from __future__ import annotations

import json

import pytest

from rftflow.components.campaign.preflight import ConfigError, preflight
from rftflow.components.campaign.run import CampaignRun
from tests.components.conftest import write_code_tasks


def _overrides(tmp_path, small) -> list[str]:
    return [*small, f"taskset.source={write_code_tasks(tmp_path / 'mixed.jsonl', sums=True)}", "taskset.eval_size=8",
            "taskset.prompt_template='{question}'", "reward.function=exact_match",
            "reward.domains={math: math, code: code}",
            "reward.code.timeout_seconds=5", "explorer.max_new_tokens=8", "eval.max_new_tokens=8"]


def test_each_domain_is_scored_by_its_reward_and_a_bad_programs_reason_is_kept(tmp_path, default_config, small):
    run = CampaignRun(preflight(default_config, tmp_path / "run", _overrides(tmp_path, small)))
    run.run()
    usual = run.campaign.store.read_kind("usual")
    rows = usual.select(["task_id", "reward", "info", "rewards"]).to_pylist()
    tasks = run.campaign.splits.by_id
    domains = {tasks[r["task_id"]].metadata["domain"] for r in rows}
    assert domains == {"code", "math"}
    for r in rows:
        domain = tasks[r["task_id"]].metadata["domain"]
        assert r["reward"] in (0.0, 1.0)
        reason = json.loads(r["info"]).get("reward_reason")
        if domain == "code" and r["reward"] == 0.0:  # the tiny model writes no valid program: why is kept
            assert reason.startswith(("exit 1: ", "the program ended ")), reason
        if domain == "math":
            assert reason is None


def test_a_sandbox_that_breaks_quarantines_rows_and_stops_an_evaluation_never_scoring_them(tmp_path, default_config,
                                                                                          small):
    from rftflow.components.data.contracts import ContractBounds
    from rftflow.components.data.experience import make_experience, to_table
    from rftflow.components.verify.check import check_round
    from rftflow.components.verify.scores import RewardUnavailable

    run = CampaignRun(preflight(default_config, tmp_path / "run", _overrides(tmp_path, small)))
    campaign = run.campaign
    campaign.prepare()
    campaign.reward_fn.by_name["code"].sandbox.python = str(tmp_path / "gone" / "python3")  # gone after the preflight
    tasks = list(campaign.splits.by_id.values())
    rollouts = to_table([make_experience(
        experience_id=f"e{i}", campaign="c", round=1, task_id=t.task_id, group_id=t.task_id, source="explorer",
        prompt=t.prompt, response=t.answer, prompt_ids=[1], response_ids=[2], response_logprobs=[-0.5],
        response_mask=[1], model_version=0) for i, t in enumerate(tasks[:16])])
    checked = check_round(rollouts, campaign.splits.by_id, campaign.reward_fn, "exact_match", ContractBounds(),
                          [], seed=0)
    quarantined = checked.verdict.quarantined.to_pylist()
    code = [t.task_id for t in tasks[:16] if t.metadata["domain"] == "code"]
    assert sorted(r["task_id"] for r in quarantined) == sorted(code) and code
    assert all(r["reason"].startswith("reward unavailable: the code sandbox could not set up (bwrap)")
               for r in quarantined)
    assert checked.verdict.accepted.column("reward").to_pylist() == [1.0] * (16 - len(code))  # math: gold answers
    # greedy evaluation has no row to quarantine: it stops, naming the cause, before any score is made of it
    with pytest.raises(RewardUnavailable, match=r"^evaluation: a reward could not be computed \(the code sandbox "):
        run.run()

    # where it cannot be set up at all, the campaign does not start: one line naming the key
    with pytest.raises(ConfigError, match=r"^reward\.code: the code sandbox could not set up \(bwrap\): "):
        preflight(default_config, tmp_path / "no", [*_overrides(tmp_path, small),
                                                   f"reward.code.python={tmp_path / 'none'}"])
