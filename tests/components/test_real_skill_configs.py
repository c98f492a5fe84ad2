"""The shipped configs where SmolLM2-135M-Instruct learns a skill on CPU (configs/smollm2-math.yaml,
configs/smollm2-code.yaml), run at a smoke size: the math config's warm start, then two rounds; the
code config's round to its buffer (its rows train as the math config's do). Their rows carry their
reward's own verdict (math-verify's reading; the code sandbox's run of the program against the task's
tests) and their groups a signal. Whether they learn is measured by benchmarks/real_skill.py, not here."""

import json

import pytest

pytestmark = pytest.mark.slow  # a 135M-parameter model on CPU

SMOKE = ["rounds=2", "taskset.size=300", "taskset.eval_size=4", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
         "explorer.max_explore_batches=2", "trainer.micro_batch_size=8",
         "promotion.after_campaign=false", "checkpoint.keep_last=1"]


def _rounds(config: str, run_dir, more=(), *, trains: bool = True):
    """The campaign after its warm start (if it has one) and its rounds (``trains``: each to its update
    and sync; else explore, verify and buffer), and the rows its explorer stored."""
    from rftflow.components.campaign.schedule import ROUND, Step
    from rftflow.components.campaign.stages import Campaign

    campaign = Campaign.from_config(config, run_dir, [*SMOKE, *more])
    campaign.prepare()
    campaign.warm_start()
    for round_no in range(1, campaign.cfg.rounds + 1):
        for step in ROUND if trains else ROUND[:ROUND.index(Step.TRAIN)]:
            campaign.stage(step, round_no)
    return campaign, campaign.store.read_kind("usual").to_pylist()


def _groups_with_signal(rows) -> float:
    by_group = {}
    for row in rows:
        by_group.setdefault(row["group_id"], set()).add(row["reward"])
    return sum(len(rewards) > 1 for rewards in by_group.values()) / len(by_group)


def test_the_math_config_warm_starts_and_explores_groups_with_signal(tmp_path):
    from rftflow.components.verify.rewards import math_verify

    campaign, rows = _rounds("configs/smollm2-math.yaml", tmp_path / "run", ["trainer.warmup_steps=3"])
    assert campaign.policy_version == 3  # the warm start, then two rounds
    assert rows and {row["model_version"] for row in rows} <= {1, 2}  # sampled after the warm start
    tasks = campaign.splits.by_id
    for row in rows:  # the stored reward is math-verify's reading of the answer
        assert row["reward"] == math_verify(row["response"], tasks[row["task_id"]])
    assert _groups_with_signal(rows) > 0  # the groups dynamic sampling trains on


def test_the_code_config_scores_programs_in_the_sandbox_and_explores_groups_with_signal(tmp_path):
    from rftflow.components.verify.code import CodeReward

    # one round to its buffer, at one torch thread (the rows, and so the signal, the same alone and in the suite)
    campaign, rows = _rounds("configs/smollm2-code.yaml", tmp_path / "run", ["rounds=1", "threads=1"],
                             trains=False)
    tasks = campaign.splits.by_id
    assert all(tasks[row["task_id"]].metadata["tests"].startswith("def check(candidate):") for row in rows)
    rerun = CodeReward(campaign.cfg.reward.code)  # the same programs, run again in fresh sandboxes
    try:
        again = rerun.score_many([row["response"] for row in rows], [tasks[row["task_id"]] for row in rows])
    finally:
        rerun.close()
    assert [row["reward"] for row in rows] == [s.value for s in again]
    assert [row["rewards"] for row in rows] == [[("code", s.value)] for s in again]
    failed = [json.loads(row["info"]) for row in rows if row["reward"] == 0.0]
    assert failed and all(info["reward_reason"] for info in failed)  # why each program failed its tests
    assert _groups_with_signal(rows) > 0
