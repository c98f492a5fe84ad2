"""A Prefect retry of the flow resumes the campaign from its newest checkpoint and ends where an
uninterrupted run ends: one MLflow run, every round once, the same final weights."""

from __future__ import annotations

import hashlib

import pytest

from tests.flows.faults import ARMED, register_fails_once_in_round

pytestmark = pytest.mark.slow  # three campaigns through Prefect

RETRY = ["name=retried", "rounds=4", "checkpoint.every=2", "eval.every=2", "trainer.warmup_steps=20",
         "pipelines.experiences=[{op: fails_once_in_round, round: 3}]"]


@pytest.fixture(autouse=True)
def fails_once_in_round():
    register_fails_once_in_round()


def _weights(run_dir) -> str:
    return hashlib.sha256((run_dir / "model" / "model.safetensors").read_bytes()).hexdigest()


def test_a_flow_retry_resumes_from_the_newest_checkpoint(prefect_api, tmp_path, default_config, small):
    from mlflow import MlflowClient

    from rftflow.flows.campaign import rft_campaign

    overrides = [*small, *RETRY]
    ARMED["fail"] = False
    rft_campaign(str(default_config), str(tmp_path / "straight"), overrides=overrides)
    ARMED["fail"] = True
    retrying = rft_campaign.with_options(retries=1, retry_delay_seconds=0)
    summary = retrying(str(default_config), str(tmp_path / "retried"), overrides=overrides)
    assert not ARMED["fail"]  # the fault happened, in the first attempt
    assert summary["attempts"] == 2 and summary["resumed_from_round"] == 2
    assert _weights(tmp_path / "retried") == _weights(tmp_path / "straight")
    client = MlflowClient(summary["mlflow_tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("rftflow").experiment_id])
    assert run.info.run_id == summary["mlflow_run_id"] and run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")) == [1, 2, 3, 4]
