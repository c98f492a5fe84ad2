"""Fixtures for tests that run the real CLI in subprocesses."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import urllib.request

import pytest


@pytest.fixture(scope="session")
def cli_env(tmp_path_factory):
    """The environment of ``rftflow`` subprocesses: one real ``prefect server start`` for all of
    them (so each run does not start a Prefect API of its own), this process's torch threads
    (``OMP_NUM_THREADS``: one in an xdist worker, see tests/conftest.py; else two), INFO lines on
    the console (tests follow Prefect's "Task run … Finished" lines; an in-process CLI test may
    have set the console level to WARNING in this process's environment)."""
    home = tmp_path_factory.mktemp("prefect")
    base = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "INFO", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
            "PYTHONUNBUFFERED": "1"}
    port = 4200 + random.Random().randrange(1000, 5000)
    # at nice 10 (rftflow's own embedded server runs at SCHED_IDLE; this one answers the API calls of
    # several CLI runs at once, so it is not starved): its bookkeeping yields the cores to the runs
    server = subprocess.Popen(["nice", "-n", "10", sys.executable, "-m", "prefect", "server", "start", "--host",
                               "127.0.0.1", "--port", str(port), "--no-services"], env=base,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/api"
    for _ in range(240):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except OSError:
            time.sleep(0.5)
    yield {**base, "PREFECT_API_URL": url}
    server.terminate()
    server.wait(timeout=30)
