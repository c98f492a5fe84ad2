"""Write and read throughput of experience shards on file:// and on S3 (a local moto server).

Shards are experience rows (``components.experience.SCHEMA``: token ids, log-probs, masks, text,
rewards) written with ``write_shard`` (Parquet + snappy + commit marker) and read back with
``read_committed``; the tables are built before the clock starts. "MB" is the Parquet bytes in the
store (10^6 bytes). The S3 numbers are against moto on 127.0.0.1 (its own process): they measure
the client plus moto's Python request handling, not a real S3 service.

    python benchmarks/storage.py                                  # 50k rows in 10 shards, both backends
    python benchmarks/storage.py --rows 200000 --shards 20 --workers 4 --backends s3
    python benchmarks/storage.py --s3-url s3://bucket/bench       # a real endpoint (AWS_* environment)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.s3server (the moto helper the tests use)

from rftflow.components.data.experience import SCHEMA  # noqa: E402
from rftflow.components.buffer.shards import committed_shards, read_committed, write_shard  # noqa: E402
from rftflow.components.buffer.store import open_store  # noqa: E402


def _lists(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(offsets, values)


def experience_table(rows: int, first: int, rng: np.random.Generator) -> pa.Table:
    """``rows`` synthetic experiences with ``SCHEMA``: prompts of 32-96 tokens, responses of 64-320."""
    p_len, r_len = rng.integers(32, 97, rows), rng.integers(64, 321, rows)
    r_total = int(r_len.sum())
    ids = np.arange(first, first + rows)
    reward = rng.integers(0, 2, rows).astype(np.float64)
    rewards = pa.MapArray.from_arrays(np.arange(0, 2 * rows + 1, 2, dtype=np.int32),
                                      pa.array(["accuracy", "format"] * rows),
                                      pa.array(np.column_stack([reward, np.ones(rows)]).ravel()))
    columns = {
        "experience_id": pa.array([f"{i:024x}" for i in ids.tolist()]),
        "campaign": pa.array(["bench"] * rows),
        "round": pa.array(np.ones(rows, np.int32)),
        "task_id": pa.array([f"task-{i // 8}" for i in ids.tolist()]),
        "group_id": pa.array([f"group-{i // 8}" for i in ids.tolist()]),
        "source": pa.array(["explorer"] * rows),
        "prompt": pa.array([f"What is {i} + {i % 97}? Answer with a number." for i in ids.tolist()]),
        "response": pa.array([f"<think>{i} plus {i % 97}</think> {i + i % 97}" for i in ids.tolist()]),
        "prompt_ids": _lists(p_len, rng.integers(0, 32_000, int(p_len.sum()), dtype=np.int32)),
        "response_ids": _lists(r_len, rng.integers(0, 32_000, r_total, dtype=np.int32)),
        "response_logprobs": _lists(r_len, -rng.exponential(0.5, r_total).astype(np.float32)),
        "response_mask": _lists(r_len, np.ones(r_total, np.int8)),
        "reward": pa.array(reward),
        "rewards": rewards,
        "model_version": pa.array(np.full(rows, 3, np.int64)),
        "created_at": pa.array([datetime.now(timezone.utc)] * rows, pa.timestamp("us", tz="UTC")),
        "info": pa.array(['{"steps": 1}'] * rows),
    }
    columns |= {f.name: pa.nulls(rows, f.type) for f in SCHEMA if f.name not in columns}  # unused here: null
    return pa.table({f.name: columns[f.name] for f in SCHEMA}).cast(SCHEMA)


def run(store, tables: list[pa.Table], workers: int, repeat: int) -> dict[str, float]:
    """Best of ``repeat`` rounds, each writing all shards under a new prefix and reading them back.
    The prefix is unique to this run (an earlier run's committed shards would make writes no-ops)
    and deleted afterwards."""
    top = f"bench-{uuid.uuid4().hex[:12]}"
    try:
        runs = [run_once(store, tables, workers, f"{top}/experiences/usual/round={i}") for i in range(repeat)]
    finally:
        for key in store.list(f"{top}/"):
            store.delete(key)
    return {"write_s": min(r["write_s"] for r in runs), "read_s": min(r["read_s"] for r in runs),
            "bytes": runs[0]["bytes"]}


def run_once(store, tables: list[pa.Table], workers: int, prefix: str) -> dict[str, float]:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda part: write_shard(store, prefix, tables[part], part), range(len(tables))))
    write_s = time.perf_counter() - start
    nbytes = sum(len(store.get(k)) for k in committed_shards(store, prefix))
    start = time.perf_counter()
    table = read_committed(store, prefix)
    read_s = time.perf_counter() - start
    assert table.num_rows == sum(t.num_rows for t in tables)
    return {"write_s": write_s, "read_s": read_s, "bytes": nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000, help="experience rows in all (default 50000)")
    parser.add_argument("--shards", type=int, default=10, help="shards the rows are split into (default 10)")
    parser.add_argument("--workers", type=int, default=1, help="shards written in parallel (default 1)")
    parser.add_argument("--backends", default="file,s3", help="comma-separated: file, s3 (default both)")
    parser.add_argument("--s3-url", default=None, help="use this s3:// URL instead of a local moto server")
    parser.add_argument("--multipart-threshold-mib", type=int, default=64, help="S3 multipart threshold")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the best is shown (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    per_shard = [len(a) for a in np.array_split(np.arange(args.rows), args.shards)]
    tables = [experience_table(n, sum(per_shard[:i]), rng) for i, n in enumerate(per_shard)]
    results: dict[str, dict[str, float]] = {}
    s3_note = ""
    for backend in args.backends.split(","):
        if backend == "file":
            with tempfile.TemporaryDirectory() as tmp:
                results["file://"] = run(open_store(Path(tmp).as_uri()), tables, args.workers, args.repeat)
        elif backend == "s3" and args.s3_url:
            with open_store(args.s3_url, multipart_threshold=args.multipart_threshold_mib << 20) as store:
                results["s3:// " + args.s3_url] = run(store, tables, args.workers, args.repeat)
        elif backend == "s3":
            from tests.s3server import S3TestServer

            with S3TestServer() as server:
                bucket = server.new_bucket("bench")
                with open_store(f"s3://{bucket}/rftflow", endpoint_url=server.endpoint_url,
                                multipart_threshold=args.multipart_threshold_mib << 20) as store:
                    results["s3:// (moto)"] = run(store, tables, args.workers, args.repeat)
                s3_note = "s3:// (moto): moto server on 127.0.0.1 in its own process, not a real S3 service"
        else:
            parser.error(f"unknown backend {backend!r}")

    print(f"{args.rows} rows in {args.shards} shards, {args.workers} writer thread(s), Parquet+snappy, "
          f"experience schema, best of {args.repeat}")
    header = f"{'backend':<16} {'MB':>7} {'write rows/s':>13} {'write MB/s':>11} {'read rows/s':>12} {'read MB/s':>10}"
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        mb = r["bytes"] / 1e6
        print(f"{name:<16} {mb:>7.1f} {args.rows / r['write_s']:>13,.0f} {mb / r['write_s']:>11.1f} "
              f"{args.rows / r['read_s']:>12,.0f} {mb / r['read_s']:>10.1f}")
    if s3_note:
        print(s3_note)


if __name__ == "__main__":
    main()
