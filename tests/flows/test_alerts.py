"""A campaign that dies, as people meet it: SIGKILLed in the middle of a round while ``rftflow up``'s
Prefect server watches it. While it is still alive (held inside a shard write by the kill point,
``components/buffer/kill_point.py``), ``buffer gc --apply`` refuses in one line and deletes
nothing; once it is killed, the stall alert calls the webhook (no round and no end for its
``stall_minutes``); the same command then finishes the campaign and, finding the killed attempt,
marks its flow run Crashed, which calls the webhook's failed-or-crashed alert."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from tests.flows.user import UserRun, clean, lines_with, run_to_end, sets

pytestmark = pytest.mark.slow  # two servers and two runs of a campaign

SMALL = ["taskset.size=300", "taskset.eval_size=10", "trainer.warmup_steps=2", "trainer.micro_batch_size=16",
         "explorer.tasks_per_round=4", "explorer.repeat_times=4", "buffer.expert_per_round=8", "rounds=4",
         "name=dying", "orchestration.task_runs=stage"]
STALL_MINUTES = 0.25  # Prefect's shortest window for a proactive trigger is 10 s


class _Receiver(BaseHTTPRequestHandler):
    calls: list[dict] = []

    def do_POST(self):  # noqa: N802 — http.server's name
        self.calls.append(json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _call(alert: str, bound: float = 300.0) -> dict:
    """The first webhook call of ``alert``, waited for (a generous bound: the server's automations
    run every few seconds)."""
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        found = [c for c in _Receiver.calls if c["alert"] == alert]
        if found:
            return found[0]
        time.sleep(0.5)
    raise AssertionError(f"no {alert!r} webhook call in {bound:.0f} s: {_Receiver.calls}")


@pytest.fixture
def watched(cli_env, tmp_path):
    """``rftflow up`` on a PREFECT_HOME of its own, the alerts created on it (the stall window cut
    to seconds through the Python API; the CLI's shortest is a minute) and a webhook receiver; the
    environment of runs that report to it."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from rftflow.flows.alerts import create_alerts
    from rftflow.infra.ports import free_port

    env = {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "prefect")}
    ports = {"prefect": free_port(), "mlflow": free_port()}
    code, out = run_to_end(["up", str(tmp_path / "servers"), "--prefect-port", str(ports["prefect"]),
                            "--mlflow-port", str(ports["mlflow"])], env=env)
    assert code == 0, out
    receiver = HTTPServer(("127.0.0.1", free_port()), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Receiver.calls = []
    try:
        with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{ports['prefect']}/api"}):
            create_alerts(f"http://127.0.0.1:{receiver.server_address[1]}/hook", stall_minutes=STALL_MINUTES)
        yield env
    finally:
        receiver.shutdown()
        run_to_end(["down", str(tmp_path / "servers")], env=env)


def test_a_sigkilled_campaign_refuses_gc_while_alive_then_alerts_stalled_and_crashed(watched, tmp_path):
    from rftflow.components.buffer.store import open_store

    run_dir, ready = tmp_path / "run", tmp_path / "held"
    args = ["run", "--run-dir", str(run_dir), "--no-progress", *sets(*SMALL)]
    run = UserRun(args, env={**watched, "RFTFLOW_KILL_POINT": "shard:experiences/usual/round=2/",
                             "RFTFLOW_KILL_READY": str(ready)})
    try:
        while not ready.exists():  # held inside round 2's shard write: a campaign running, mid-round
            assert run.proc.poll() is None, run.output[-3000:]
            time.sleep(0.05)
        store = open_store((run_dir / "store").as_uri())
        before = sorted(store.list("dying/"))
        code, out = run_to_end(["buffer", "gc", str(run_dir), "--apply"], env=watched)
        errors = lines_with(out, "error:")
        assert code == 2 and len(errors) == 1 and "campaign 'dying' is running now (pid " in errors[0], out
        assert sorted(store.list("dying/")) == before  # nothing deleted under it
        first_flow_run = re.search(r"/runs/flow-run/([0-9a-f-]{36})", run.output).group(1)
    finally:
        os.killpg(run.proc.pid, signal.SIGKILL)
        run.finish()

    stalled = _call("stalled")
    assert stalled["resource"].startswith("rftflow.campaign.dying-"), stalled

    code, out = run_to_end(args, env=watched)  # the same command: it resumes and finishes
    assert code == 0, out[-3000:]
    clean(out)
    crashed = _call("failed or crashed")
    assert crashed["event"] == "prefect.flow-run.Crashed", crashed
    assert crashed["resource"] == f"prefect.flow-run.{first_flow_run}" and crashed["name"].startswith("dying-"), crashed
