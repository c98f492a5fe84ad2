"""The embedded Prefect API (``flows.prefect_api``): task runs recorded in batches all reach the
database of ``PREFECT_HOME``, where a later server (``prefect server start``) finds them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import flows
from prefect import flow, get_client, task
from prefect.cache_policies import NO_CACHE
from flows.prefect_api import embedded_prefect_api

@task(cache_policy=NO_CACHE, task_run_name="step[r={i}]")
def step(i):
    return i

@flow(name="recorded")
def recorded(n):
    return [step(i) for i in range(n)]

with embedded_prefect_api():
    state = recorded(13, return_state=True)
with embedded_prefect_api():  # the server above is gone: a new one reads the same database
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs()
print(json.dumps({"flow": str(state.state_details.flow_run_id),
                  "runs": sorted((r.name, r.state_type.value, str(r.flow_run_id)) for r in runs)}))
"""


def test_every_task_run_reaches_prefect_homes_database_after_the_run(tmp_path):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "ERROR" not in done.stderr, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["runs"] == sorted([f"step[r={i}]", "COMPLETED", result["flow"]] for i in range(13))
