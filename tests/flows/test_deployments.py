"""prefect.yaml against real servers: ``prefect deploy --all`` on a real ``prefect server start``, a
process work pool served by a real ``prefect worker start``, and a real ``mlflow server``. The
``rft-campaign`` deployment runs a small campaign through the worker; read back through the
Prefect client: every round's stage task runs completed and the UI artifacts exist; from the MLflow
server: the run, its metrics and the registered version (promoted after the campaign). The
``evaluate`` deployment then benchmarks ``@champion``, and a bad override fails at the gate. The
``arith-mix-trainer`` deployment (2 trainer processes under ``accelerate launch``) and two runs of
``arith-mix-explorer`` (one shard each) run one campaign through the same worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rftflow.components.campaign.preflight import campaign_label
from rftflow.flows.monitor import artifact_key

pytestmark = pytest.mark.slow  # three servers and three flow runs in worker subprocesses

ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENTS = {"rft_campaign/rft-campaign", "rft_campaign/evaluate", "rft_campaign/arith-mix-explorer",
               "rft_campaign/arith-mix-trainer", "promote_model/promote-model"}


@pytest.fixture(scope="module")
def servers(cli_env, tmp_path_factory):
    """A real ``prefect server start`` with its services (they record task runs from events) and a
    real ``mlflow server`` (SQLite, artifacts served), started as ``rftflow up`` starts them; the
    deployments of prefect.yaml, and a process worker on pool ``rftflow`` whose runs track to the
    MLflow server (``MLFLOW_TRACKING_URI``)."""
    from rftflow.flows.servers import down, up
    from rftflow.infra.ports import free_port

    work = tmp_path_factory.mktemp("deployments")
    env = {**cli_env, "PREFECT_HOME": str(work / "prefect"), "RFTFLOW_HOME": str(ROOT),
           # the trainer deployment's command (`accelerate launch`) as an activated virtualenv finds it
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cli_env.get('PATH', '')}",
           "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    worker = None
    try:
        urls = up(work, free_port(), free_port(), env=env)
        prefect_url, mlflow_url = f"{urls['prefect']}/api", urls["mlflow"]
        env |= {"PREFECT_API_URL": prefect_url, "MLFLOW_TRACKING_URI": mlflow_url}
        prefect = [sys.executable, "-m", "prefect", "--no-prompt"]
        subprocess.run([*prefect, "work-pool", "create", "rftflow", "--type", "process", "--overwrite"], env=env,
                       check=True, capture_output=True, cwd=ROOT)
        deployed = subprocess.run([*prefect, "deploy", "--all"], env=env, capture_output=True, text=True, cwd=ROOT)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-3000:]
        worker_log = work / "worker.log"
        worker = subprocess.Popen([*prefect, "worker", "start", "--pool", "rftflow", "--type", "process"], env=env,
                                  cwd=work, stdout=worker_log.open("w"), stderr=subprocess.STDOUT)
        yield {"mlflow": mlflow_url, "prefect": prefect_url, "work": work, "worker_log": worker_log}
    finally:
        if worker is not None:  # its runs have ended; prefect 3.8's worker exits only on a second signal
            worker.terminate()
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
        down(work)


def run_deployment(servers: dict, name: str, parameters: dict, timeout: float = 420):
    """Start a run of deployment ``name`` (for the worker to pick up); its final flow run."""
    (run,) = run_deployments(servers, [(name, parameters)], timeout)
    return run


def run_deployments(servers: dict, runs: list[tuple[str, dict]], timeout: float = 420) -> list:
    """Start a run of each (deployment name, parameters) at once; their final flow runs, in order."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: servers["prefect"]}), get_client(sync_client=True) as client:
        started = []
        for name, parameters in runs:
            deployment = client.read_deployment_by_name(name)
            started.append(client.create_flow_run_from_deployment(deployment.id, parameters={
                **deployment.parameters, **parameters}))
        deadline = time.time() + timeout
        while time.time() < deadline:
            ended = [client.read_flow_run(run.id) for run in started]
            if all(run.state is not None and run.state.is_final() for run in ended):
                return ended
            time.sleep(1)
    raise AssertionError(f"{[n for n, _ in runs]} did not finish in {timeout} s; worker: "
                         f"{servers['worker_log'].read_text()[-3000:]}")


SMALL_CAMPAIGN = ["rounds=2", "taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2",
                  "trainer.micro_batch_size=16", "explorer.tasks_per_round=4", "explorer.repeat_times=4",
                  "buffer.expert_per_round=8", "eval.every=1", "promotion.min_accuracy=0"]


def test_prefect_deploy_all_registers_every_deployment_of_prefect_yaml(servers):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: servers["prefect"]}), get_client(sync_client=True) as client:
        deployments = client.read_deployments()
        flows = {f.id: f.name for f in client.read_flows()}
    names = {f"{flows[d.flow_id]}/{d.name}" for d in deployments}
    assert DEPLOYMENTS <= names, names
    nightly = next(d for d in deployments if d.name == "rft-campaign")
    assert [s.schedule.cron for s in nightly.schedules] == ["0 2 * * *"] and nightly.work_pool_name == "rftflow"


