"""Make the screenshots of docs/operations/monitoring.md: ``rftflow up`` over a fresh run dir, a
short campaign reporting to it, then headless Chromium on the pages a user opens.

    python docs/screenshots.py            # writes docs/operations/img/*.png (needs Debian's chromium)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "operations" / "img"
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def shoot(url: str, name: str, profile: Path, height: int = 1000, wait_ms: int = 30000) -> None:
    subprocess.run([*CHROMIUM, f"--user-data-dir={profile}", f"--screenshot={OUT / name}",
                    f"--window-size=1440,{height}", f"--virtual-time-budget={wait_ms}", url],
                   check=True, capture_output=True, timeout=120)
    print(f"{OUT / name}  ←  {url}")


def api(url: str, body: dict | None = None):
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST" if body else "GET")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def main() -> None:
    from rftflow.infra.ports import free_port

    OUT.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rftflow-shots-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING"))}
    env |= {"PREFECT_HOME": str(work / "prefect"), "PYTHONUNBUFFERED": "1"}
    prefect, mlflow = free_port(), free_port()
    rftflow = [sys.executable, "-m", "rftflow.flows.cli"]
    run_dir = work / "runs" / "arith-mix"
    subprocess.run([*rftflow, "up", str(run_dir), "--prefect-port", str(prefect), "--mlflow-port", str(mlflow)],
                   env=env, check=True)
    try:
        subprocess.run([*rftflow, "run", "--run-dir", str(run_dir), "--no-progress", "--set", "rounds=20",
                        "--set", "trainer.warmup_steps=1500", "--set", "eval.every=5", "--set", "promotion.min_accuracy=0"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        ui, ml = f"http://127.0.0.1:{prefect}", f"http://127.0.0.1:{mlflow}"
        (flow_run,) = api(f"{ui}/api/flow_runs/filter", {"flow_runs": {"name": {"like_": "arith-mix-%"}}})
        profile = work / "chromium"
        shoot(f"{ui}/runs/flow-run/{flow_run['id']}", "prefect-flow-run.png", profile)
        # the flow run's Artifacts tab cannot be linked to (the UI falls back to Logs while it loads):
        # the Artifacts page lists the same cards, and the round table's own page shows it
        shoot(f"{ui}/artifacts", "prefect-artifacts.png", profile, height=700)
        (table,) = api(f"{ui}/api/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]},
                                                                   "type": {"any_": ["table"]}}})
        shoot(f"{ui}/artifacts/artifact/{table['id']}", "prefect-rounds.png", profile, height=1100)
        summary = json.loads((run_dir / "summary.json").read_text())
        experiment = api(f"{ml}/api/2.0/mlflow/experiments/get-by-name?experiment_name=rftflow")["experiment"]
        shoot(f"{ml}/#/experiments/{experiment['experiment_id']}/runs?workflowType=machine_learning",
              "mlflow-experiment.png", profile)
        shoot(f"{ml}/#/experiments/{experiment['experiment_id']}/runs/{summary['mlflow_run_id']}/model-metrics"
              "?workflowType=machine_learning", "mlflow-model-metrics.png", profile, height=1400, wait_ms=90000)
        shoot(f"{ml}/#/models/{summary['model_name']}/versions/{summary['model_version']}", "mlflow-model-version.png",
              profile)
    finally:
        subprocess.run([*rftflow, "down", str(run_dir)], env=env, check=False)
        time.sleep(1)


if __name__ == "__main__":
    main()
