"""Human feedback ingested from the command line, then a campaign with an experience pipeline that
samples it alongside the demonstrations."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.sampling import expert_pool
from rftflow.components.campaign.stages import Campaign
from rftflow.flows.cli import app

pytestmark = pytest.mark.slow  # ingest, then a whole campaign through Prefect

FEEDBACK = ["name=fb", "buffer.expert_per_round=64",
            "pipelines.experiences=[{op: shape_reward, scale: 2, add: -1}, {op: dedupe}]"]


def test_ingested_feedback_reaches_training_in_a_campaign_with_a_pipeline(prefect_api, tmp_path, default_config, small):
    settings = [*small, *FEEDBACK]
    feedback = tmp_path / "feedback.jsonl"
    rows = [{"prompt": f"{a} + {a} =", "response": str(2 * a), "rating": 1.0} for a in range(10)]
    rows += [{"prompt": "9 + 9 =", "response": "17", "correction": "18"}, {"prompt": "", "response": "1", "rating": 1}]
    feedback.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = tmp_path / "report.json"
    args = ["ingest", "feedback", str(feedback), str(default_config), "--run-dir", str(tmp_path / "run"),
            "--report", str(report), *sum((["--set", s] for s in settings), [])]
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    outcome = json.loads(report.read_text())
    assert (outcome["rows"], outcome["accepted"], outcome["quarantined"]) == (12, 11, 1)
    assert outcome["by_source"] == {"human": 10, "expert": 1} and outcome["stored"] and outcome["new"]
    assert set(outcome["reasons"]) == {"expect_multicolumn_values_within_bounds(prompt_length)",
                                       "expect_multicolumn_values_within_bounds(prompt_tokens)"}  # the empty prompt
    ls = CliRunner().invoke(app, ["buffer", "ls", str(tmp_path / "run")], terminal_width=200)  # before any run
    cells = [[c.strip() for c in line.split("│")[1:5]] for line in ls.output.splitlines()]
    assert ls.exit_code == 0 and ["human", "0", "human", "10"] in cells, ls.output

    from mlflow import MlflowClient

    from rftflow.flows.campaign import rft_campaign

    summary = rft_campaign(str(default_config), str(tmp_path / "run"), overrides=settings)  # the real flow
    campaign = Campaign.from_config(default_config, tmp_path / "run", settings)  # reopens the run's store
    cfg = campaign.cfg
    report_text = Path(summary["validation_report"]).read_text()  # the file ingested before the run is in it
    assert "| ingested feedback file | 1 | 12 | 11 | 1 |" in report_text
    assert "| ingested feedback file | 0 | 12 | 1 | expect_multicolumn_values_within_bounds(prompt_length) ×1" in report_text
    expert = expert_pool(campaign.store, cfg.buffer.human_min_reward)
    assert expert.column("source").to_pylist().count("human") == 10
    history = MlflowClient(summary["mlflow_tracking_uri"]).get_metric_history
    human = history(summary["mlflow_run_id"], "sample/human_rows")
    assert len(human) == 2 and sum(m.value for m in human) > 0  # the rated rows were trained on
    assert len(history(summary["mlflow_run_id"], "verify/pipeline_dropped")) == 2
    usual = campaign.store.read_kind("usual")
    assert usual.num_rows > 0
    for shaped, per_fn in zip(usual.column("reward").to_pylist(), usual.column("rewards").to_pylist()):
        assert shaped == 2 * dict(per_fn)["unshaped"] - 1  # shape_reward: scale 2, add −1
    # pass rates are measured on unshaped rewards (shaping maps 0..1 to −1..1)
    assert all(0 <= total / n <= 1 for total, n in campaign.explorer.pass_rates().tasks.values())
    # a second ingest of the same file stores nothing new
    again = CliRunner().invoke(app, args, terminal_width=200)
    assert again.exit_code == 0 and campaign.store.read_kind("human").num_rows == 10
    assert "every accepted row was stored before: nothing new stored" in again.output
    assert json.loads(report.read_text())["new"] == 0 and json.loads(report.read_text())["already_present"] == 11
    # the file re-sent with one row appended (and one rated again, differently): only those are stored
    rows += [{"prompt": "3 + 4 =", "response": "7", "rating": 1.0}, {"prompt": "1 + 1 =", "response": "2", "rating": 0.0}]
    feedback.write_text("".join(json.dumps(r) + "\n" for r in rows))
    grown = CliRunner().invoke(app, args, terminal_width=200)
    assert grown.exit_code == 0, grown.output
    assert (json.loads(report.read_text())["new"], json.loads(report.read_text())["already_present"]) == (2, 11)
    human = ExperienceStore(campaign.store.objects, "fb").read_kind("human")
    assert human.num_rows == 12 and len(set(human.column("experience_id").to_pylist())) == 12
