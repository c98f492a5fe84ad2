"""The Experience record: one prompt, one response, its reward and where it came from.

Stored as Parquet with ``SCHEMA``; ``source`` is ``explorer`` (usual experiences), ``expert``
(demonstrations) or ``human`` (feedback). Token lists are unpadded; ``response_mask`` marks the
tokens the policy is trained on (1) versus tokens it did not produce (0): an episode's response
is every turn's ids in order, the model's (mask 1) and the environment's or tools' (mask 0).
A row of a task with images keeps them (``images``: each image's sha256, its key in the store and,
in memory, its encoded bytes, in the prompt's order), so the trainer reads the pixels the explorer
sampled with, and a stored row replays without its taskset. In the store a row holds the hash and
the key only: each picture is one object, however many rows show it (``buffer.images``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

TURN = pa.struct([("role", pa.string()), ("content", pa.string()), ("start", pa.int32()), ("end", pa.int32())])
# key: under the campaign's prefix in the store (``images/<sha256>``); data: the bytes (null as stored)
IMAGE = pa.struct([pa.field("sha256", pa.string(), nullable=False), ("key", pa.string()), ("data", pa.binary())])
SCHEMA = pa.schema(
    [
        pa.field("experience_id", pa.string(), nullable=False),
        pa.field("campaign", pa.string(), nullable=False),
        pa.field("round", pa.int32(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("prompt", pa.string()),
        pa.field("response", pa.string()),
        pa.field("prompt_ids", pa.list_(pa.int32())),
        pa.field("response_ids", pa.list_(pa.int32())),
        pa.field("response_logprobs", pa.list_(pa.float32())),
        pa.field("response_mask", pa.list_(pa.int8())),
        pa.field("reward", pa.float64()),
        pa.field("rewards", pa.map_(pa.string(), pa.float64())),
        pa.field("model_version", pa.int64()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
        pa.field("info", pa.string()),
        # episodes of a multi-turn workflow (null for a single answer): each turn's role (assistant,
        # environment, tool), text and token span [start, end) in response_ids; the environment's
        # reward after each assistant turn; the task's domain
        pa.field("turns", pa.list_(TURN)),
        pa.field("step_rewards", pa.list_(pa.float64())),
        pa.field("domain", pa.string()),
        # the prompt's images (null for a text task): sha256 of the encoded bytes, their key, the bytes
        pa.field("images", pa.list_(IMAGE)),
    ]
)
COLUMNS = tuple(SCHEMA.names)


def experience_id(*parts: Any) -> str:
    """A stable id from the parts that identify an experience, so reruns write the same ids."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:24]


def make_experience(**fields: Any) -> dict[str, Any]:
    """One experience row with every schema column (missing optional ones None; info as JSON)."""
    row = {name: fields.pop(name, None) for name in COLUMNS}
    if fields:
        raise TypeError(f"unknown experience fields: {', '.join(sorted(fields))}")
    if row["created_at"] is None:
        row["created_at"] = datetime.now(timezone.utc)
    if isinstance(row["info"], Mapping):
        row["info"] = json.dumps(row["info"], sort_keys=True)
    if isinstance(row["rewards"], Mapping):
        row["rewards"] = list(row["rewards"].items())
    return row


def to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Experience rows → an Arrow table with exactly ``SCHEMA``."""
    return pa.Table.from_pylist([dict(r) for r in rows], schema=SCHEMA)


def conform(table: pa.Table) -> pa.Table:
    """A stored experience table as ``SCHEMA``: the columns an older version did not write added as
    nulls (``turns``, ``step_rewards``, ``domain``, ``images``), types cast to this version's (Parquet may name a
    list's items differently); columns beyond the schema (a quarantined row's ``reason``) kept after."""
    if table.schema.equals(SCHEMA):
        return table
    columns = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(table.num_rows, f.type)
               for f in SCHEMA]
    out = pa.Table.from_arrays(columns, schema=SCHEMA)
    for name in table.column_names:
        if name not in SCHEMA.names:
            out = out.append_column(table.schema.field(name), table.column(name))
    return out
