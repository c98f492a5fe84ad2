"""Two explorer processes share each round (``explorer.shards: 2``, leases in the store) and a
trainer process trains on what they commit: the store (S3 over HTTP, and file://) holds every
experience exactly once, also when one explorer is SIGKILLed mid-round and the other takes its
shard over after the lease expires."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

pytestmark = pytest.mark.slow

ROUNDS, TASKS, REPEAT = 4, 16, 4
ROOT = Path(__file__).resolve().parents[2]


def _start(cli_env, config, run_dir: Path, mode: str, shared: list[str]) -> subprocess.Popen:
    args = [sys.executable, "-m", "rftflow.flows.cli", "run", str(config), "--run-dir", str(run_dir), "--no-progress",
            "--mode", mode, *[a for s in shared for a in ("--set", s)]]
    return subprocess.Popen(args, cwd=ROOT, env=cli_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own group: a SIGKILL reaches all of it


def _campaign(cli_env, tmp_path, default_config, small, on_poll=None, store: list[str] | None = None,
              lease_seconds: float = 5) -> dict[str, tuple[int, str]]:
    """Two explorers, then — once both have begun their flow runs, so that both are there when the
    trainer's taskset and weights open round 1 — the trainer, until all end (``on_poll(procs)``
    between looks); each one's (exit code, output). ``store``: the store's settings (default a
    file:// URL)."""
    store = store or [f"storage.url={(tmp_path / 'store').as_uri()}"]
    shared = [*small, f"rounds={ROUNDS}", "sync.method=checkpoint", "sync.offset=1", "algorithm.max_staleness=1",
              "trainer.warmup_steps=10", "eval.every=4", "checkpoint.every=4", *store, "threads=1",
              "sync.timeout_seconds=300", "explorer.shards=2", f"explorer.lease_seconds={lease_seconds}",
              f"explorer.tasks_per_round={TASKS}", f"explorer.repeat_times={REPEAT}", "explorer.max_new_tokens=48"]
    procs, lines, readers = {}, {}, {}

    def start(name: str, mode: str) -> None:
        procs[name] = _start(cli_env, default_config, tmp_path / name, mode, shared)
        lines[name] = []
        readers[name] = threading.Thread(target=lambda: lines[name].extend(procs[name].stdout), daemon=True)
        readers[name].start()

    start("explorer-a", "explore")
    start("explorer-b", "explore")
    outputs: dict[str, tuple[int, str]] = {}
    while len(outputs) < 3:
        if "trainer" not in procs and all(any("Beginning flow run" in line for line in lines[name])
                                          for name in ("explorer-a", "explorer-b")):
            start("trainer", "train")
        if on_poll is not None:
            on_poll(procs)
        for name, proc in procs.items():
            if name not in outputs and proc.poll() is not None:
                readers[name].join(timeout=60)  # its output to the end (the pipe closes with the process group)
                outputs[name] = (proc.returncode, "".join(lines[name]))
                if proc.returncode not in (0, -signal.SIGKILL):  # one failing: the others are stopped
                    for other in procs.values():
                        other.poll() is None and os.killpg(other.pid, signal.SIGTERM)
                    if "trainer" not in procs:
                        return outputs
        time.sleep(0.02)
    return outputs


def _round_and_shard(lease_key: str) -> tuple[int, int]:
    """``<campaign>/leases/round=N/shard-K/gG.json`` → (N, K)."""
    round_part, shard_part = lease_key.split("/")[2:4]
    return int(round_part.removeprefix("round=")), int(shard_part.removeprefix("shard-"))


def _check_exactly_once(objects) -> dict[tuple[int, int], list[dict]]:
    """Every round's groups are stored once each in ``objects`` (two parts, TASKS × REPEAT rows,
    unique ids); returns the leases by (round, shard)."""
    from rftflow.components.buffer.experiences import ExperienceStore

    usual = ExperienceStore(objects, "arith-mix", shards=2).read_kind("usual")
    assert pc.count_distinct(usual.column("experience_id")).as_py() == usual.num_rows
    for r in range(1, ROUNDS + 1):
        rows = usual.filter(pc.equal(usual.column("round"), r))
        groups = rows.group_by("group_id").aggregate([([], "count_all")])
        assert groups.num_rows == TASKS and set(groups.column("count_all").to_pylist()) == {REPEAT}, r
        assert len([k for k in objects.list(f"arith-mix/experiences/usual/round={r}/_commit/")]) == 2
    leases = {}
    for key in objects.list("arith-mix/leases/"):
        r, shard = _round_and_shard(key)
        leases.setdefault((r, shard), []).append(json.loads(objects.get(key)))
    return leases


def test_two_explorers_share_the_rounds_on_s3_and_the_store_holds_each_experience_once(cli_env, tmp_path,
                                                                                      default_config, small,
                                                                                      s3_server, s3_bucket):
    from mlflow import MlflowClient

    from rftflow.components.buffer.store import open_store

    # leases of 60 s: a shard is taken over only from an explorer silent for a minute (none here)
    outputs = _campaign({**cli_env, **s3_server.env}, tmp_path, default_config, small, lease_seconds=60,
                        store=[f"storage.url=s3://{s3_bucket}/c", f"storage.endpoint_url={s3_server.endpoint_url}",
                               "storage.addressing_style=path"])
    for name, (code, out) in outputs.items():
        assert code == 0, f"{name}: {out[-3000:]}"
        assert "Traceback" not in out and "ERROR" not in out, f"{name}: {out[-3000:]}"
    leases = _check_exactly_once(open_store(f"s3://{s3_bucket}/c", endpoint_url=s3_server.endpoint_url))
    owners = {lease["owner"] for held in leases.values() for lease in held}
    assert len(owners) == 2  # both explorers explored shards
    assert all(len(held) == 1 for held in leases.values())  # nobody's lease was taken over
    # the trainer drew the explorers' rows every round (their staleness is measured only on drawn
    # rows), none older than algorithm.max_staleness, none dropped
    summary = json.loads((tmp_path / "trainer" / "summary.json").read_text())
    client = MlflowClient(summary["mlflow_tracking_uri"])
    history = {key: {m.step: m.value for m in client.get_metric_history(summary["mlflow_run_id"], key)}
               for key in ("sample/staleness_max", "sample/dropped_stale")}
    assert sorted(history["sample/staleness_max"]) == list(range(1, ROUNDS + 1)), history
    assert set(history["sample/staleness_max"].values()) <= {0.0, 1.0}, history
    assert set(history["sample/dropped_stale"].values()) == {0.0}, history


def test_a_sigkilled_explorers_shard_is_taken_over_and_nothing_is_lost_or_doubled(cli_env, tmp_path, default_config,
                                                                                small):
    from rftflow.components.buffer.store import open_store

    objects = open_store((tmp_path / "store").as_uri())
    killed: list[str] = []

    def kill_mid_round(procs) -> None:  # SIGKILL the explorer holding a shard of round >= 2 not yet committed
        if killed:
            return
        by_pid = {str(proc.pid): name for name, proc in procs.items() if name != "trainer" and proc.poll() is None}
        for key in objects.list("arith-mix/leases/"):
            r, shard = _round_and_shard(key)
            try:
                holder = by_pid.get(json.loads(objects.get(key))["owner"].split("-")[-2])
            except (KeyError, ValueError):
                continue
            committed = objects.exists(f"arith-mix/experiences/usual/round={r}/_commit/part-{shard:05d}.json")
            if r >= 2 and holder is not None and not committed:
                os.killpg(procs[holder].pid, signal.SIGKILL)
                killed.append(holder)
                return

    outputs = _campaign(cli_env, tmp_path, default_config, small, on_poll=kill_mid_round)
    assert killed, f"no explorer held an uncommitted shard of round >= 2: {outputs}"
    victim, = killed
    survivor = "explorer-a" if victim == "explorer-b" else "explorer-b"
    assert outputs[victim][0] == -signal.SIGKILL
    for name in (survivor, "trainer"):
        code, out = outputs[name]
        assert code == 0 and "Traceback" not in out, f"{name}: {out[-3000:]}"
    assert "took over shard" in outputs[survivor][1]
    leases = _check_exactly_once(objects)
    assert any(len(held) == 2 for held in leases.values())  # a generation 1: the shard taken over
