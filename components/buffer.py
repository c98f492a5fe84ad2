"""The experience buffer on an object store: where each kind of object lives, and reading it back.

Object layout under ``<campaign>/`` (every Parquet shard committed with a marker, see ``shards``)::

    tasksets/<split>/part-*.parquet              train and eval tasks
    staging/round=NNNNNN/<stage>/part-*.parquet   explorer output (rollouts), verified rows
    experiences/usual/round=NNNNNN/part-*.parquet accepted explorer experiences
    experiences/expert/part-*.parquet            demonstrations (expert source)
    quarantine/round=NNNNNN/part-*.parquet        rows that broke the contract, with ``reason``
    checkpoints/vNNNNNN/                          safetensors + config + tokenizer
"""

from __future__ import annotations

import random

import pyarrow as pa

from components.experience import SCHEMA
from components.shards import read_committed, write_shard
from components.storage import ObjectStore


def round_dir(round_no: int) -> str:
    return f"round={round_no:06d}"


class ExperienceBuffer:
    """Typed access to one campaign's objects in ``store``."""

    def __init__(self, store: ObjectStore, campaign: str):
        self.store, self.campaign = store, campaign
        self._expert: pa.Table | None = None

    def key(self, *parts: str) -> str:
        return "/".join([self.campaign, *parts])

    # tasksets
    def write_tasks(self, split: str, table: pa.Table) -> str:
        return write_shard(self.store, self.key("tasksets", split), table)

    def read_tasks(self, split: str) -> pa.Table:
        return read_committed(self.store, self.key("tasksets", split))

    # staging between stages of one round
    def write_staging(self, round_no: int, stage: str, table: pa.Table) -> str:
        return write_shard(self.store, self.key("staging", round_dir(round_no), stage), table)

    def read_staging(self, round_no: int, stage: str) -> pa.Table:
        return read_committed(self.store, self.key("staging", round_dir(round_no), stage))

    # experiences
    def write_usual(self, round_no: int, table: pa.Table) -> str:
        return write_shard(self.store, self.key("experiences", "usual", round_dir(round_no)), table)

    def read_usual(self, round_no: int) -> pa.Table:
        return read_committed(self.store, self.key("experiences", "usual", round_dir(round_no)), SCHEMA)

    def write_expert(self, table: pa.Table, part: int = 0) -> str:
        self._expert = None
        return write_shard(self.store, self.key("experiences", "expert"), table, part)

    def read_expert(self) -> pa.Table:
        if self._expert is None:
            self._expert = read_committed(self.store, self.key("experiences", "expert"), SCHEMA)
        return self._expert

    def sample_expert(self, n: int, rng: random.Random) -> pa.Table:
        """``n`` expert rows drawn without replacement (all of them if fewer)."""
        expert = self.read_expert()
        if n <= 0 or expert.num_rows == 0:
            return SCHEMA.empty_table()
        return expert.take(sorted(rng.sample(range(expert.num_rows), min(n, expert.num_rows))))

    def write_quarantine(self, round_no: int, table: pa.Table) -> str | None:
        if table.num_rows == 0:
            return None
        return write_shard(self.store, self.key("quarantine", round_dir(round_no)), table)

    def checkpoint_prefix(self, version: int) -> str:
        return self.key("checkpoints", f"v{version:06d}")
