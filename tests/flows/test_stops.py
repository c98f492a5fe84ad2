"""Stopping a campaign the ways people do, then resuming it with the same command.

Ctrl-C in a terminal is SIGINT to the whole foreground process group, the embedded Prefect server
included when no ``PREFECT_API_URL`` is set; a supervisor (``timeout``, systemd) signals the group
with SIGTERM; the Prefect UI's Cancel (or ``prefect flow-run cancel``) cancels the flow run. Each
must end the run at a safe point within seconds: exit 130, one "stopped … resume with the same
command" line naming where it stopped, no traceback or ERROR line, no process of its group left
running (its pids, read from /proc before the signal), the flow run CANCELLED (never left
RUNNING), and the same command then finishes the campaign with every round stored once and one
MLflow run FINISHED. "Within seconds" is checked by where it stopped (the step its line names),
not by a clock."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.flows.processes import family, outliving
from tests.flows.user import ROOT, UserRun, clean, lines_with, run_to_end, sets

pytestmark = pytest.mark.slow  # eight real runs of the CLI

ROUNDS = 4
CAMPAIGN = ["rounds=4", "taskset.size=300", "taskset.eval_size=10", "trainer.micro_batch_size=16",
            "explorer.tasks_per_round=4", "explorer.repeat_times=4",
            "buffer.expert_per_round=8", "checkpoint.every=2", "eval.every=2", "orchestration.task_runs=stage"]
# the warm start's steps: long enough to be stopped inside it (the Ctrl-C test); a few where the stop comes later
WARM_STEPS, FEW_WARM_STEPS = 150, 10
# how long a run may take to reach what a test waits for: a bound for a loaded machine, never the
# assertion (where a run stopped is read from its line, not from a clock)
BOUND = 1800
STOPPED = re.compile(r"stopped: campaign (\S+) stopped \((\w[\w ]*)\) (.+); resume with the same command \(from (.+)\)")


@pytest.fixture
def embedded_env(cli_env, tmp_path):
    """No ``PREFECT_API_URL``: each run starts its own Prefect server, on a ``PREFECT_HOME`` of its own."""
    env = {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home")}


@pytest.fixture
def started():
    """Registers a test's runs (``started(UserRun(...))``); those still running when it ends, as
    after a failed assert, are killed with their group."""
    runs = []
    yield lambda run: runs.append(run) or run
    for run in runs:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()


def _args(run_dir, name: str, *extra: str, progress: bool = False, warmup_steps: int = FEW_WARM_STEPS) -> list[str]:
    return ["run", "--run-dir", str(run_dir), *([] if progress else ["--no-progress"]),
            *sets(*CAMPAIGN, f"trainer.warmup_steps={warmup_steps}", f"name={name}", *extra)]


def _stopped(code: int, out: str, group: set[int]) -> re.Match:
    """The stopped run's one line, parsed; it exited 130 cleanly and no process of its ``group``
    (its process group and descendants before the signal) outlived it."""
    assert code == 130, out[-3000:]
    assert not outliving(group), f"processes of the stopped run's group still run: {outliving(group, 0)}"
    clean(out)
    found = [m for m in map(STOPPED.search, out.splitlines()) if m]
    assert len(found) == 1 and len(lines_with(out, "stopped:")) == 1, out[-3000:]
    return found[0]


def _whole(run_dir, name: str, store=None, rounds: int = ROUNDS) -> dict:
    """Every round stored once, one MLflow run FINISHED with one value per metric and step; the summary."""
    from mlflow import MlflowClient

    from rftflow.components.buffer.experiences import ExperienceStore

    from rftflow.components.buffer.layout import recorded_store
    from rftflow.components.buffer.store import open_store

    summary = json.loads((run_dir / "summary.json").read_text())
    url, options = recorded_store(run_dir)
    usual = ExperienceStore(store or open_store(url, **options), name).read_kind("usual")
    per_round = usual.group_by("round").aggregate([([], "count_all")]).to_pylist()
    assert sorted((r["round"], r["count_all"]) for r in per_round) == [(r, 16) for r in range(1, rounds + 1)]
    ids = usual.column("experience_id").to_pylist()
    assert len(ids) == len(set(ids))
    client = MlflowClient(summary["mlflow_tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("rftflow").experiment_id])
    assert [(r.info.run_id, r.info.status) for r in runs] == [(summary["mlflow_run_id"], "FINISHED")]
    for key in runs[0].data.metrics:
        steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at one step: {steps}"
    return summary


def _flow_runs(prefect_home) -> list[str]:
    """The state of every flow run in an embedded server's database, oldest first."""
    with sqlite3.connect(prefect_home / "prefect.db") as db:
        return [row[0] for row in db.execute("select state_type from flow_run order by created")]


def test_ctrl_c_in_the_warm_start_stops_at_once_and_the_same_command_resumes(embedded_env, tmp_path, started):
    run_dir = tmp_path / "run"
    args = _args(run_dir, "ctrlc", progress=True, warmup_steps=WARM_STEPS)
    run = started(UserRun(args, env=embedded_env, tty=True))  # progress bars on, as in a terminal
    run.wait_for("warm start", timeout=BOUND)
    group = family(run.proc.pid)
    assert len(group) >= 2, group  # the CLI and its embedded Prefect server
    run.interrupt()
    code, out = run.finish(BOUND)
    line = _stopped(code, out, group)
    assert line.group(2) == "SIGINT" and re.fullmatch(r"at step \d+ of the warm start", line.group(3))
    assert int(line.group(3).split()[2]) < WARM_STEPS  # inside the warm start, not after it
    assert line.group(4) == line.group(3).removeprefix("at ")  # the warm start checkpointed where it stopped
    code, out = run_to_end(args, env=embedded_env, tty=True, timeout=BOUND)
    assert code == 0, out[-3000:]
    clean(out)
    assert "rounds" in out and "campaign ctrlc" in out  # the bars, then the summary table
    summary = _whole(run_dir, "ctrlc")
    assert summary["attempts"] == 2
    assert _flow_runs(tmp_path / "prefect-home") == ["CANCELLED", "COMPLETED"]


