"""Upgrades keep campaigns: a run dir and store written by rftflow 0.1 (the code before the
``rftflow`` package; ``tests/fixtures/upgrade-0.1``, made by its ``make.py``: a campaign SIGKILLed
after round 3's train) resumes under this version with the same command and runs to its end."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.flows.user import run_to_end

pytestmark = pytest.mark.slow  # a campaign through the CLI

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "upgrade-0.1"
MADE_AT = "/tmp/upgrade-fixture/upgrade-0.1"  # where make.py wrote it: MLflow keeps absolute artifact paths


def _moved(to: Path) -> Path:
    """The fixture copied to ``to``, its absolute paths (MLflow's artifact locations, store.json)
    pointing there: the run dir as it was on the machine that made it."""
    shutil.copytree(FIXTURE, to)
    with sqlite3.connect(to / "run" / "mlflow.db") as db:
        db.execute("update experiments set artifact_location = replace(artifact_location, ?, ?)", (MADE_AT, str(to)))
        db.execute("update runs set artifact_uri = replace(artifact_uri, ?, ?)", (MADE_AT, str(to)))
    store = to / "run" / "store.json"
    store.write_text(store.read_text().replace(MADE_AT, str(to)))
    return to


def test_a_campaign_killed_under_0_1_resumes_to_its_end(cli_env, tmp_path):
    from mlflow import MlflowClient

    from rftflow import __version__
    from rftflow.components.buffer.experiences import open_campaign

    home = _moved(tmp_path / "upgrade")
    command = ["run", "campaign.yaml", "--run-dir", "run", "--no-progress"]
    code, out = run_to_end(command, env=cli_env, cwd=home)  # the 0.1 config file names a key that moved
    assert code == 2 and out.strip().splitlines() == [
        "error: campaign.yaml: config key 'task_runs' moved to 'orchestration.task_runs'"], out
    config = home / "campaign.yaml"  # as its user mends it; the stored config keeps the old key
    config.write_text(config.read_text().replace("task_runs: stage", "orchestration: {task_runs: stage}"))
    code, out = run_to_end(command, env=cli_env, cwd=home)
    assert code == 0 and "Traceback" not in out, out[-3000:]
    summary = json.loads((home / "run" / "summary.json").read_text())
    assert summary["resumed_from_round"] == 2 and summary["rounds"] == 4
    store = open_campaign(home / "run", "upgrade")
    usual = store.read_kind("usual")
    per_round = usual.group_by("round").aggregate([([], "count_all")]).to_pylist()
    assert sorted((r["round"], r["count_all"]) for r in per_round) == [(r, 16) for r in range(1, 5)]
    client = MlflowClient(summary["mlflow_tracking_uri"])
    (run,) = client.search_runs([client.get_experiment_by_name("rftflow").experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["rftflow.version"] == __version__
    from rftflow.components.campaign.state import StateStore

    state = StateStore(store.objects, "upgrade").read()
    assert [(a.outcome, a.version) for a in state.attempts] == [("killed", None), ("finished", __version__)]
