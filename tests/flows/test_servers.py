"""``rftflow up`` / ``rftflow down``: a real Prefect server (its UI told where its API is, on a port
other than 4200) and a real MLflow server over a run dir's mlflow.db, started in the background
and stopped again; a taken port fails in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from rftflow.infra.ports import free_port

pytestmark = pytest.mark.slow  # two servers start

ROOT = Path(__file__).resolve().parents[2]


def rftflow(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rftflow.flows.cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_up_serves_the_run_dirs_mlflow_and_prefect_homes_runs_and_down_stops_them(tmp_path):
    from rftflow.components.tracking import Tracker

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    tracker = Tracker(f"sqlite:///{run_dir / 'mlflow.db'}", "rftflow", "shown", artifact_root=run_dir / "mlartifacts")
    tracker.log_metrics({"reward/mean": 0.5}, step=1)
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    prefect_port, mlflow_port = free_port(), free_port()
    started = rftflow("up", str(run_dir), "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port), env=env)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"Prefect UI  http://127.0.0.1:{prefect_port}" in started.stdout
        assert f"MLflow UI   http://127.0.0.1:{mlflow_port}" in started.stdout
        settings = json.load(urllib.request.urlopen(f"http://127.0.0.1:{prefect_port}/ui-settings", timeout=10))
        assert settings["api_url"] == f"http://127.0.0.1:{prefect_port}/api"  # else "Can't connect to Server API"
        from mlflow import MlflowClient

        served = MlflowClient(f"http://127.0.0.1:{mlflow_port}")
        assert served.get_run(tracker.run_id).data.metrics == {"reward/mean": 0.5}
        again = rftflow("up", str(run_dir), "--prefect-port", str(prefect_port), "--mlflow-port", str(mlflow_port),
                        env=env)  # already up: nothing new starts, the same URLs
        assert again.returncode == 0 and f"http://127.0.0.1:{mlflow_port}" in again.stdout
        pids = [r["pid"] for r in json.loads((run_dir / "servers" / "servers.json").read_text()).values()]
        assert len(pids) == 2
    finally:
        stopped = rftflow("down", str(run_dir), env=env)
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped: prefect, mlflow"
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    for port in (prefect_port, mlflow_port):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0


def test_up_on_a_taken_port_fails_in_one_line_naming_it(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = rftflow("up", str(tmp_path / "run"), "--prefect-port", str(port), "--mlflow-port",
                         str(free_port()), env={**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")})
    assert result.returncode == 1
    assert result.stderr.strip() == (f"error: prefect: port {port} on 127.0.0.1 is taken; choose another with "
                                     "--prefect-port")
