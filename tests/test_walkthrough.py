"""docs/own-data.md ("Train on your data") run as written: its ``bash`` blocks, in order, in a
temporary folder outside the repository holding a copy of docs/examples/own-data, the team's module
reachable only through the page's ``PYTHONPATH``. Only the campaign's size is cut (``rftflow run``
gets ``--set`` overrides appended: a few warm-start steps, 2 rounds, 20 held-out tasks); every
command and file is the page's. The error line the page quotes for a module off ``PYTHONPATH`` is checked too."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a campaign through the CLI

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "own-data.md"
SMALLER = ("--set trainer.warmup_steps=20 --set rounds=2 --set explorer.tasks_per_round=8 --set eval.every=2 "
           "--set taskset.eval_size=20 --set threads=1")


def bash_blocks(page: Path) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)


def test_the_walkthrough_runs_as_written_from_a_folder_outside_the_repository(tmp_path):
    team = tmp_path / "team"
    shutil.copytree(ROOT / "docs" / "examples" / "own-data", team)
    (tmp_path / "home").mkdir()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "GX_ANALYTICS_ENABLED": "false", "LANG": "C.UTF-8"}
    # `rftflow run` made small; everything else as the page has it
    script = (f'set -e\nrftflow() {{ if [ "$1" = run ]; then command rftflow "$@" {SMALLER}; '
              'else command rftflow "$@"; fi; }\n' + "\n".join(bash_blocks(PAGE)))
    assert "rftflow run campaign.yaml" in script and "python ask.py" in script
    done = subprocess.run(["bash", "-c", script], cwd=team, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout + done.stderr
    bad = max(out.find("Traceback"), out.find("ERROR"))
    assert bad < 0, out[max(0, bad - 1500):bad + 1500]

    summary = json.loads((team / "runs" / "word-problems" / "summary.json").read_text())
    assert summary["accuracy_by"] == "share of responses with correct ≥ 1" and summary["model_version"] == "1"
    assert "accuracy_by" in done.stdout and "share of responses with correct ≥ 1" in done.stdout
    with sqlite3.connect(team / "runs" / "word-problems" / "mlflow.db") as db:
        keys = {k for (k,) in db.execute("select distinct key from metrics")}
    assert {"reward/fn/correct/mean", "reward/mean", "accuracy/held_out"} <= keys
    assert re.search(r"^Bo has 22 maps and buys 5 more\. How many maps\? = ", done.stdout, re.M)  # ask.py answered

    # the page's first quoted error, as the CLI prints it when the module is not on PYTHONPATH
    quoted = re.search(r"^error: (reward 'teamrewards:correct'.*)$", PAGE.read_text(), re.M).group(1)
    refused = subprocess.run(["rftflow", "run", "campaign.yaml", "--run-dir", "runs/other"], cwd=team,
                             env={**env, "COLUMNS": "400"}, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and quoted in refused.stdout + refused.stderr, refused.stderr[-2000:]
    assert "Traceback" not in refused.stderr
    assert os.listdir(team / "runs") == ["word-problems"]  # refused before anything was written