def test_the_campaign_deployment_runs_through_the_worker_into_prefect_and_the_mlflow_server(servers):
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    run_dir = servers["work"] / "campaign"
    run = run_deployment(servers, "rft_campaign/rft-campaign", {
        "run_dir": str(run_dir), "overrides": ["name=deployed-{date}", *SMALL_CAMPAIGN]})
    assert run.state.type.value == "COMPLETED", (run.state.message, servers["worker_log"].read_text()[-3000:])
    assert run.name.startswith("deployed-")  # named for people: the campaign and its day
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["prefect_flow_run_id"] == str(run.id) and summary["mlflow_tracking_uri"] == servers["mlflow"]

    with temporary_settings({PREFECT_API_URL: servers["prefect"]}), get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])))
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id])))
    states = {t.name: t.state.type.value for t in tasks}
    stages = ("explore", "verify", "buffer", "train", "sync")  # round 2 as task_runs auto chose from round 1
    round_two = ["round[r=2]"] if summary["task_runs"] == "round" else [f"{stage}[r=2]" for stage in stages]
    for name in [*(f"{stage}[r=1]" for stage in stages), *round_two, "evaluate[r=1]", "evaluate[r=2]"]:
        assert states.get(name) == "COMPLETED", (name, states)
    assert states.get("register[r=2]") == states.get("promote[r=2]") == "COMPLETED"
    keys = {a.key for a in artifacts}
    name = artifact_key(campaign_label(summary["campaign"], run_dir), "a1")  # <name>-<run dir's hash>-a<attempt>
    assert {f"{name}-progress", f"{name}-rounds", f"{name}-summary"} <= keys, keys
    markdown = next(a for a in artifacts if a.key == f"{name}-summary").data
    assert f"{servers['mlflow']}/#/experiments/" in markdown and f"/runs/{summary['mlflow_run_id']}/model-metrics?workflowType=machine_learning)" in markdown

    client = MlflowClient(servers["mlflow"], registry_uri=servers["mlflow"])
    mlflow_run = client.get_run(summary["mlflow_run_id"])
    assert mlflow_run.info.status == "FINISHED" and mlflow_run.info.run_name == f'{campaign_label(summary["campaign"], run_dir)}-a1'
    assert sorted(m.step for m in client.get_metric_history(mlflow_run.info.run_id, "reward/mean")) == [1, 2]
    assert mlflow_run.info.artifact_uri.startswith("mlflow-artifacts:")  # stored by the server, not by the worker
    assert (servers["work"] / "mlartifacts").is_dir()
    version = client.get_model_version(summary["model_name"], summary["model_version"])
    assert version.run_id == mlflow_run.info.run_id and version.tags["promotion.decision"] == "promoted"
    assert client.get_model_version_by_alias(summary["model_name"], "champion").version == version.version

    bench_dir = servers["work"] / "evaluate"
    evaluated = run_deployment(servers, "rft_campaign/evaluate", {
        "run_dir": str(bench_dir), "overrides": ["name=evaluate-{date}", "mode=bench", "taskset.size=300",
                                                 "taskset.eval_size=10", "bench.models=[models:/arith-tiny@champion]"]})
    assert evaluated.state.type.value == "COMPLETED", evaluated.state.message
    (row,) = json.loads((bench_dir / "bench.json").read_text())  # the same held-out split, the same greedy decoding
    assert row["model"] == "models:/arith-tiny@champion" and row["accuracy"] == summary["eval_accuracy_after"]
    (bench_run,) = client.search_runs([mlflow_run.info.experiment_id], "attributes.run_name LIKE 'evaluate-%-bench'")
    assert bench_run.data.metrics == {"bench/accuracy/chain_sum": row["accuracy"]}


def test_a_deployment_run_with_a_bad_override_fails_at_the_gate_in_one_line(servers):
    run_dir = servers["work"] / "bad"
    run = run_deployment(servers, "rft_campaign/rft-campaign", {"run_dir": str(run_dir),
                                                                "overrides": ["trainer.lr=-1"]})
    assert run.state.type.value == "FAILED"
    assert run.state.message == ("--set trainer.lr=-1: config key 'trainer.lr': Input should be greater than 0 "
                                 "(got -1)")  # the CLI's line, naming the override that set it
    assert not run_dir.exists()


def test_a_two_process_trainer_and_two_explorers_run_one_campaign_as_deployments_through_the_worker(servers):
    from rftflow.components.buffer.experiences import ExperienceStore
    from rftflow.components.buffer.store import open_store
    import pyarrow.compute as pc

    work, store = servers["work"] / "sharded", (servers["work"] / "sharded" / "store").as_uri()
    shared = ["name=sharded", "sync.method=checkpoint", "threads=1", "explorer.shards=2", "trainer.processes=2",
              f"storage.url={store}", "sync.timeout_seconds=300", *SMALL_CAMPAIGN]
    runs = run_deployments(servers, [
        ("rft_campaign/arith-mix-trainer", {"run_dir": str(work / "trainer"), "overrides": [*shared, "mode=train"]}),
        *(("rft_campaign/arith-mix-explorer", {"run_dir": str(work / f"explorer-{k}"),
                                               "overrides": [*shared, "mode=explore"]}) for k in (1, 2))])
    for run in runs:
        assert run.state.type.value == "COMPLETED", (run.name, run.state.message,
                                                     servers["worker_log"].read_text()[-3000:])
    summary = json.loads((work / "trainer" / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["prefect_flow_run_id"] == str(runs[0].id)
    usual = ExperienceStore(open_store(store), "sharded", shards=2).read_kind("usual")
    assert pc.count_distinct(usual.column("experience_id")).as_py() == usual.num_rows == 2 * 4 * 4
    rounds = usual.group_by("round").aggregate([("group_id", "count_distinct")]).to_pylist()
    assert sorted((r["round"], r["group_id_count_distinct"]) for r in rounds) == [(1, 4), (2, 4)]
    assert "trainer.processes is" not in servers["worker_log"].read_text()