def test_a_supervisor_sigterm_to_the_group_mid_round_stops_after_the_stage(embedded_env, tmp_path, started):
    run_dir = tmp_path / "run"
    args = _args(run_dir, "sigterm")
    run = started(UserRun(args, env=embedded_env))
    run.wait_for("Task run 'explore[r=3]' - Finished", timeout=BOUND)
    group = family(run.proc.pid)
    assert len(group) >= 2, group  # the CLI and its embedded Prefect server
    run.interrupt(signal.SIGTERM)
    code, out = run.finish(BOUND)
    line = _stopped(code, out, group)
    assert line.group(2) == "SIGTERM"
    assert re.fullmatch(r"after round 3 (explore|verify|buffer|train|sync)", line.group(3)), line.group(3)
    assert line.group(4) == "the checkpoint of round 2"
    assert lines_with(out, "Finished in state Cancelled(") and not lines_with(out, "Finished in state Failed(")
    code, out = run_to_end(args, env=embedded_env, timeout=BOUND)
    assert code == 0, out[-3000:]
    clean(out)
    assert _whole(run_dir, "sigterm")["resumed_from_round"] == 2
    assert _flow_runs(tmp_path / "prefect-home") == ["CANCELLED", "COMPLETED"]


def test_ctrl_c_during_a_slow_checkpoint_write_lets_it_finish_and_resumes_from_it(cli_env, tmp_path, s3_server,
                                                                                 s3_bucket, started):
    from rftflow.components.buffer.store import open_store
    from rftflow.components.buffer.weights import WeightStore
    from tests.faultproxy import FaultProxy

    direct = open_store(f"s3://{s3_bucket}/c", endpoint_url=s3_server.endpoint_url)
    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy:
        env = {**cli_env, **s3_server.env}  # the shared Prefect server: the write is what is stopped
        args = _args(tmp_path / "run", "ckpt", f"storage.url=s3://{s3_bucket}/c", "storage.addressing_style=path",
                     f"storage.endpoint_url={proxy.endpoint_url}")
        run = started(UserRun(args, env=env))
        run.wait_for("Task run 'evaluate[r=2]' - Finished", timeout=BOUND)
        proxy.forward(delay=0.05)  # the store slows to a crawl: the checkpoint write takes seconds
        deadline = time.monotonic() + BOUND
        while not direct.list("ckpt/checkpoints/v000003/"):  # round 2's checkpoint has begun
            assert time.monotonic() < deadline, run.output[-3000:]
            time.sleep(0.02)
        assert not direct.exists("ckpt/checkpoints/v000003/checkpoint.json")  # not committed yet
        group = family(run.proc.pid)
        run.interrupt()
        code, out = run.finish(BOUND)
        proxy.forward()
        line = _stopped(code, out, group)
        assert line.group(3) == "after round 2 checkpoint" and line.group(4) == "the checkpoint of round 2"
        assert [m["round"] for m in WeightStore(direct, "ckpt").checkpoints()][-1] == 2  # it completed
        code, out = run_to_end(args, env=env, timeout=BOUND)
        assert code == 0, out[-3000:]
        clean(out)
        assert _whole(tmp_path / "run", "ckpt", store=direct)["resumed_from_round"] == 2


def test_a_cancel_in_prefect_stops_the_campaign_and_the_same_command_resumes(cli_env, tmp_path, started):
    run_dir = tmp_path / "run"
    # rounds enough for `prefect flow-run cancel` to start up (seconds) while they run
    args = _args(run_dir, "cancelled", "rounds=60", "eval.every=30", "checkpoint.every=30")
    run = started(UserRun(args, env=cli_env))  # on the shared Prefect server, as a team's runs are
    run.wait_for("Task run 'explore[r=2]' - Finished", timeout=BOUND)
    flow_run_id = re.search(r"/runs/flow-run/([0-9a-f-]{36})", run.output).group(1)
    group = family(run.proc.pid)
    cancel = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "cancel", flow_run_id], env=cli_env,
                            capture_output=True, text=True, cwd=ROOT)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    code, out = run.finish(BOUND)
    line = _stopped(code, out, group)
    assert line.group(2) == "cancelled in Prefect" and line.group(3).startswith("after round ")
    code, out = run_to_end(args, env=cli_env, timeout=BOUND)
    assert code == 0, out[-3000:]
    clean(out)
    _whole(run_dir, "cancelled", rounds=60)
    flow_run = httpx.get(f"{cli_env['PREFECT_API_URL']}/flow_runs/{flow_run_id}", timeout=30).json()
    assert flow_run["state"]["type"] == "CANCELLED"
    from rftflow.components.buffer.layout import recorded_store
    from rftflow.components.campaign.state import StateStore
    from rftflow.components.buffer.store import open_store

    state = StateStore(open_store(recorded_store(run_dir)[0]), "cancelled").read()
    assert [a.outcome for a in state.attempts] == ["interrupted", "finished"]
    assert state.attempts[0].error == line.group(0).removeprefix("stopped: ")
