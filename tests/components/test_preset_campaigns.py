"""Every algorithm preset runs a 2-round campaign on builtin:tiny."""

import math
from pathlib import Path

import pytest

from components.campaign import Campaign
from components.config import ALGORITHM_PRESETS, load_config

CONFIG = Path(__file__).parents[2] / "configs" / "arith-mix.yaml"
SMALL = ["taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2", "trainer.micro_batch_size=16",
         "explorer.tasks_per_round=4", "explorer.repeat_times=4"]


def _started(tmp_path, *overrides: str) -> Campaign:
    """A small campaign, prepared and warm-started, ready for its rounds."""
    campaign = Campaign(load_config(CONFIG, [*SMALL, *overrides]), tmp_path)
    campaign.prepare()
    campaign.warm_start()
    return campaign


@pytest.mark.parametrize("preset", sorted(ALGORITHM_PRESETS))
def test_preset_runs_two_rounds(preset, tmp_path):
    campaign = _started(
        tmp_path, f"name=p-{preset}", f"algorithm.name={preset}", "algorithm.expert_per_round=8",
        # DPO pairs need groups with a right and a wrong answer: a longer warm start, dynamic sampling
        *(["trainer.warmup_steps=100", "algorithm.dynamic_sampling=true"] if preset == "dpo" else []),
    )
    for r in (1, 2):
        metrics = campaign.run_round(r)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        if preset == "dapo":  # an untrained model's groups mostly score all 0: dynamic sampling drops them
            informative = metrics["explore/rows"] / 4 - metrics["sample/dropped_groups"]
            # ... and refills: more task batches until 4 groups with signal, or the 4-batch limit
            assert metrics["explore/batches"] == 4 or (metrics["explore/batches"] > 1 and informative >= 4)
            assert metrics["train/steps"] == math.ceil(min(informative, 4) * 4 / 16)
            continue
        assert metrics["train/steps"] >= 1
        if preset == "dpo":
            assert metrics["sample/pairs"] >= 1 and metrics["train/steps"] == math.ceil(metrics["sample/pairs"] * 2 / 16)
        assert metrics["sync/weight_version"] == r + 1  # the warm start synced once
    expected = {"sft": "loss/sft", "mix": "loss/sft", "dapo": "sample/dropped_groups", "ppo": "critic/loss",
                "dpo": "dpo/reward_accuracy"}.get(preset, "loss/policy")
    assert expected in metrics


def test_kl_entropy_and_staleness_options_run_in_a_campaign(tmp_path):
    campaign = _started(tmp_path, "name=reg", "algorithm.name=grpo", "algorithm.kl_coef=0.05",
                        "algorithm.entropy_coef=0.001", "algorithm.max_staleness=0")
    metrics = [campaign.run_round(r) for r in (1, 2)][-1]
    # on-policy: every row is from the current version, none is stale
    assert metrics["sample/dropped_stale"] == 0 and metrics["train/steps"] == 1
    assert metrics["kl/low_var_kl"] >= 0 and metrics["policy/entropy"] > 0


def test_mix_expert_ratio_sets_the_expert_share_of_the_round(tmp_path):
    campaign = _started(tmp_path, "name=ratio", "algorithm.name=mix", "algorithm.expert_ratio=0.25")
    metrics = campaign.run_round(1)
    # 16 explorer rows taken; 25% expert → 16 · .25/.75 = 5.33 → 5 rows; 21 rows in micro-batches of 16
    assert metrics["sample/usual_rows"] == 16 and metrics["sample/expert_rows"] == 5
    assert metrics["train/steps"] == 2


def test_replay_buffer_and_curriculum_run_in_a_campaign(tmp_path):
    campaign = _started(tmp_path, "name=cur", "algorithm.name=grpo", "buffer.sampling=replay",
                        "buffer.train_rows=32", "explorer.task_selector=curriculum")
    metrics = [campaign.run_round(r) for r in (1, 2)]
    # round 2 replays 32 rows (8 groups) out of the 2 rounds' 32 rows; each group used at most twice
    assert metrics[0]["sample/usual_rows"] == 16 and metrics[1]["sample/usual_rows"] == 32
    uses = campaign.buffer.read_state("replay_uses")
    assert len(uses) == 8 and set(uses.values()) <= {1, 2}
    rates = campaign.pass_rates()
    assert rates.rounds == {1, 2} and sum(n for _, n in rates.tasks.values()) == 32
    assert 0 <= metrics[1]["tasks/mean_pass_rate"] <= 1


def test_prioritize_orders_train_tasks_by_pass_rates_measured_in_the_store(tmp_path):
    from components.buffer import ExperienceBuffer
    from components.storage import open_store
    from components.tasksets import load_tasks

    cfg = load_config(CONFIG, [*SMALL, "name=second", f"storage.url={(tmp_path / 'store').as_uri()}",
                               "explorer.task_selector=sequential", "pipelines.tasks=[{op: prioritize, target: 0.0}]"])
    train = load_tasks(cfg.taskset, cfg.seed, cfg.contracts).train
    # what an earlier campaign in this store measured (reward sum, attempts) for three of its tasks
    measured = {train[5].task_id: [4.0, 4], train[9].task_id: [0.0, 8], train[20].task_id: [2.0, 4]}
    ExperienceBuffer(open_store(cfg.storage.url), "first").write_state("pass_rates", {"rounds": [1], "tasks": measured})
    campaign = Campaign(cfg, tmp_path / "run")
    campaign.prepare()
    order = [t.task_id for t in campaign.train_tasks]
    # hardest first: 0/8, then every unmeasured task (shrunk to the mean, 6/16), then 2/4, then 4/4
    assert order[0] == train[9].task_id and order[-2:] == [train[20].task_id, train[5].task_id]
    assert sorted(order) == sorted(t.task_id for t in train)  # reordered, nothing lost


def test_a_round_past_the_contract_threshold_fails_and_keeps_its_bad_rows(tmp_path):
    from components.validation import ContractError

    # rewards below 0.5 break this contract: the barely trained policy gets most answers wrong
    campaign = _started(tmp_path, "name=strict", "algorithm.name=grpo", "contracts.reward_min=0.5")
    campaign.explore(1)
    with pytest.raises(ContractError, match=r"round 1 experiences: \d+ of 16 rows .* first: .*between\(reward\)"):
        campaign.verify(1)
    bad = campaign.buffer.read_kind("failed", 1)
    assert bad.num_rows > 0.1 * 16 and set(bad.column("reason").to_pylist()) == {"expect_column_values_to_be_between(reward)"}
    assert bad.num_rows == campaign.validation_log[-1].quarantined  # the report counts the same rows
    assert campaign.buffer.read_kind("quarantine").num_rows == 0  # a failed round's rows are apart
    # the round runs again under a looser threshold: its rows are quarantined once, under the round
    loose = campaign.cfg.contracts.model_copy(update={"max_bad_fraction": 1.0})
    campaign.cfg = campaign.cfg.model_copy(update={"contracts": loose})
    campaign.verify(1)
    campaign.store_round(1)
    again = campaign.buffer.read_kind("quarantine", 1)
    assert sorted(again.column("experience_id").to_pylist()) == sorted(bad.column("experience_id").to_pylist())
    counts = {c["kind"]: c["rows"] for c in campaign.buffer.counts() if c["round"] == 1 and c["kind"] != "usual"}
    assert counts == {"quarantine": bad.num_rows, "failed": bad.num_rows}
