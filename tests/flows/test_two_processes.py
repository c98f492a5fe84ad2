"""One campaign as two OS processes that share nothing but the store: ``rftflow run --mode train``
and ``rftflow run --mode explore`` (weights through the store), each with its own run dir, Prefect
flow run and torch threads. Every trained batch's staleness is within ``algorithm.max_staleness``,
checked from the stored rows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

pytestmark = pytest.mark.slow

ROUNDS = 4


def test_explorer_and_trainer_processes_complete_one_campaign(cli_env, tmp_path, default_config, small):
    store = (tmp_path / "store").as_uri()
    shared = [*small, f"rounds={ROUNDS}", "sync.method=checkpoint", "sync.offset=1", "algorithm.max_staleness=1",
              "trainer.warmup_steps=20", "eval.every=2", "checkpoint.every=2", f"storage.url={store}", "threads=1",
              "sync.timeout_seconds=300"]
    procs = {}
    for mode in ("explore", "train"):  # the explorer first: it waits for the trainer's taskset and weights
        args = [sys.executable, "-m", "rftflow.flows.cli", "run", str(default_config), "--run-dir", str(tmp_path / mode),
                "--no-progress", "--mode", mode, *[a for s in shared for a in ("--set", s)]]
        procs[mode] = subprocess.Popen(args, cwd=Path(__file__).resolve().parents[2], env=cli_env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    outputs = {}
    while len(outputs) < len(procs):  # one failing: the other is stopped, not left waiting for it
        for mode, proc in procs.items():
            if mode not in outputs and proc.poll() is not None:
                outputs[mode] = proc.stdout.read()
                if proc.returncode != 0:
                    for other in procs.values():
                        other.poll() is None and other.terminate()
        time.sleep(0.5)
    for mode, proc in procs.items():
        assert proc.returncode == 0, f"--mode {mode}: {outputs[mode][-3000:]}"
        assert "Traceback" not in outputs[mode]
    summaries = {mode: json.loads((tmp_path / mode / "summary.json").read_text()) for mode in procs}
    assert summaries["explore"]["mode"] == "explore" and summaries["train"]["mode"] == "train"
    assert summaries["explore"]["prefect_flow_run_id"] != summaries["train"]["prefect_flow_run_id"]
    assert summaries["train"]["eval_accuracy_after"] is not None and summaries["train"]["model_version"] == "1"

    from rftflow.components.buffer.experiences import ExperienceStore
    from rftflow.components.buffer.store import open_store

    usual = ExperienceStore(open_store(store), "arith-mix").read_kind("usual")
    for r in range(1, ROUNDS + 1):  # the trainer trains round r at version r (1 after the warm start, +1 a round)
        versions = set(usual.filter(pc.equal(usual.column("round"), r)).column("model_version").to_pylist())
        assert versions and all(0 <= r - v <= 1 for v in versions), (r, versions)
    assert pc.count_distinct(usual.column("experience_id")).as_py() == usual.num_rows
