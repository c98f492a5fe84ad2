"""The experience buffer on an object store: where each kind of object lives, and reading it back.

Object layout under ``<campaign>/`` (every Parquet shard committed with a marker, see ``shards``)::

    tasksets/<split>/part-*.parquet              train and eval tasks
    staging/round=NNNNNN/<stage>/part-*.parquet   explorer output (rollouts), verified rows
    experiences/usual/round=NNNNNN/part-*.parquet accepted explorer experiences
    experiences/expert/[ingest=<hash>/]part-*.parquet demonstrations: gold answers, ingested ones
    experiences/human/ingest=<hash>/part-*.parquet rated responses (human feedback)
    quarantine/round=NNNNNN/part-*.parquet        rows that broke the contract, with ``reason``
    quarantine/{tasks,tasks-pipeline,ingest=<hash>}/  bad task rows, bad ingested rows
    quarantine/failed/round=NNNNNN/part-*.parquet the bad rows of a round that failed its contract
    checkpoints/vNNNNNN/                          safetensors + config + tokenizer
    state/<name>.json                             what resume needs: the FIFO cursor, replay use
                                                  counts, measured pass rates; ingest=<hash>: the
                                                  report of an ingested file

Consumption of explorer experiences (``take_fifo``, ``take_replay``) returns the rows and a
``commit`` callable; the caller runs it once the rows are trained on, so a crash in between
re-serves the same rows instead of losing them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from components.experience import SCHEMA
from components.shards import committed_shards, is_committed, read_committed, read_shard, write_shard
from components.storage import ObjectStore, open_store

Commit = Callable[[], None]

# What ``rftflow buffer`` can read: kind → key prefix under the campaign.
# ``quarantine`` is every rejected row except those of rounds that failed (above the bad-row threshold),
# which are ``failed``: such a round may run again and quarantine the same rows under its own round.
KINDS = {"usual": ("experiences", "usual"), "expert": ("experiences", "expert"), "human": ("experiences", "human"),
         "quarantine": ("quarantine",), "failed": ("quarantine", "failed"), "tasks": ("tasksets",)}


STORE_FILE = "store.json"
_WHERE = ("endpoint_url", "region", "addressing_style")  # how to reach the store; never credentials


def open_run_store(storage, run_dir: str | Path) -> ObjectStore:
    """The store of a run (``storage``: a ``StorageConfig``; default ``file://<run_dir>/store``),
    recorded in ``<run_dir>/store.json`` (URL, endpoint, region, addressing style) so that
    ``rftflow buffer RUN_DIR`` finds it, even after a crash."""
    run_dir = Path(run_dir)
    url = storage.url or (run_dir / "store").as_uri()
    options = storage.store_options() if url.startswith("s3://") else {}
    store = open_store(url, **options)
    run_dir.mkdir(parents=True, exist_ok=True)
    where = {"url": store.url, **{k: options[k] for k in _WHERE if options.get(k)}}
    (run_dir / STORE_FILE).write_text(json.dumps(where, indent=2) + "\n")
    return store


def recorded_store(run_dir: str | Path) -> tuple[str, dict[str, Any]]:
    """(URL, options) of the store ``open_run_store`` recorded for ``run_dir`` (else its default)."""
    where = Path(run_dir) / STORE_FILE
    options = json.loads(where.read_text()) if where.is_file() else {"url": (Path(run_dir) / "store").as_uri()}
    return options.pop("url"), {k: v for k, v in options.items() if k in _WHERE}


def campaigns_in(store: ObjectStore) -> list[str]:
    """Campaign prefixes in ``store``: top-level names that hold a taskset, experiences (an
    ingested file may come before the campaign's first run) or state."""
    names = set()
    for key in store.list(""):
        campaign, _, rest = key.partition("/")
        if rest.split("/", 1)[0] in ("tasksets", "experiences", "state"):
            names.add(campaign)
    return sorted(names)


def round_dir(round_no: int) -> str:
    return f"round={round_no:06d}"


class ExperienceBuffer:
    """Typed access to one campaign's objects in ``store``."""

    def __init__(self, store: ObjectStore, campaign: str):
        self.store, self.campaign = store, campaign
        self._expert: pa.Table | None = None  # cached: read every round by sample_expert
        self._human: pa.Table | None = None
        self._shards: dict[str, pa.Table] = {}  # committed shards never change: cache them

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

    def usual_shards(self) -> list[str]:
        """Committed usual-experience shards, oldest round first."""
        return committed_shards(self.store, self.key("experiences", "usual"))

    def _shard(self, key: str) -> pa.Table:
        if key not in self._shards:
            self._shards[key] = read_shard(self.store, key)
        return self._shards[key]

    def take_fifo(self, max_rows: int | None = None) -> tuple[pa.Table, Commit]:
        """The oldest explorer rows not yet consumed, in store order, whole groups, about
        ``max_rows`` of them (a group is never split; None = all). The cursor
        (``state/fifo_cursor.json``: next shard and row) moves only when ``commit`` runs."""
        cursor = self.read_state("fifo_cursor", {"shard": "", "offset": 0})
        taken, n, after = [], 0, dict(cursor)
        for key in self.usual_shards():
            if key < cursor["shard"]:
                continue
            table = self._shard(key)
            start = cursor["offset"] if key == cursor["shard"] else 0
            if start >= table.num_rows:
                continue
            end = table.num_rows if max_rows is None else _group_end(table, start + max_rows - n)
            taken.append(table.slice(start, end - start))
            n, after = n + end - start, {"shard": key, "offset": end}
            if max_rows is not None and n >= max_rows:
                break
        rows = pa.concat_tables(taken) if taken else SCHEMA.empty_table()
        return rows, lambda: self.write_state("fifo_cursor", after)

    def take_replay(self, n_rows: int, current_version: int, rng: random.Random, *, decay: float = 1.0,
                    reuse_limit: int = 2, max_staleness: int | None = None) -> tuple[pa.Table, Commit]:
        """Whole groups by priority = model_version − decay × uses (ties in ``rng`` order), until
        ``n_rows`` rows; groups used ``reuse_limit`` times or older than ``max_staleness`` versions
        are out. Use counts (``state/replay_uses.json``) are bumped when ``commit`` runs."""
        shards = [self._shard(k) for k in self.usual_shards()]
        if not shards:
            return SCHEMA.empty_table(), lambda: None
        table = pa.concat_tables(shards)
        uses: dict[str, int] = self.read_state("replay_uses", {})
        stats = table.group_by("group_id").aggregate([("model_version", "max"), ("group_id", "count")])
        candidates = []
        for gid, version, size in zip(*(stats.column(c).to_pylist() for c in
                                        ("group_id", "model_version_max", "group_id_count"))):
            used = uses.get(gid, 0)
            if used >= reuse_limit or (max_staleness is not None and version < current_version - max_staleness):
                continue
            candidates.append((-(version - decay * used), rng.random(), gid, size))
        picked, rows = [], 0
        for _, _, gid, size in sorted(candidates):
            if rows >= n_rows:
                break
            picked.append(gid)
            rows += size
        chosen = table.filter(pc.is_in(table.column("group_id"), value_set=pa.array(picked, pa.string())))

        def commit() -> None:
            for gid in picked:
                uses[gid] = uses.get(gid, 0) + 1
            self.write_state("replay_uses", uses)

        return chosen, commit

    # inspection ------------------------------------------------------------------------------
    def read_kind(self, kind: str, round_no: int | None = None) -> pa.Table:
        """Every committed row of ``kind`` (see ``KINDS``), or one round's (usual, quarantine)."""
        if kind not in KINDS:
            raise KeyError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
        parts = [*KINDS[kind], *([round_dir(round_no)] if round_no is not None else [])]
        prefix, failed = self.key(*parts), self.key(*KINDS["failed"]) + "/"
        keys = [k for k in committed_shards(self.store, prefix) if kind != "quarantine" or not k.startswith(failed)]
        try:
            return read_committed(self.store, prefix, keys=keys)
        except KeyError:
            return pa.table({})

    def counts(self) -> list[dict[str, Any]]:
        """Rows per (kind, round, source) for experiences and quarantine, per split for tasks."""
        out = []
        for kind in ("usual", "expert", "human", "quarantine", "failed"):
            table = self.read_kind(kind)
            if not table.num_rows:
                continue
            for column in ("round", "source"):  # quarantined task rows have neither
                if column not in table.column_names:
                    table = table.append_column(column, pa.nulls(table.num_rows, pa.string()))
            stats = table.group_by(["round", "source"]).aggregate([([], "count_all")])
            out += sorted(({"kind": kind, "round": r, "source": s or "tasks", "rows": n} for r, s, n in zip(
                *(stats.column(c).to_pylist() for c in ("round", "source", "count_all")))),
                key=lambda d: (d["round"] is None, d["round"] or 0, d["source"]))
        for split in ("train", "eval"):
            try:
                n = self.read_tasks(split).num_rows
            except KeyError:
                continue
            out.append({"kind": "tasks", "round": None, "source": split, "rows": n})
        return out

    # state -----------------------------------------------------------------------------------
    def read_state(self, name: str, default: Any = None) -> Any:
        """The JSON object at ``state/<name>.json``, or ``default`` if there is none."""
        try:
            return json.loads(self.store.get(self.key("state", f"{name}.json")))
        except KeyError:
            return default

    def ingest_reports(self) -> list[dict[str, Any]]:
        """The reports of the files ingested into this campaign (``state/ingest=<id>.json``), oldest key first."""
        keys = self.store.list(self.key("state", "ingest="))
        return [json.loads(self.store.get(k)) for k in keys if k.endswith(".json")]

    def write_state(self, name: str, value: Any) -> None:
        self.store.put(self.key("state", f"{name}.json"), json.dumps(value, sort_keys=True).encode())

    def write_expert(self, table: pa.Table, part: int = 0) -> str:
        self._expert = None
        return write_shard(self.store, self.key("experiences", "expert"), table, part)

    def write_ingested(self, source: str, ingest_id: str, table: pa.Table) -> bool:
        """Ingested ``expert`` demonstrations or ``human``-rated responses under ``ingest=<id>``;
        False if they were stored before (idempotent)."""
        self._expert = self._human = None
        prefix = self.key("experiences", source, f"ingest={ingest_id}")
        if is_committed(self.store, prefix):
            return False
        write_shard(self.store, prefix, table)
        return True

    def read_expert(self, human_min_reward: float | None = None) -> pa.Table:
        """Expert demonstrations (gold answers, ingested ones), plus human-rated responses whose
        reward is at least ``human_min_reward`` (None: no human rows)."""
        if self._expert is None:
            self._expert = read_committed(self.store, self.key("experiences", "expert"), SCHEMA)
        if human_min_reward is None:
            return self._expert
        if self._human is None:
            self._human = read_committed(self.store, self.key("experiences", "human"), SCHEMA)
        human = self._human
        good = human.filter(pc.greater_equal(human.column("reward"), human_min_reward))
        return pa.concat_tables([self._expert, good]) if good.num_rows else self._expert

    def sample_expert(self, n: int, rng: random.Random, human_min_reward: float | None = None) -> pa.Table:
        """``n`` expert rows (see ``read_expert``) drawn without replacement (all of them if fewer)."""
        expert = self.read_expert(human_min_reward)
        if n <= 0 or expert.num_rows == 0:
            return SCHEMA.empty_table()
        return expert.take(sorted(rng.sample(range(expert.num_rows), min(n, expert.num_rows))))

    def write_quarantine(self, where: int | str, table: pa.Table) -> str | None:
        """Rejected rows (with ``reason``) under ``quarantine/round=NNNNNN`` (an int) or ``quarantine/<where>``
        (``tasks``, ``ingest=<hash>``); nothing is written for an empty table."""
        if table.num_rows == 0:
            return None
        return write_shard(self.store, self.key("quarantine", round_dir(where) if isinstance(where, int) else where),
                           table)

    def checkpoint_prefix(self, version: int) -> str:
        return self.key("checkpoints", f"v{version:06d}")


def _group_end(table: pa.Table, end: int) -> int:
    """``end`` moved forward to the end of the group that row ``end − 1`` belongs to."""
    if end >= table.num_rows:
        return table.num_rows
    groups = table.column("group_id")
    last = groups[end - 1].as_py()
    while end < table.num_rows and groups[end].as_py() == last:
        end += 1
    return end
