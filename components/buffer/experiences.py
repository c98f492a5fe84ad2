"""A campaign's experiences and what goes with them in its store (keys: ``layout``): the taskset
splits, each round's staging hand-off and accepted rows, demonstrations, human feedback, the
quarantine, the buffer's own state files (FIFO cursor, replay counts, pass rates) and the reports
of ingested files.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.buffer.shards import (ShardError, commit_shard, committed_shards, encode_shard, is_committed,
                                     marker_key, read_committed, read_shard, shard_key, write_shard)
from rftflow.components.buffer.layout import KINDS, campaigns_in, ingest_dir, recorded_store, round_dir, shard_order
from rftflow.components.buffer.store import ObjectStore, open_store
from rftflow.components.buffer.images import IMAGES_DIR, filled, stored_form
from rftflow.components.buffer.write_behind import OrderedStore, WriteBehind
from rftflow.components.data.experience import SCHEMA, conform
from rftflow.components.data.ingest import IngestResult


def open_campaign(location: str | Path, campaign: str | None = None) -> ExperienceStore:
    """A campaign's store from a run dir (the store its run recorded, ``recorded_store``) or a store
    URL (S3 settings from the AWS environment); ``campaign`` may be left out when the store holds
    one (a campaign moved aside by ``--restart`` only by its name). ``ValueError`` in one line."""
    options: dict[str, Any] = {}
    location = str(location)
    if "://" not in location:
        if not Path(location).is_dir():
            raise ValueError(f"no run dir or store at {location}")
        location, options = recorded_store(location)
    store = open_store(location, **options)
    names = campaigns_in(store)
    if campaign is None:
        if len(names) != 1:
            raise ValueError(f"{location}: {'no campaigns' if not names else 'several campaigns: ' + ', '.join(names)}"
                             + ("; pick one with --campaign" if names else ""))
        campaign = names[0]
    elif campaign not in names and campaign not in campaigns_in(store, moved_aside=True):
        raise ValueError(f"{location}: no campaign {campaign!r}; found: {', '.join(names) or 'none'}")
    return ExperienceStore(store, campaign)


class ExperienceStore:
    """Typed access to one campaign's experiences in ``store`` (see the module docstring).

    Committed shards never change, so the ones read often (explorer rounds, demonstrations, human
    rows) are cached in memory, and so is a staging shard this object committed until the next
    stage reads it (a retried stage, or another process, reads the store).

    Pictures (the ``images`` column) are stored once each, by content hash (``images``): put before
    the shard whose rows name them, and read back into the rows' ``data`` when a shard is read.

    With ``write_behind`` (a running campaign), a round's writes — staging, accepted experiences,
    quarantine, state files — are queued to one background thread (``write_behind``: in order,
    read-your-writes); ``objects`` is then the store as ordered behind that queue, and ``flush``
    waits for it.
    """

    def __init__(self, store: ObjectStore, campaign: str, write_behind: bool = False, shards: int = 1):
        self.campaign, self.shards = campaign, shards  # shards: explorer shards per round (``explorer.shards``)
        self._queue = WriteBehind() if write_behind else None
        self._direct = store  # the queue's own writes go here
        self.objects: ObjectStore = OrderedStore(store, self._queue) if self._queue else store
        self._shards: dict[str, pa.Table] = {}
        self._staged: dict[str, pa.Table] = {}
        self._usual: dict[str, int] = {}  # usual shards known committed (or queued), listed or written here → round
        self._expert: pa.Table | None = None
        self._human: pa.Table | None = None
        self._pictures: set[str] = set()  # picture keys known stored (put or read here)

    @property
    def url(self) -> str:
        return self.objects.url

    @property
    def direct(self) -> ObjectStore:
        """The store itself, not ordered behind queued writes (shard leases: their renewals must not
        wait for, or take the errors of, a round's writes)."""
        return self._direct

    def key(self, *parts: str) -> str:
        return "/".join([self.campaign, *parts])

    def shard(self, key: str) -> pa.Table:
        """Committed shard ``key`` (cached)."""
        if key not in self._shards:
            self._shards[key] = self._as_experiences(read_shard(self.objects, key))
        return self._shards[key]

    def _as_experiences(self, table: pa.Table) -> pa.Table:
        """An experience shard as this version's ``SCHEMA`` (``conform``) with its pictures' bytes
        (``images.filled``: a missing or altered picture is a ``ShardError`` naming its key); other
        shards as they are."""
        if "experience_id" not in table.column_names:
            return table
        try:
            return filled(conform(table), lambda key: self.objects.get(self.key(key)), f"{self.url}/{self.campaign}")
        except ValueError as e:
            raise ShardError(str(e)) from None

    def _put_pictures(self, store: ObjectStore, blobs: dict[str, bytes]) -> None:
        """Each picture not known stored, put if absent (another row, round or process may have)."""
        for key, data in blobs.items():
            if key not in self._pictures:
                store.put(self.key(key), data, if_absent=True)
                self._pictures.add(key)

    def _write(self, prefix: str, table: pa.Table, part: int = 0, cache: dict[str, pa.Table] | None = None) -> str:
        """``write_shard`` of ``table`` in its stored form, its pictures put first; a shard this call
        commits goes into ``cache`` as ``table`` (with the pictures' bytes)."""
        stored, blobs = stored_form(table)
        self._put_pictures(self.objects, blobs)
        committed: dict[str, pa.Table] = {}
        key = write_shard(self.objects, prefix, stored, part, committed=committed)
        if cache is not None and committed:
            cache[key] = table
        return key

    def flush(self) -> None:
        """Wait until the queued writes are in the store (raising a failed one's error)."""
        if self._queue is not None:
            self._queue.flush()

    def _write_round_shard(self, prefix: str, table: pa.Table, cache: dict[str, pa.Table] | None,
                           part: int = 0) -> str:
        """``write_shard`` of a round's rows (``part``: its explorer shard): queued behind the
        compute when writing behind.

        Queued, the shard goes into ``cache`` at once (the next stage reads it from there); a shard
        already committed (by an earlier attempt) or queued is not written again, as ``write_shard``."""
        if self._queue is None:
            return self._write(prefix, table, part, cache)
        key, marker = shard_key(prefix, part), marker_key(prefix, part)
        if self._queue.pending(key) or is_committed(self._direct, prefix, part):
            return key
        if cache is not None:
            cache[key] = table

        def write() -> None:
            stored, blobs = stored_form(table)
            self._put_pictures(self._direct, blobs)
            if not commit_shard(self._direct, prefix, encode_shard(stored), table.num_rows, part):
                raise ShardError(f"shard {key}: another writer committed it while this one's write was queued; "
                                 "run one campaign per store prefix at a time")

        self._queue.submit((key, marker), write)
        return key

    # tasksets --------------------------------------------------------------------------------
    def write_tasks(self, split: str, table: pa.Table) -> str:
        return write_shard(self.objects, self.key("tasksets", split), table)

    def tasks_committed(self, *splits: str) -> bool:
        """Whether the taskset ``splits`` (default both: the campaign was prepared) are stored."""
        return all(is_committed(self.objects, self.key("tasksets", split)) for split in splits or ("train", "eval"))

    def read_tasks(self, split: str) -> pa.Table:
        return read_committed(self.objects, self.key("tasksets", split))

    # staging between the stages of one round -------------------------------------------------
    def write_staging(self, round_no: int, stage: str, table: pa.Table, part: int = 0) -> str:
        return self._write_round_shard(self.key("staging", round_dir(round_no), stage), table, self._staged, part)

    def read_staging(self, round_no: int, stage: str, part: int = 0) -> pa.Table:
        prefix = self.key("staging", round_dir(round_no), stage)
        staged = self._staged.pop(shard_key(prefix, part), None)
        return staged if staged is not None else read_committed(self.objects, prefix, keys=[shard_key(prefix, part)],
                                                                conform=self._as_experiences)

    # experiences -----------------------------------------------------------------------------
    def write_usual(self, round_no: int, table: pa.Table, keep: bool = True, part: int = 0) -> str:
        """Commit a round's accepted explorer rows (of explorer shard ``part``); ``keep``: also in
        the shard cache, for a trainer in this process (an explorer process alone never reads them)."""
        key = self._write_round_shard(self.key("experiences", "usual", round_dir(round_no)), table,
                                      self._shards if keep else None, part)
        self._usual[key] = round_no
        return key

    def round_committed(self, round_no: int, part: int | None = None) -> bool:
        """Whether round ``round_no``'s explorer experiences are committed (its buffer stage ran):
        every one of its ``shards`` (or just ``part``)."""
        prefix = self.key("experiences", "usual", round_dir(round_no))
        return all(is_committed(self.objects, prefix, p) for p in ([part] if part is not None else range(self.shards)))

    def usual_shards(self, max_round: int | None = None) -> list[str]:
        """Committed usual-experience shards, oldest round first (up to ``max_round``); writing
        behind, those queued too (cached: ``shard`` reads them without waiting).

        The store is listed only when some round up to ``max_round`` (or any, without one) has no
        shard known here: a committed shard never changes or goes while a campaign runs, so the
        ones listed or written here stay known (a listing grows with the rounds, and is a
        request on S3)."""
        known = dict(self._usual)  # a copy (one C call): in mode async the explorer's lane writes meanwhile
        parts = Counter(known.values())  # shards known per round
        if max_round is None or any(parts[r] < self.shards for r in range(1, max_round + 1)):
            prefix = self.key("experiences", "usual")
            if self._queue is None:
                listed = committed_shards(self.objects, prefix)
            else:  # the queue first: a write that ends meanwhile is then in the listing
                queued = [k for k in self._queue.pending(prefix + "/") if k.endswith(".parquet")]
                listed = [*committed_shards(self._direct, prefix), *queued]
            known |= {key: shard_order(key)[0] for key in listed}
            self._usual.update(known)
        return [key for key, r in sorted(known.items(), key=lambda item: (item[1], item[0]))
                if max_round is None or r <= max_round]

    def write_expert(self, table: pa.Table) -> str:
        """The taskset's gold demonstrations (``experiences/expert/taskset``)."""
        self._expert = None
        return self._write(self.key("experiences", "expert", "taskset"), table)

    def write_ingested(self, source: str, ingest_id: str, table: pa.Table) -> bool:
        """Ingested ``expert`` demonstrations or ``human``-rated responses under ``ingest-<id>``;
        False if they were stored before (idempotent)."""
        self._expert = self._human = None
        prefix = self.key("experiences", source, ingest_dir(ingest_id))
        if is_committed(self.objects, prefix):
            return False
        self._write(prefix, table)
        return True

    def read_expert(self) -> pa.Table:
        """Every stored demonstration: gold answers and ingested ones (cached)."""
        if self._expert is None:
            self._expert = read_committed(self.objects, self.key("experiences", "expert"), SCHEMA,
                                          conform=self._as_experiences)
        return self._expert

    def read_human(self) -> pa.Table:
        """Every stored human-rated response (cached)."""
        if self._human is None:
            self._human = read_committed(self.objects, self.key("experiences", "human"), SCHEMA,
                                         conform=self._as_experiences)
        return self._human

    def write_quarantine(self, where: int | str, table: pa.Table, part: int = 0) -> str | None:
        """Rejected rows (with ``reason``) under ``quarantine/round=N`` (an int; ``part``: its explorer
        shard) or ``quarantine/<where>`` (``tasks``, ``ingest-<hash>``, ``failed/round=N``); nothing is
        written for an empty table."""
        if table.num_rows == 0:
            return None
        if isinstance(where, int):  # a round's, behind its compute
            return self._write_round_shard(self.key("quarantine", round_dir(where)), table, None, part)
        return self._write(self.key("quarantine", where), table)

    # state -----------------------------------------------------------------------------------
    def read_state(self, name: str, default: Any = None) -> Any:
        """The JSON object at ``state/<name>.json``, or ``default`` if there is none."""
        try:
            return json.loads(self.objects.get(self.key("state", f"{name}.json")))
        except KeyError:
            return default

    def write_state(self, name: str, value: Any) -> None:
        """``state/<name>.json`` (queued behind the round's writes when writing behind)."""
        key, data = self.key("state", f"{name}.json"), json.dumps(value, sort_keys=True).encode()
        if self._queue is None:
            self.objects.put(key, data)
        else:
            self._queue.submit((key,), lambda: self._direct.put(key, data))

    def delete_state(self, name: str) -> None:
        self.objects.delete(self.key("state", f"{name}.json"))

    def ingest_reports(self) -> list[dict[str, Any]]:
        """The reports of the files ingested into this campaign (``state/ingest-<id>.json``), oldest key first."""
        keys = self.objects.list(self.key("state", ingest_dir("")))
        return [json.loads(self.objects.get(k)) for k in keys if k.endswith(".json")]

    # inspection ------------------------------------------------------------------------------
    def read_kind(self, kind: str, round_no: int | None = None) -> pa.Table:
        """Every committed row of ``kind`` (see ``KINDS``), or one round's (usual, quarantine)."""
        if kind not in KINDS:
            raise KeyError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
        parts = [*KINDS[kind], *([round_dir(round_no)] if round_no is not None else [])]
        prefix, failed = self.key(*parts), self.key(*KINDS["failed"]) + "/"
        keys = [k for k in committed_shards(self.objects, prefix) if kind != "quarantine" or not k.startswith(failed)]
        try:
            return read_committed(self.objects, prefix, keys=sorted(keys, key=shard_order),
                                  conform=self._as_experiences)
        except KeyError:
            return pa.table({})

    def picture_keys(self) -> list[str]:
        """The stored pictures' keys, under the campaign's prefix (``images/<sha256>``)."""
        return [k.removeprefix(self.key("")) for k in self.objects.list(self.key(IMAGES_DIR, ""))]

    def counts(self) -> list[dict[str, Any]]:
        """Rows per (kind, round, source) for experiences and quarantine, per split for tasks; the
        stored pictures (kind ``images``: objects, each shared by the rows that show it)."""
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
        pictures = self.picture_keys()
        if pictures:
            out.append({"kind": "images", "round": None, "source": "store", "rows": len(pictures)})
        for split in ("train", "eval"):
            try:
                n = self.read_tasks(split).num_rows
            except KeyError:
                continue
            out.append({"kind": "tasks", "round": None, "source": split, "rows": n})
        return out


def store_ingested(result: IngestResult, store: ExperienceStore, max_bad_fraction: float) -> dict[str, int]:
    """Store an ingested file's accepted rows that are not stored yet (by ``experience_id``, see
    the module docstring; by source) and its quarantine, unless more than ``max_bad_fraction`` of
    its rows are bad (``ContractError``, nothing stored). Returns ``{"new": n, "already_present":
    m}``. The report, with those counts, goes to ``state/ingest-<id>.json``, where the campaign's
    validation report reads it."""
    result.enforce(max_bad_fraction)
    stored = {*store.read_expert().column("experience_id").to_pylist(),
              *store.read_human().column("experience_id").to_pylist()}
    keep = []
    for i, eid in enumerate(result.accepted.column("experience_id").to_pylist()):
        if eid not in stored:
            keep.append(i)
            stored.add(eid)  # a row repeated within the file is stored once too
    new = result.accepted.take(pa.array(keep, pa.int64()))
    for source in ("expert", "human"):
        rows = new.filter(pc.equal(new.column("source"), source))
        if rows.num_rows:
            store.write_ingested(source, result.ingest_id, rows)
    store.write_quarantine(ingest_dir(result.ingest_id), result.quarantined)
    counts = {"new": new.num_rows, "already_present": result.accepted.num_rows - new.num_rows}
    store.write_state(ingest_dir(result.ingest_id), {**result.report(), **counts})  # for the validation report
    return counts
