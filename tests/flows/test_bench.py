"""``mode: bench``: three model versions — two checkpoints of a campaign and its registered MLflow
version — evaluated in one flow run and one MLflow run, a row per model."""

from __future__ import annotations

import json


def test_bench_evaluates_three_versions_in_one_run(prefect_api, tmp_path, default_config, small):
    from mlflow import MlflowClient

    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.run import CampaignRun
    from rftflow.flows.campaign import rft_campaign

    campaign = [*small, "checkpoint.every=1", "checkpoint.keep_last=3", "trainer.warmup_steps=20"]
    summary = CampaignRun(preflight(default_config, tmp_path / "run", campaign)).run()
    # version 1: after the warm start; the newest; the registered final model
    models = ["checkpoint:1", "checkpoint:latest", f"models:/{summary['model_name']}/{summary['model_version']}"]
    result = rft_campaign(str(default_config), str(tmp_path / "run"), overrides=[
        *campaign, "mode=bench", f"bench.models={json.dumps(models)}"])
    rows = result["results"]
    assert [r["model"] for r in rows] == models and all(r["tasks"] == 10 for r in rows)
    by_model = {r["model"]: r["accuracy"] for r in rows}
    # the same held-out split and greedy evaluation as the campaign's own
    assert by_model["checkpoint:1"] == summary["eval_accuracy_before"]
    assert by_model["checkpoint:latest"] == by_model[models[2]] == summary["eval_accuracy_after"]
    client = MlflowClient(result["mlflow_tracking_uri"])
    history = client.get_metric_history(result["mlflow_run_id"], "bench/accuracy/chain_sum")
    assert sorted(m.step for m in history) == [0, 1, 2]
    assert client.get_run(result["mlflow_run_id"]).info.status == "FINISHED"
    assert json.loads((tmp_path / "run" / "bench.json").read_text()) == rows


def test_bench_names_a_model_it_cannot_find_in_one_line(prefect_api, tmp_path, default_config, small):
    from rftflow.flows.campaign import rft_campaign

    state = rft_campaign(str(default_config), str(tmp_path / "run"), return_state=True, overrides=[
        *small, "mode=bench", 'bench.models=["checkpoint:7"]'])
    assert state.is_failed() and state.message.startswith("bench.models 'checkpoint:7': no such checkpoint in file://")
