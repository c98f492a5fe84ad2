"""``rftflow up`` / ``rftflow down``: a local Prefect server and MLflow server over the embedded
stores, to look at campaigns in a browser.

- Prefect: ``prefect server start`` on ``PREFECT_HOME``'s database — the one every ``rftflow run``
  with the embedded API writes to — so it shows every run made on this machine. Its UI is told
  where its API is (``PREFECT_UI_API_URL``): on a port other than 4200 it would otherwise show
  "Can't connect to Server API".
- MLflow: ``mlflow server`` on ``<run dir>/mlflow.db``, one web worker and no job runner; the
  runs' artifacts stay where they put them, and runs made through the server keep theirs in
  ``<run dir>/mlartifacts`` too (not in the directory ``up`` was started from).

Both listen on 127.0.0.1, run detached (in their own sessions, logs in ``<run dir>/servers/``), and
are recorded in ``<run dir>/servers/servers.json`` for ``down``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


class ServerError(RuntimeError):
    """A server that could not start (the message is one line and names it)."""


@dataclass(frozen=True)
class Server:
    name: str
    url: str  # what a person opens
    health: str  # what answers once it is up
    command: list[str]
    env: dict[str, str]


def servers_for(run_dir: Path, prefect_port: int, mlflow_port: int) -> list[Server]:
    prefect_url, mlflow_url = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    quiet = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_API_URL": f"{prefect_url}/api",
             "PREFECT_UI_URL": prefect_url}
    return [
        Server("prefect", prefect_url, f"{prefect_url}/api/health",
               [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
               quiet),
        # one worker and no job runner: a local server for one person's browser and campaigns; the
        # defaults (4 web workers, a job runner with 7 queue consumers for MLflow's GenAI jobs, which
        # rftflow does not use) start 13 processes that each import MLflow, 4× the CPU to come up
        Server("mlflow", mlflow_url, f"{mlflow_url}/health",
               [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
                "--backend-store-uri", f"sqlite:///{run_dir.resolve() / 'mlflow.db'}",
                "--artifacts-destination", (run_dir.resolve() / "mlartifacts").as_uri(), "--workers", "1"],
               {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}),
    ]


def _port_free(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


def answers(url: str) -> bool:
    """Whether ``url`` answers with a success status now."""
    try:
        urllib.request.urlopen(url, timeout=2)
        return True
    except OSError:
        return False


def up(run_dir: Path, prefect_port: int = 4200, mlflow_port: int = 5000, timeout: float = 120,
       env: dict[str, str] | None = None) -> dict[str, str]:
    """Start both servers (those already recorded as running are left alone) in ``env`` (default
    this process's environment); {name: URL}."""
    folder = run_dir / "servers"
    folder.mkdir(parents=True, exist_ok=True)
    running = {name: rec for name, rec in _read(folder).items() if _alive(rec["pid"])}
    started: dict[str, dict] = {}
    for server in servers_for(run_dir, prefect_port, mlflow_port):
        if server.name in running:
            continue
        if not _port_free(server.url):
            raise ServerError(f"{server.name}: port {server.url.rsplit(':', 1)[1]} on 127.0.0.1 is taken; "
                              f"choose another with --{server.name}-port")
        log = folder / f"{server.name}.log"
        proc = subprocess.Popen(server.command, env={**(os.environ if env is None else env), **server.env},
                                stdout=log.open("w"),
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        started[server.name] = {"pid": proc.pid, "url": server.url, "health": server.health, "log": str(log)}
        _write(folder, {**running, **started})
        if server.name == "prefect":  # campaigns of any run dir on this PREFECT_HOME report to it
            prefect_home().mkdir(parents=True, exist_ok=True)
            _write(prefect_home(), {"prefect": started["prefect"]})
    deadline = time.time() + timeout
    for name, rec in started.items():
        while not answers(rec["health"]):
            if not _alive(rec["pid"]) or time.time() > deadline:
                down(run_dir)
                tail = Path(rec["log"]).read_text().strip().splitlines()[-1:] or ["(empty log)"]
                raise ServerError(f"{name} server did not start ({rec['log']}): {tail[0]}")
            time.sleep(0.5)
    return {name: rec["url"] for name, rec in {**running, **started}.items()}


def down(run_dir: Path, timeout: float = 30) -> list[str]:
    """Stop the servers ``up`` started for ``run_dir`` (their whole process groups); their names."""
    folder = run_dir / "servers"
    stopped = []
    for name, rec in _read(folder).items():
        if _alive(rec["pid"]):
            os.killpg(rec["pid"], signal.SIGTERM)
            deadline = time.time() + timeout
            while _alive(rec["pid"]) and time.time() < deadline:
                time.sleep(0.2)
            if _alive(rec["pid"]):
                os.killpg(rec["pid"], signal.SIGKILL)
            stopped.append(name)
    (folder / "servers.json").unlink(missing_ok=True)
    if "prefect" in stopped:
        (prefect_home() / "servers.json").unlink(missing_ok=True)
    return stopped


def served(run_dir: Path) -> dict[str, str]:
    """The servers that show ``run_dir``'s campaign now: {"mlflow": URL} for the MLflow server
    ``rftflow up`` started over it, {"prefect": URL} for a Prefect server ``rftflow up`` started on
    this ``PREFECT_HOME`` (any run dir's: one Prefect database serves them all); each while it runs."""
    records = {name: rec for name, rec in _read(Path(run_dir) / "servers").items() if name == "mlflow"}
    records.update(_read(prefect_home()))
    return {name: rec["url"] for name, rec in records.items() if _alive(rec["pid"])}


def up_prefect_api() -> str | None:
    """The API URL of the Prefect server ``rftflow up`` runs on this ``PREFECT_HOME``, if it runs."""
    record = _read(prefect_home()).get("prefect")
    return f"{record['url']}/api" if record and _alive(record["pid"]) and answers(record["health"]) else None


def prefect_home() -> Path:
    """Where ``up`` records its Prefect server for every campaign of this ``PREFECT_HOME`` (read
    from the environment, as Prefect does, without importing Prefect: its settings are fixed when
    it is imported, and ``rftflow run`` may still set ``PREFECT_API_URL`` before that)."""
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser() / "rftflow-up"


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # our own child (up and down in one process): reap it
        if done:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(folder: Path) -> dict[str, dict]:
    path = folder / "servers.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _write(folder: Path, records: dict[str, dict]) -> None:
    (folder / "servers.json").write_text(json.dumps(records, indent=2) + "\n")
