"""Parquet shards with commit markers on an ``ObjectStore``.

A shard ``<prefix>/part-NNNNN.parquet`` becomes visible only when its marker
``<prefix>/_commit/part-NNNNN.json`` (rows, bytes, sha256) exists, and the marker is written after
the data. So a writer killed mid-shard leaves nothing visible, and re-running the same write is a
no-op once committed (the keys are deterministic; the marker is put-if-absent). Reads check the
bytes against the marker's sha256, so two writers racing on one shard fail loudly, never mix.
"""

from __future__ import annotations

import hashlib
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from rftflow.components.buffer.kill_point import kill_point
from rftflow.components.buffer.store import ObjectStore

COMMIT_DIR = "_commit"


def shard_key(prefix: str, part: int = 0) -> str:
    return f"{prefix}/part-{part:05d}.parquet"


def marker_key(prefix: str, part: int = 0) -> str:
    return f"{prefix}/{COMMIT_DIR}/part-{part:05d}.json"


def _marker_of(key: str) -> str:
    """The commit marker of shard ``key``."""
    prefix, name = key.rsplit("/", 1)
    return f"{prefix}/{COMMIT_DIR}/{name.removesuffix('.parquet')}.json"


class ShardError(RuntimeError):
    """A committed shard whose bytes are not the ones its marker describes; one line naming it."""


def is_committed(store: ObjectStore, prefix: str, part: int = 0) -> bool:
    """Whether shard ``part`` under ``prefix`` has its commit marker."""
    return store.exists(marker_key(prefix, part))


def write_shard(store: ObjectStore, prefix: str, table: pa.Table, part: int = 0,
                committed: dict[str, pa.Table] | None = None) -> str:
    """Write ``table`` as shard ``part`` under ``prefix`` and commit it; idempotent. Returns the key.

    With ``committed`` (a reader's cache, key → table), a shard this call commits goes there too
    (``table`` itself: a Parquet round trip gives back equal rows, as
    ``test_a_shard_read_back_equals_the_table_written`` checks); a shard an
    earlier run committed does not (its rows may differ from ``table``)."""
    key = shard_key(prefix, part)
    if is_committed(store, prefix, part):
        return key  # committed by an earlier (possibly crashed-after-commit) run
    if commit_shard(store, prefix, encode_shard(table), table.num_rows, part) and committed is not None:
        committed[key] = table
    return key


def encode_shard(table: pa.Table) -> bytes:
    """The Parquet bytes of a shard, snappy-compressed (Parquet's default codec: faster than zstd
    for a round's few rows, which zstd would shrink only a little more)."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue()


def commit_shard(store: ObjectStore, prefix: str, data: bytes, rows: int, part: int = 0) -> bool:
    """Put shard ``part``'s bytes (over an uncommitted leftover of a crash), then its marker
    (``rows``, bytes, sha256), put-if-absent; False when another writer's marker was there first."""
    store.put(shard_key(prefix, part), data)
    kill_point("shard", shard_key(prefix, part))
    meta = {"rows": rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return store.put(marker_key(prefix, part), json.dumps(meta).encode(), if_absent=True)


def committed_shards(store: ObjectStore, prefix: str) -> list[str]:
    """Keys of the committed shards under ``prefix`` (recursively), sorted."""
    keys = store.list(prefix.rstrip("/") + "/")
    markers = {k for k in keys if f"/{COMMIT_DIR}/" in k}
    return [k for k in keys if k.endswith(".parquet") and _marker_of(k) in markers]


def read_shard(store: ObjectStore, key: str) -> pa.Table:
    """Committed shard ``key``, checked against its marker (size, sha256): a shard truncated or
    altered after its commit, or two writers racing on one shard (two runs of a campaign at once),
    raise ``ShardError`` naming the key and what differs."""
    data, meta = store.get(key), json.loads(store.get(_marker_of(key)))
    where = f"{store.url}/{key}"
    if len(data) != meta["bytes"]:
        raise ShardError(f"shard {where} is corrupt: {len(data)} bytes where its commit marker records "
                         f"{meta['bytes']} (truncated or replaced after it was committed)")
    if hashlib.sha256(data).hexdigest() != meta["sha256"]:
        raise ShardError(f"shard {where} is corrupt: its bytes differ from the sha256 its commit marker records "
                         "(altered after it was committed, or two runs of one campaign wrote it at once)")
    try:
        return _decode(data)
    except (pa.ArrowException, OSError) as e:  # bytes as committed, yet not Parquet: written so
        raise ShardError(f"shard {where} is not a readable Parquet file ({str(e).splitlines()[0]})") from None


def _decode(data: bytes) -> pa.Table:
    # ``ParquetFile.read``: the same table as ``pq.read_table``, without its dataset machinery
    return pq.ParquetFile(io.BytesIO(data)).read()


def read_committed(store: ObjectStore, prefix: str, schema: pa.Schema | None = None,
                   keys: list[str] | None = None, conform=None) -> pa.Table:
    """All committed shards under ``prefix`` (or just ``keys``, some of them) as one table, each
    through ``conform`` first when given (shards an older version wrote); empty with ``schema`` if
    none (without a schema: ``KeyError``)."""
    tables = [read_shard(store, k) for k in (committed_shards(store, prefix) if keys is None else keys)]
    if conform is not None:
        tables = [conform(t) for t in tables]
    if not tables:
        if schema is None:
            raise KeyError(f"no committed shards under {prefix!r}")
        return schema.empty_table()
    return pa.concat_tables(tables, promote_options="default")
