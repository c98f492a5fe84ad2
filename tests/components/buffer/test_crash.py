"""A shard writer SIGKILLed at random moments (a random number of parts in, plus a random delay that
lands inside the next write) never leaves readers a partial or corrupt shard, and
re-running the same writes completes with every row exactly once (file:// and S3)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rftflow.components.buffer.shards import COMMIT_DIR, committed_shards, read_committed, read_shard
from rftflow.components.buffer.store import open_store

pytestmark = pytest.mark.slow  # SIGKILL trials in subprocesses

ROOT = Path(__file__).resolve().parents[3]
PARTS, ROWS, TRIALS = 32, 1500, 5
PREFIX = "crash/experiences/usual/round=1"

# The writer: the same shards, in order, every run (deterministic content, as a re-run would be).
WRITER = """
import json, sys
import numpy as np
import pyarrow as pa
from rftflow.components.buffer.shards import write_shard
from rftflow.components.buffer.store import open_store

url, options, prefix, parts, rows = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
store = open_store(url, **options)
store.exists(prefix + "/_commit/part-00000.json")  # connect (and import boto3) before the clock starts
print("ready", flush=True)
for part in range(parts):
    ids = np.arange(part * rows, (part + 1) * rows, dtype=np.int64)
    tokens = ((ids[:, None] * 31 + np.arange(48)) % 50_000).astype(np.int32)
    table = pa.table({
        "id": ids,
        "response": [f"answer {i} " * (1 + i % 7) for i in ids.tolist()],
        "response_ids": pa.ListArray.from_arrays(np.arange(0, tokens.size + 1, 48, dtype=np.int32), tokens.ravel()),
    })
    write_shard(store, prefix, table, part)
    print(f"wrote {part}", flush=True)
print("done", flush=True)
"""


@pytest.fixture(params=["file", "s3"])
def target(request, tmp_path):
    """(url, options) of an empty store of each backend."""
    if request.param == "file":
        return (tmp_path / "store").as_uri(), {}
    server = request.getfixturevalue("s3_server")
    return f"s3://{request.getfixturevalue('s3_bucket')}/campaigns/c1", {"endpoint_url": server.endpoint_url}


def start_writer(url: str, options: dict) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, json.dumps(options), PREFIX, str(PARTS), str(ROWS)],
        cwd=ROOT, env=os.environ.copy(), stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "ready", "writer failed to start"
    return proc


def check_readers(store) -> int:
    """Every committed shard is whole and matches its marker; returns the committed row count."""
    keys = committed_shards(store, PREFIX)
    assert keys == [f"{PREFIX}/part-{p:05d}.parquet" for p in range(len(keys))]  # written in order
    total = 0
    for part, key in enumerate(keys):
        marker = json.loads(store.get(f"{PREFIX}/{COMMIT_DIR}/part-{part:05d}.json"))
        data = store.get(key)
        assert len(data) == marker["bytes"] and hashlib.sha256(data).hexdigest() == marker["sha256"]
        table = read_shard(store, key)
        assert table.num_rows == marker["rows"] == ROWS
        assert table.column("id").to_pylist() == list(range(part * ROWS, (part + 1) * ROWS))
        total += marker["rows"]
    ids = read_committed(store, PREFIX).column("id").to_pylist() if keys else []
    assert ids == list(range(total))  # no duplicates, no gaps
    return total


def test_killed_writer_leaves_no_partial_shards_and_reruns_complete(target):
    url, options = target
    store = open_store(url, **options)
    rng = random.Random(1234)
    progress = []
    for trial in range(TRIALS):
        writer = start_writer(url, options)  # continues the same job: the same keys again
        # Kill at a point set by progress, not by the clock, so a fast machine is still caught mid-job.
        wait_for = f"wrote {rng.randrange(trial * PARTS // TRIALS, (trial + 1) * PARTS // TRIALS)}"
        while writer.stdout.readline().strip() not in (wait_for, "done", ""):
            pass
        time.sleep(rng.uniform(0.0, 0.01))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        writer.stdout.close()
        progress.append(check_readers(store))
    assert progress == sorted(progress)  # committed rows never go away
    assert progress[0] < PARTS * ROWS, "the first writer was never killed mid-job"

    writer = start_writer(url, options)  # the re-run, uninterrupted
    assert writer.stdout.read().split()[-1] == "done" and writer.wait(timeout=60) == 0
    writer.stdout.close()
    assert check_readers(store) == PARTS * ROWS
    assert sum(1 for k in store.list(PREFIX + "/") if k.endswith(".parquet")) == PARTS  # no stray copies
    store.close()
