"""A short real campaign through Prefect's test API: stage task runs, MLflow metrics, shards, model."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rftflow.components.config import load_config
from rftflow.components.data.experience import SCHEMA

pytestmark = pytest.mark.slow  # a whole campaign through Prefect

STAGES = ("explore", "verify", "buffer", "train", "sync")
# one-digit sums and a warm start of 300 steps: a held-out accuracy well away from 0 that moves
# from round to round (0.5, 0.3, 0.3 on one run), so what the UI and MLflow show is told apart; the
# pipeline drops no row (the model answers a group alike: dedupe would, its own tests cover it)
E2E = ["name=e2e", "eval.every=1", "pipelines.experiences=[{op: shape_reward, scale: 1.0}, {op: length_filter, "
       "max_tokens: 6}]",
       "taskset.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}", "trainer.warmup_steps=300"]


@pytest.fixture(scope="module")
def finished(prefect_api, tmp_path_factory, default_config, small):
    from rftflow.flows.campaign import rft_campaign

    run_dir = tmp_path_factory.mktemp("campaign")
    cfg = load_config(default_config, [*small, *E2E])
    summary = rft_campaign(str(default_config), str(run_dir), overrides=[*small, *E2E])  # as a deployment passes it
    return cfg, run_dir, summary


def test_summary_is_written_with_the_promised_fields(finished):
    _, run_dir, summary = finished
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == summary
    for key in ("eval_accuracy_before", "eval_accuracy_after", "rounds", "wall_seconds", "mlflow_tracking_uri",
                "mlflow_run_id", "model_name", "model_version", "store_url"):
        assert key in summary
    assert summary["rounds"] == 2


def _history(summary: dict, key: str) -> dict[int, float]:
    from mlflow import MlflowClient

    client = MlflowClient(summary["mlflow_tracking_uri"])
    return {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], key)}


def test_the_held_out_accuracy_is_a_share_of_the_held_out_tasks_and_the_summary_has_the_last(finished):
    cfg, _, summary = finished
    accuracy = _history(summary, "accuracy/held_out")
    assert sorted(accuracy) == [0, 1, 2]  # before the rounds and after each (eval.every=1)
    for value in accuracy.values():  # the share of the 10 held-out tasks answered right
        assert value * cfg.taskset.eval_size == pytest.approx(round(value * cfg.taskset.eval_size))
    assert max(accuracy.values()) > 0  # the warm start taught some of them: the evaluation sees the model
    assert summary["eval_accuracy_before"] == pytest.approx(accuracy[0], abs=1e-4)
    assert summary["eval_accuracy_after"] == pytest.approx(accuracy[2], abs=1e-4)


def test_every_stage_task_run_completed_with_its_round_in_the_name(finished):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    _, _, summary = finished
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[summary["prefect_flow_run_id"]])))
    states = {run.name: run.state.type.value for run in runs}
    # task_runs auto (the default): round 1 a task run per stage, round 2 as it chose from round 1
    assert summary["task_runs"] in ("stage", "round")
    expected = [f"{stage}[r=1]" for stage in STAGES] + (
        ["round[r=2]"] if summary["task_runs"] == "round" else [f"{stage}[r=2]" for stage in STAGES])
    for name in [*expected, "evaluate[r=1]", "evaluate[r=2]"]:
        assert states.get(name) == "COMPLETED", (name, states)
    assert states.get("evaluate[r=0]") == "COMPLETED"
    assert states.get("register[r=2]") == states.get("promote[r=2]") == "COMPLETED"


def test_the_registered_version_is_put_to_the_promotion_after_the_campaign(finished):
    from mlflow import MlflowClient

    _, _, summary = finished
    name, version = summary["model_name"], summary["model_version"]
    tags = MlflowClient(summary["mlflow_tracking_uri"]).get_model_version(name, version).tags
    decision = tags["promotion.decision"]  # the first version: champion if it reaches promotion.min_accuracy
    assert decision == ("promoted" if summary["eval_accuracy_after"] >= 0.5 else "rejected")
    verdict = "promoted to @champion" if decision == "promoted" else "not promoted"
    assert summary["promotion"].startswith(f"{name} v{version}: {verdict} (")


def test_the_ui_shows_progress_a_round_table_and_a_summary_linking_mlflow(finished):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from rftflow.components.campaign.preflight import campaign_label

    cfg, run_dir, summary = finished
    label = campaign_label(cfg.name, run_dir)
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(
            flow_run_id=ArtifactFilterFlowRunId(any_=[summary["prefect_flow_run_id"]])))
        flow_run = client.read_flow_run(summary["prefect_flow_run_id"])
    by_key: dict[str, list] = {}
    for artifact in found:
        by_key.setdefault(artifact.key, []).append(artifact)
    # one card per kind, keyed by the campaign's label and the attempt
    kinds = ("warm-start", "progress", "rounds", "summary")
    assert {k: len(v) for k, v in by_key.items()} == {f"{label}-a1-{kind}": 1 for kind in kinds}
    (progress,) = by_key[f"{label}-a1-progress"]
    assert progress.type == "progress" and float(progress.data) == 100.0  # updated after each round
    (table,) = by_key[f"{label}-a1-rounds"]  # made once, its data replaced each update
    rows = json.loads(table.data)
    assert [r["round"] for r in rows] == [0, 1, 2]  # round 0: before the rounds
    assert rows[0]["accuracy"] == pytest.approx(summary["eval_accuracy_before"], abs=1e-4) and rows[0]["reward"] == ""
    reward, accuracy = _history(summary, "reward/mean"), _history(summary, "accuracy/held_out")
    for row in rows[1:]:  # each round's own figures (eval.every=1: its evaluation too)
        assert row["train s"] > 0 and row["quarantined"] == 0
        assert row["reward"] == pytest.approx(reward[row["round"]], abs=1e-4)
        assert row["accuracy"] == pytest.approx(accuracy[row["round"]], abs=1e-4)
    assert rows[-1]["accuracy"] == pytest.approx(summary["eval_accuracy_after"], abs=1e-4)
    (markdown,) = by_key[f"{label}-a1-summary"]
    assert summary["mlflow_run_id"] in markdown.data and f"models:/{summary['model_name']}/{summary['model_version']}" in markdown.data
    assert f"{summary['eval_accuracy_before']:.3f} → {summary['eval_accuracy_after']:.3f}" in markdown.data
    # the flow run says which campaign and attempt it is, and where it ended, in its name and tags
    assert flow_run.name.endswith(f"-{label.rsplit('-', 1)[1]}-a1")
    assert {f"campaign {label}", f"mlflow {summary['mlflow_run_id']}", "round 2/2",
            f"accuracy {summary['eval_accuracy_after']:.3f}",
            # the model and the registry it is in: the run dir's own store
            f"model {summary['model_name']} v{summary['model_version']} ({run_dir.name}/mlflow.db)"} <= set(flow_run.tags)


def test_mlflow_has_metrics_per_round_and_masked_params(finished):
    from mlflow import MlflowClient

    _, _, summary = finished
    client = MlflowClient(summary["mlflow_tracking_uri"])
    steps = lambda key: sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], key))  # noqa: E731
    assert steps("reward/mean") == [1, 2]
    assert steps("loss/total") == [1, 2] and steps("time/explore_s") == [1, 2]
    assert steps("accuracy/held_out") == [0, 1, 2]
    run = client.get_run(summary["mlflow_run_id"])
    assert run.data.params["algorithm.name"] == "mix" and run.info.status == "FINISHED"
    # the naming scheme (docs/operations/monitoring.md): MLflow shows sections alphabetically, the
    # headline ones first; every other section sorts after them
    sections = {key.split("/", 1)[0] for key in run.data.metrics}
    headline = {"accuracy", "kl", "loss", "reward"}
    assert {"accuracy", "loss", "reward"} <= sections and all(s > "reward" for s in sections - headline), sections


def test_store_holds_committed_parquet_shards_readable_by_plain_pyarrow(finished):
    cfg, run_dir, _ = finished
    usual = run_dir / "store" / cfg.name / "experiences" / "usual"
    for r in (1, 2):
        shard = usual / f"round={r}" / "part-00000.parquet"
        assert (shard.parent / "_commit" / "part-00000.json").is_file()
        table = pq.read_table(shard)
        assert table.schema.equals(SCHEMA, check_metadata=False)
        assert table.num_rows == 16 and set(table.column("round").to_pylist()) == {r}
    expert = pq.read_table(run_dir / "store" / cfg.name / "experiences" / "expert" / "taskset" / "part-00000.parquet")
    assert set(expert.column("source").to_pylist()) == {"expert"}


def test_duckdb_and_pyarrow_datasets_read_the_rounds_with_their_defaults(finished):
    import duckdb
    import pyarrow.dataset as ds

    cfg, run_dir, _ = finished
    usual = run_dir / "store" / cfg.name / "experiences" / "usual"
    per_round = cfg.explorer.tasks_per_round * cfg.explorer.repeat_times
    # the directory key round=N is the rows' own round column: DuckDB's hive partitioning agrees with it
    rows = duckdb.sql(f"SELECT round, count(*) FROM read_parquet('{usual}/*/part-*.parquet') "
                      "GROUP BY round ORDER BY round").fetchall()
    assert rows == [(1, per_round), (2, per_round)] and all(isinstance(r, int) for r, _ in rows)
    table = ds.dataset(usual).to_table()
    assert sorted(set(table.column("round").to_pylist())) == [1, 2] and table.num_rows == 2 * per_round
    expert = duckdb.sql(f"SELECT DISTINCT source FROM read_parquet('{usual.parent}/expert/**/*.parquet')").fetchall()
    assert expert == [("expert",)]


def test_registered_model_version_loads_with_transformers_and_answers(finished, tmp_path):
    import mlflow
    from mlflow import MlflowClient

    _, _, summary = finished
    client = MlflowClient(summary["mlflow_tracking_uri"], registry_uri=summary["mlflow_tracking_uri"])
    version = client.get_model_version(summary["model_name"], summary["model_version"])
    assert version.run_id == summary["mlflow_run_id"] and version.tags["campaign"] == "e2e"
    local = mlflow.artifacts.download_artifacts(
        artifact_uri=client.get_model_version_download_uri(summary["model_name"], summary["model_version"]),
        dst_path=str(tmp_path),
    )
    model = AutoModelForCausalLM.from_pretrained(local)
    tokenizer = AutoTokenizer.from_pretrained(local)
    prompt = tokenizer("12 + 7 =", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > prompt["input_ids"].shape[1]  # it answered something


def test_buffer_cli_lists_shows_and_exports_what_the_campaign_stored(finished, tmp_path):
    from typer.testing import CliRunner

    from rftflow.flows.cli import app

    cfg, run_dir, summary = finished
    runner = CliRunner()
    ls = runner.invoke(app, ["buffer", "ls", str(run_dir)], terminal_width=200)
    assert ls.exit_code == 0, ls.output
    per_round = cfg.explorer.tasks_per_round * cfg.explorer.repeat_times
    lines = [line.split("│") for line in ls.output.splitlines() if "│" in line]
    cells = [[c.strip() for c in line[1:-1]] for line in lines]
    assert ["usual", "1", "explorer", str(per_round)] in cells and ["usual", "2", "explorer", str(per_round)] in cells
    assert ["tasks", "", "eval", str(cfg.taskset.eval_size)] in cells
    show = runner.invoke(app, ["buffer", "show", summary["store_url"], "--round", "2", "--limit", "3"],
                         terminal_width=200)
    assert show.exit_code == 0 and f"usual: {per_round} rows in round 2" in show.output
    out = tmp_path / "usual.jsonl"
    export = runner.invoke(app, ["buffer", "export", str(run_dir), "--out", str(out)])
    assert export.exit_code == 0, export.output
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(exported) == 2 * per_round and {r["round"] for r in exported} == {1, 2}
    parquet = tmp_path / "expert.parquet"
    assert runner.invoke(app, ["buffer", "export", str(run_dir), "--kind", "expert", "--out", str(parquet)]).exit_code == 0
    assert set(pq.read_table(parquet).column("source").to_pylist()) == {"expert"}
    bad = runner.invoke(app, ["buffer", "show", str(run_dir), "--kind", "nope"])
    assert bad.exit_code == 2 and "unknown kind 'nope'; known: usual, expert, human, quarantine, failed, tasks" in bad.stderr


def test_validation_report_is_written_logged_and_linked(finished):
    from mlflow import MlflowClient

    cfg, run_dir, summary = finished
    report = Path(summary["validation_report"])
    text = report.read_text()
    per_round = cfg.explorer.tasks_per_round * cfg.explorer.repeat_times
    assert f"| experience contract | 2 | {2 * per_round} |" in text and "| expert contract | 1 |" in text
    assert "| experience pipeline | 2 |" in text
    assert f"| tasks contract | 1 | {cfg.taskset.size} | {cfg.taskset.size} | 0 |" in text  # every generated row
    client = MlflowClient(summary["mlflow_tracking_uri"])
    assert [a.path for a in client.list_artifacts(summary["mlflow_run_id"], "validation")] == ["validation/validation.md"]


def test_a_contract_failure_in_prepare_is_not_retried_and_keeps_its_rows(prefect_api, tmp_path, default_config, small):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from rftflow.components.buffer.experiences import ExperienceStore
    from rftflow.components.buffer.store import open_store
    from rftflow.flows.campaign import rft_campaign

    # every demonstration's prompt is longer than 2 tokens: the expert contract fails the batch
    cfg = load_config(default_config, [*small, "name=strict-prep", "contracts.max_prompt_tokens=2"])
    state = rft_campaign(cfg.model_dump(mode="json"), str(tmp_path), return_state=True)
    assert state.is_failed() and "expert demonstrations: " in state.message
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    prepare = [r for r in runs if r.name.startswith("prepare")]
    assert len(prepare) == 1 and prepare[0].run_count == 1  # bad data stays bad: no retry
    report = (tmp_path / "validation" / "validation.md").read_text()
    assert report.count("| expert contract |") == 2  # the totals line and its batch, once each
    quarantined = ExperienceStore(open_store((tmp_path / "store").as_uri()), "strict-prep").read_kind("quarantine")
    assert quarantined.num_rows > 0 and "within_bounds(prompt_tokens)" in quarantined.column("reason")[0].as_py()


def test_task_runs_auto_over_its_share_runs_the_rounds_after_the_first_several_to_a_task_run(prefect_api, tmp_path,
                                                                                              default_config, small):
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from rftflow.flows.campaign import rft_campaign

    # a share of 0: any cost of Prefect's is over it
    summary = rft_campaign(str(default_config), str(tmp_path), overrides=[*small, "name=auto", "rounds=3",
                                                                           "orchestration.task_runs_max_share=0"])
    assert summary["task_runs"] == "round" and summary["rounds"] == 3
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[summary["prefect_flow_run_id"]])))
    states = {run.name: run.state.type.value for run in runs}
    # a share of 0 asks for as many rounds a task run as fit in 5 s (by round 1's time): rounds 2-3 unless
    # round 1 took more than 2.5 s; round 3 is evaluated
    rounds = ["round[r=2-3]"] if summary["rounds_per_task_run"] >= 2 else ["round[r=2]", "round[r=3]"]
    for name in [*(f"{stage}[r=1]" for stage in STAGES), *rounds, "evaluate[r=3]"]:
        assert states.get(name) == "COMPLETED", (name, states)
    assert not [name for name in states if name.split("[")[0] in STAGES and not name.endswith("[r=1]")]
    assert sorted(name for name in states if name.startswith("round[")) == rounds
    client = MlflowClient(summary["mlflow_tracking_uri"])
    run = client.get_run(summary["mlflow_run_id"])  # what task_runs auto chose, once: run tags, not charts
    assert 0.0 < float(run.data.tags["time/prefect_share"]) < 1.0
    assert run.data.tags["time/rounds_per_task_run"] == str(summary["rounds_per_task_run"])
    assert not {"time/prefect_share", "time/rounds_per_task_run"} & set(run.data.metrics)
    for stage in STAGES:  # every stage timed once a round, either way
        steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], f"time/{stage}_s")]
        assert sorted(steps) == [1, 2, 3], (stage, steps)


def test_a_signal_stops_a_task_run_of_rounds_after_its_current_round(prefect_api, tmp_path, default_config, small,
                                                                     monkeypatch):
    import os
    import signal

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId
    from prefect.logging.handlers import APILogWorker

    from rftflow.components.campaign.state import StateStore
    from rftflow.components.buffer.store import open_store
    from rftflow.components.campaign.stages import Campaign
    from rftflow.flows.campaign import rft_campaign

    train = Campaign.train

    def train_then_signal(self, round_no):  # SIGTERM, as `kill` sends it, while round 2 trains
        metrics = train(self, round_no)
        if round_no == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return metrics

    monkeypatch.setattr(Campaign, "train", train_then_signal)
    state = rft_campaign(str(default_config), str(tmp_path), overrides=[*small, "name=stopped", "rounds=6",
                                                                         "eval.every=6", "orchestration.task_runs=round",
                                                                         "orchestration.rounds_per_task_run=4"],
                         return_state=True)
    assert state.is_cancelled() and "stopped (SIGTERM) after round 2;" in state.message, state.message
    campaign_state = StateStore(open_store(f"file://{tmp_path}/store"), "stopped").read()
    assert campaign_state.rounds_done == 2 and campaign_state.status == "interrupted"
    with get_client(sync_client=True) as client:  # the task run was for rounds 1-4 and ran 1-2
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    assert [run.name for run in runs if run.name.startswith("round[")] == ["round[r=1-4]"], [run.name for run in runs]
    logs = {}  # its log: a line per round it ran
    APILogWorker.drain_all(timeout=10)
    with get_client(sync_client=True) as client:
        for log in client.read_logs(LogFilter(task_run_id=LogFilterTaskRunId(any_=[r.id for r in runs
                                                                                      if r.name == "round[r=1-4]"]))):
            logs[log.message.split(":")[0]] = log.message
    assert [k for k in logs if k.startswith("round ")] == ["round 1", "round 2"], logs


def test_with_task_runs_round_a_round_is_one_task_run_and_each_stage_is_still_timed(prefect_api, tmp_path,
                                                                                      default_config, small):
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from rftflow.flows.campaign import rft_campaign

    summary = rft_campaign(str(default_config), str(tmp_path), overrides=[*small, "name=per-round", "orchestration.task_runs=round"])
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[summary["prefect_flow_run_id"]])))
    states = {run.name: run.state.type.value for run in runs}
    assert states["round[r=1]"] == states["round[r=2]"] == states["evaluate[r=2]"] == "COMPLETED", states
    assert not [name for name in states if name.split("[")[0] in ("explore", "verify", "buffer", "train", "sync")]
    client = MlflowClient(summary["mlflow_tracking_uri"])
    for stage in ("explore", "verify", "buffer", "train", "sync"):  # each stage still timed, once a round
        steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], f"time/{stage}_s")]
        assert sorted(steps) == [1, 2], (stage, steps)
    assert summary["rounds"] == 2
    assert summary["eval_accuracy_after"] == pytest.approx(_history(summary, "accuracy/held_out")[2], abs=1e-4)
