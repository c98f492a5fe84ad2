"""Every algorithm preset runs a 2-round campaign on builtin:tiny."""

import math
from pathlib import Path

import pytest

from components.campaign import Campaign
from components.config import ALGORITHM_PRESETS, load_config

CONFIG = Path(__file__).parents[2] / "configs" / "arith-mix.yaml"


@pytest.mark.parametrize("preset", sorted(ALGORITHM_PRESETS))
def test_preset_runs_two_rounds(preset, tmp_path):
    cfg = load_config(CONFIG, [
        f"name=p-{preset}", f"algorithm.name={preset}", "taskset.size=300", "taskset.eval_size=10",
        "trainer.warmup_steps=2", "trainer.micro_batch_size=16", "explorer.tasks_per_round=4",
        "explorer.repeat_times=4", "algorithm.expert_per_round=8",
    ])
    campaign = Campaign(cfg, tmp_path)
    campaign.prepare()
    campaign.warm_start()
    for r in (1, 2):
        metrics = campaign.run_round(r)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        if preset == "dapo":  # an untrained model's groups mostly score all 0: dynamic sampling drops them
            kept_rows = (4 - metrics["sample/dropped_groups"]) * 4
            assert metrics["sample/dropped_groups"] >= 1 and metrics["train/steps"] == math.ceil(kept_rows / 16)
            continue
        assert metrics["train/steps"] >= 1
        assert metrics["sync/weight_version"] == r + 1  # the warm start synced once
    expected = {"sft": "loss/sft", "mix": "loss/sft", "dapo": "sample/dropped_groups"}.get(preset, "loss/policy")
    assert expected in metrics


def test_kl_entropy_and_staleness_options_run_in_a_campaign(tmp_path):
    cfg = load_config(CONFIG, [
        "name=reg", "algorithm.name=grpo", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.001",
        "algorithm.max_staleness=0", "taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2",
        "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
    ])
    campaign = Campaign(cfg, tmp_path)
    campaign.prepare()
    campaign.warm_start()
    metrics = [campaign.run_round(r) for r in (1, 2)][-1]
    # on-policy: every row is from the current version, none is stale
    assert metrics["sample/dropped_stale"] == 0 and metrics["train/steps"] == 1
    assert metrics["kl/low_var_kl"] >= 0 and metrics["policy/entropy"] > 0
