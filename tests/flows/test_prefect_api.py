"""The embedded Prefect API (``flows.prefect_api``): it boots before anyone waits for it and stops
when left; task runs recorded in batches all reach the database of ``PREFECT_HOME``, where a later
server (``prefect server start``) finds them; a recorder write cancelled at stop is no ERROR."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rftflow.flows.prefect_api import quiet_retried_flush

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, os, time, urllib.request
from pathlib import Path
import rftflow.flows
from prefect import flow, get_client, task
from prefect.cache_policies import NO_CACHE
from prefect.settings import PREFECT_API_URL
from rftflow.flows.prefect_api import booting_prefect_api, embedded_prefect_api

@task(cache_policy=NO_CACHE, task_run_name="step[r={i}]")
def step(i):
    return i

@flow(name="recorded")
def recorded(n):
    return [step(i) for i in range(n)]

def servers():  # processes this one launched (its embedded API), by parent pid: one that already
    # exited and waits to be reaped counts too (a server whose port was taken exits at once, and is launched again)
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                found.append(entry.name)
        except (OSError, ValueError, IndexError):
            pass
    return found

with booting_prefect_api() as ready:
    booting, before = servers(), PREFECT_API_URL.value()
    booting_idle = [os.sched_getscheduler(int(pid)) == os.SCHED_IDLE for pid in booting]
    url = ready()
    health = urllib.request.urlopen(url + "/health").status
    idle = [all(os.sched_getscheduler(int(tid)) == os.SCHED_IDLE for tid in os.listdir(f"/proc/{pid}/task"))
            for pid in servers()]
    again, setting = ready(), PREFECT_API_URL.value()
    state = recorded(13, return_state=True)
deadline = time.time() + 10
while servers() and time.time() < deadline:
    time.sleep(0.2)
boot = {"booting": len(booting), "before": before, "url": url, "health": health, "again": again,
        "setting": setting, "after": PREFECT_API_URL.value(), "left": len(servers()), "idle": idle,
        "booting_idle": booting_idle}
with embedded_prefect_api():  # the server above is gone: a new one reads the same database
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs()
print(json.dumps({"boot": boot, "flow": str(state.state_details.flow_run_id),
                  "runs": sorted((r.name, r.state_type.value, str(r.flow_run_id)) for r in runs)}))
"""


@pytest.fixture(scope="module")
def embedded_runs(tmp_path_factory) -> dict:
    """The script above, on a PREFECT_HOME whose folder does not exist yet: its printed result and its stderr."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path_factory.mktemp("prefect") / "home" / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the server process")
def test_the_embedded_api_boots_before_it_is_waited_for_and_stops_when_left(embedded_runs):
    boot = embedded_runs["boot"]
    assert boot["booting"] == 1 and boot["before"] in (None, "")  # launched, not yet the API
    assert boot["health"] == 200 and boot["again"] == boot["url"] == boot["setting"]
    assert boot["after"] in (None, "") and boot["left"] == 0
    # Linux: it boots at normal priority (under SCHED_IDLE a busy machine starved it past its startup deadline),
    # then every thread of it runs only on cores the campaign leaves idle
    assert boot["booting_idle"] == [False] and boot["idle"] == [True]


def test_every_task_run_reaches_prefect_homes_database_after_the_run(embedded_runs):
    stderr = embedded_runs["stderr"]
    assert "Traceback" not in stderr and "ERROR" not in stderr, stderr
    assert embedded_runs["runs"] == sorted([f"step[r={i}]", "COMPLETED", embedded_runs["flow"]] for i in range(13))

def test_a_recorder_write_cancelled_with_every_event_requeued_is_debug_and_a_dropped_event_stays_an_error():
    """The records Prefect's recorder logs (``consumer.flush``), through the server's filter."""
    logger = logging.getLogger("prefect.server.services.task_run_recorder")
    filters, level, seen = list(logger.filters), logger.level, []
    handler = logging.Handler()
    handler.emit = seen.append
    logger.addHandler(handler)
    quiet_retried_flush()

    def flush_error(exc: BaseException, message: str) -> None:
        try:
            raise exc
        except BaseException:
            logger.error(message, exc_info=True)

    try:
        logger.setLevel(logging.WARNING)
        flush_error(asyncio.CancelledError(), "Error flushing 39 events (39 to retry, 0 dropped)")
        flush_error(asyncio.CancelledError(), "Error flushing 3 events (2 to retry, 1 dropped)")
        flush_error(RuntimeError("database is locked"), "Error flushing 39 events (39 to retry, 0 dropped)")
        logger.setLevel(logging.DEBUG)
        flush_error(asyncio.CancelledError(), "Error flushing 5 events (5 to retry, 0 dropped)")
    finally:
        logger.removeHandler(handler)
        logger.filters[:] = filters
        logger.setLevel(level)
    assert [(r.levelname, r.getMessage(), r.exc_info is not None) for r in seen] == [
        ("ERROR", "Error flushing 3 events (2 to retry, 1 dropped)", True),
        ("ERROR", "Error flushing 39 events (39 to retry, 0 dropped)", True),
        ("DEBUG", "Error flushing 5 events (5 to retry, 0 dropped)", False)]


LEFT_WHILE_BOOTING = """
import json, time
from rftflow.flows import prefect_api
from rftflow.flows.prefect_api import booting_prefect_api
ended, stop = [], prefect_api.EmbeddedServer.stop
def recorded_stop(server):  # how the server process ended (called again at exit, when it has none)
    process = server.process
    stop(server)
    if process is not None:
        ended.append(process.returncode)
prefect_api.EmbeddedServer.stop = recorded_stop
for delay in (0.5, 2.5, 4.0):  # a new PREFECT_HOME: the first boot migrates its database for seconds
    with booting_prefect_api():
        time.sleep(delay)
print(json.dumps(ended))
"""


def test_a_server_left_before_it_was_waited_for_is_killed_and_prints_nothing(tmp_path):
    """A refusal in the preflight leaves the booting server: Prefect 3.8 ignores SIGTERM while it
    migrates, and a SIGTERM while its services start fails its shutdown with a traceback; a server
    nobody talked to has nothing to write out, so it is killed (SIGKILL), whenever it is left."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-c", LEFT_WHILE_BOOTING], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-3000:]
    assert json.loads(done.stdout) == [-9, -9, -9]
