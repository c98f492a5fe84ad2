"""Where each kind of object of a campaign lives in the store, and typed reads and writes of them.

Object layout under ``<campaign>/`` (every Parquet shard committed with a marker, see ``shards``)::

    tasksets/<split>/part-*.parquet                    train and eval tasks
    staging/round=N/rollouts/part-*.parquet            explorer output, verify's input (a hand-off)
    experiences/usual/round=N/part-*.parquet           accepted explorer experiences
    experiences/expert/taskset/part-*.parquet          demonstrations: the taskset's gold answers
    experiences/expert/ingest-<hash>/part-*.parquet    demonstrations: ingested ones (and corrections)
    experiences/human/ingest-<hash>/part-*.parquet     rated responses (human feedback)
    quarantine/round=N/part-*.parquet                  rows that broke the contract, with ``reason``
    quarantine/{tasks,tasks-pipeline,expert,ingest-<hash>}/  bad task rows, demonstrations, ingested rows
    quarantine/failed/round=N/part-*.parquet           the bad rows of a round that failed its contract
    checkpoints/vNNNNNN/                               weights (a Hugging Face model dir), optimizer,
                                                       RNG and buffer state; checkpoint.json commits it
    weights/vNNNNNN/model.safetensors                  published policy weights (sync.method=checkpoint);
                                                       weights.json commits a version
    weights/latest.json                                the newest published version (a pointer)
    state/campaign/gNNNNNNNN.json                      the campaign's state, one generation per update
                                                       (state/explorer/: an explorer process's own)
    state/<name>.json                                  what resume needs: the FIFO cursor, replay use
                                                       counts, measured pass rates; ingest-<hash>: the
                                                       report of an ingested file

``round=N`` is the hive-style key of the ``round`` column every row of those shards carries (N
unpadded: the column's value), so DuckDB, ``pyarrow.dataset.dataset`` and Spark read a directory
of rounds with their defaults and get the same integer either way (``pyarrow.parquet.read_table``
forces dictionary-typed hive keys: pass it ``partitioning=None``). No other directory level is
``key=value``, so no reader invents a column; every expert shard sits one level down
(``taskset/``, ``ingest-<hash>/``). Rounds sort by number, not by key text (``shard_order``).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from rftflow.components.buffer.shards import (ShardError, commit_shard, committed_shards, encode_shard, is_committed,
                                     marker_key, read_committed, read_shard, shard_key, write_shard)
from rftflow.components.buffer.store import ObjectStore, open_store, store_options
from rftflow.components.buffer.write_behind import OrderedStore, WriteBehind
from rftflow.components.data.experience import SCHEMA

# What ``rftflow buffer`` can read: kind → key prefix under the campaign.
# ``quarantine`` is every rejected row except those of rounds that failed (above the bad-row threshold),
# which are ``failed``: such a round may run again and quarantine the same rows under its own round.
KINDS = {"usual": ("experiences", "usual"), "expert": ("experiences", "expert"), "human": ("experiences", "human"),
         "quarantine": ("quarantine",), "failed": ("quarantine", "failed"), "tasks": ("tasksets",)}

class CorruptCheckpoint(ValueError):
    """A committed checkpoint whose files do not match its manifest (missing, truncated, altered)."""


STORE_FILE = "store.json"
CHECKPOINT_MANIFEST = "checkpoint.json"  # a checkpoint's commit marker, written last
WEIGHTS_MANIFEST = "weights.json"  # a published weight version's commit marker, written last
_WHERE = ("endpoint_url", "region", "addressing_style")  # how to reach the store; never credentials
_ROUND = re.compile(r"/round=(\d+)/")


def run_store_url(storage, run_dir: str | Path) -> str:
    """The store URL of a run: ``storage.url``, else ``file://<run_dir>/store``."""
    return storage.url or (Path(run_dir).resolve() / "store").as_uri()


def open_run_store(storage, run_dir: str | Path) -> ObjectStore:
    """The store of a run (``storage``: a ``StorageConfig``; default ``file://<run_dir>/store``),
    recorded in ``<run_dir>/store.json`` (URL, endpoint, region, addressing style) so that
    ``rftflow buffer RUN_DIR`` finds it, even after a crash."""
    run_dir = Path(run_dir)
    url = run_store_url(storage, run_dir)
    options = store_options(storage) if url.startswith("s3://") else {}
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


MOVED_ASIDE = re.compile(r"\.moved-\d{8}-\d{6}$")  # ``<campaign>.moved-<UTC time>``: set aside by --restart


def campaigns_in(store: ObjectStore, moved_aside: bool = False) -> list[str]:
    """Campaign prefixes in ``store``: top-level names that hold a taskset, experiences (an
    ingested file may come before the campaign's first run) or state; those a restart moved
    aside (``<name>.moved-<time>``) only with ``moved_aside``."""
    names = set()
    for key in store.list(""):
        campaign, _, rest = key.partition("/")
        if rest.split("/", 1)[0] in ("tasksets", "experiences", "state"):
            names.add(campaign)
    return sorted(n for n in names if moved_aside or not MOVED_ASIDE.search(n))


def moved_aside(store: ObjectStore, campaign: str) -> list[str]:
    """The earlier runs of ``campaign`` that ``--restart`` moved aside, oldest first."""
    return [n for n in campaigns_in(store, moved_aside=True) if MOVED_ASIDE.search(n) and
            n[:MOVED_ASIDE.search(n).start()] == campaign]


def open_campaign(location: str | Path, campaign: str | None = None) -> CampaignStore:
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
    return CampaignStore(store, campaign)


def round_dir(round_no: int) -> str:
    """The directory of a round: ``round=N``, the value of the rows' ``round`` column."""
    return f"round={round_no}"


def ingest_dir(ingest_id: str) -> str:
    """The directory (and state name) of an ingested file: ``ingest-<content hash>``."""
    return f"ingest-{ingest_id}"


def shard_order(key: str) -> tuple[int, str]:
    """Sort key of a shard: its round number (0 where the key has none), then the key."""
    match = _ROUND.search(key)
    return (int(match.group(1)) if match else 0, key)


class CampaignStore:
    """Typed access to one campaign's objects in ``store`` (see the module docstring for the layout).

    Committed shards never change, so the ones read often (explorer rounds, demonstrations, human
    rows) are cached in memory, and so is a staging shard this object committed until the next
    stage reads it (a retried stage, or another process, reads the store).

    With ``write_behind`` (a running campaign), a round's writes — staging, accepted experiences,
    quarantine, state files — are queued to one background thread (``write_behind``: in order,
    read-your-writes); ``objects`` is then the store as ordered behind that queue, and ``flush``
    waits for it.
    """

    def __init__(self, store: ObjectStore, campaign: str, write_behind: bool = False):
        self.campaign = campaign
        self._queue = WriteBehind() if write_behind else None
        self._direct = store  # the queue's own writes go here
        self.objects: ObjectStore = OrderedStore(store, self._queue) if self._queue else store
        self._shards: dict[str, pa.Table] = {}
        self._staged: dict[str, pa.Table] = {}
        self._usual: dict[str, int] = {}  # usual shards known committed (or queued), listed or written here → round
        self._expert: pa.Table | None = None
        self._human: pa.Table | None = None

    @property
    def url(self) -> str:
        return self.objects.url

    def key(self, *parts: str) -> str:
        return "/".join([self.campaign, *parts])

    def shard(self, key: str) -> pa.Table:
        """Committed shard ``key`` (cached)."""
        if key not in self._shards:
            self._shards[key] = read_shard(self.objects, key)
        return self._shards[key]

    def flush(self) -> None:
        """Wait until the queued writes are in the store (raising a failed one's error)."""
        if self._queue is not None:
            self._queue.flush()

    def _write_round_shard(self, prefix: str, table: pa.Table, cache: dict[str, pa.Table] | None) -> str:
        """``write_shard`` of a round's rows: queued behind the compute when writing behind.

        Queued, the shard goes into ``cache`` at once (the next stage reads it from there); a shard
        already committed (by an earlier attempt) or queued is not written again, as ``write_shard``."""
        if self._queue is None:
            return write_shard(self.objects, prefix, table, committed=cache)
        key, marker = shard_key(prefix), marker_key(prefix)
        if self._queue.pending(key) or is_committed(self._direct, prefix):
            return key
        if cache is not None:
            cache[key] = table

        def write() -> None:
            if not commit_shard(self._direct, prefix, encode_shard(table), table.num_rows):
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
    def write_staging(self, round_no: int, stage: str, table: pa.Table) -> str:
        return self._write_round_shard(self.key("staging", round_dir(round_no), stage), table, self._staged)

    def read_staging(self, round_no: int, stage: str) -> pa.Table:
        prefix = self.key("staging", round_dir(round_no), stage)
        staged = self._staged.pop(shard_key(prefix), None)
        return staged if staged is not None else read_committed(self.objects, prefix)

    # experiences -----------------------------------------------------------------------------
    def write_usual(self, round_no: int, table: pa.Table, keep: bool = True) -> str:
        """Commit a round's accepted explorer rows; ``keep``: also in the shard cache, for a trainer
        in this process (an explorer process alone never reads them)."""
        key = self._write_round_shard(self.key("experiences", "usual", round_dir(round_no)), table,
                                      self._shards if keep else None)
        self._usual[key] = round_no
        return key

    def round_committed(self, round_no: int) -> bool:
        """Whether round ``round_no``'s explorer experiences are committed (its buffer stage ran)."""
        return is_committed(self.objects, self.key("experiences", "usual", round_dir(round_no)))

    def usual_shards(self, max_round: int | None = None) -> list[str]:
        """Committed usual-experience shards, oldest round first (up to ``max_round``); writing
        behind, those queued too (cached: ``shard`` reads them without waiting).

        The store is listed only when some round up to ``max_round`` (or any, without one) has no
        shard known here: a committed shard never changes or goes while a campaign runs, so the
        ones listed or written here stay known (a listing grows with the rounds, and is a
        request on S3)."""
        known = dict(self._usual)  # a copy (one C call): in mode async the explorer's lane writes meanwhile
        if max_round is None or not set(known.values()).issuperset(range(1, max_round + 1)):
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
        return write_shard(self.objects, self.key("experiences", "expert", "taskset"), table)

    def write_ingested(self, source: str, ingest_id: str, table: pa.Table) -> bool:
        """Ingested ``expert`` demonstrations or ``human``-rated responses under ``ingest-<id>``;
        False if they were stored before (idempotent)."""
        self._expert = self._human = None
        prefix = self.key("experiences", source, ingest_dir(ingest_id))
        if is_committed(self.objects, prefix):
            return False
        write_shard(self.objects, prefix, table)
        return True

    def read_expert(self) -> pa.Table:
        """Every stored demonstration: gold answers and ingested ones (cached)."""
        if self._expert is None:
            self._expert = read_committed(self.objects, self.key("experiences", "expert"), SCHEMA)
        return self._expert

    def read_human(self) -> pa.Table:
        """Every stored human-rated response (cached)."""
        if self._human is None:
            self._human = read_committed(self.objects, self.key("experiences", "human"), SCHEMA)
        return self._human

    def write_quarantine(self, where: int | str, table: pa.Table) -> str | None:
        """Rejected rows (with ``reason``) under ``quarantine/round=N`` (an int) or ``quarantine/<where>``
        (``tasks``, ``ingest-<hash>``, ``failed/round=N``); nothing is written for an empty table."""
        if table.num_rows == 0:
            return None
        if isinstance(where, int):  # a round's, behind its compute
            return self._write_round_shard(self.key("quarantine", round_dir(where)), table, None)
        return write_shard(self.objects, self.key("quarantine", where), table)

    # checkpoints ------------------------------------------------------------------------------
    def checkpoint_prefix(self, version: int) -> str:
        return self.key("checkpoints", f"v{version:06d}")

    def write_checkpoint(self, version: int, files: Path, meta: dict[str, Any]) -> str:
        """Upload every file under ``files`` to ``checkpoints/vNNNNNN/``, then commit it: the
        manifest ``checkpoint.json`` (``meta`` + each file's bytes and sha256) is written last,
        put-if-absent, so a checkpoint is visible only whole. Returns the prefix."""
        prefix = self.checkpoint_prefix(version)
        listed = {}
        for path in sorted(p for p in files.rglob("*") if p.is_file()):
            data = path.read_bytes()
            name = path.relative_to(files).as_posix()
            self.objects.put(f"{prefix}/{name}", data)
            listed[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        manifest = json.dumps({**meta, "version": version, "files": listed}, sort_keys=True, indent=1).encode()
        self.objects.put(f"{prefix}/{CHECKPOINT_MANIFEST}", manifest, if_absent=True)
        self.objects.delete(f"{prefix}/corrupt.json")  # a corrupt one set aside at this version is replaced
        return prefix

    def checkpoints(self) -> list[dict[str, Any]]:
        """The manifests of the committed checkpoints, oldest version first."""
        keys = [k for k in self.objects.list(self.key("checkpoints") + "/") if k.endswith("/" + CHECKPOINT_MANIFEST)]
        return [json.loads(self.objects.get(k)) for k in sorted(keys)]

    def read_checkpoint(self, version: int, into: Path) -> dict[str, Any]:
        """Download committed checkpoint ``version`` into ``into``, each file checked against the
        size and sha256 its manifest gives; ``CorruptCheckpoint`` names the first that differs or is
        missing. Returns its manifest."""
        prefix = self.checkpoint_prefix(version)
        manifest = json.loads(self.objects.get(f"{prefix}/{CHECKPOINT_MANIFEST}"))
        for name, meta in manifest["files"].items():
            try:
                data = self.objects.get(f"{prefix}/{name}")
            except KeyError:
                raise CorruptCheckpoint(f"checkpoint {prefix} (round {manifest.get('round')}) is corrupt: "
                                        f"{name} is missing") from None
            if len(data) != meta["bytes"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise CorruptCheckpoint(f"checkpoint {prefix} (round {manifest.get('round')}) is corrupt: {name} "
                                        f"has {len(data)} bytes of other content than the {meta['bytes']} its "
                                        "manifest describes")
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes(data)
        return manifest

    def set_aside_checkpoint(self, version: int, reason: str) -> None:
        """Uncommit a corrupt checkpoint: its manifest goes to ``corrupt.json`` with ``reason`` (its
        files stay for a look, until the round's checkpoint is written again or ``buffer gc``)."""
        prefix = self.checkpoint_prefix(version)
        manifest = json.loads(self.objects.get(f"{prefix}/{CHECKPOINT_MANIFEST}"))
        self.objects.put(f"{prefix}/corrupt.json", json.dumps({**manifest, "reason": reason}, indent=1).encode())
        self.objects.delete(f"{prefix}/{CHECKPOINT_MANIFEST}")

    def delete_checkpoint(self, version: int) -> None:
        self._delete_committed(self.checkpoint_prefix(version), CHECKPOINT_MANIFEST)

    def _delete_committed(self, prefix: str, manifest: str) -> None:
        """Uncommit (the manifest first, so no reader trusts what is left), then delete ``prefix``."""
        self.objects.delete(f"{prefix}/{manifest}")
        for key in self.objects.list(prefix + "/"):
            self.objects.delete(key)

    # published weights (sync.method=checkpoint) -----------------------------------------------
    def weights_prefix(self, version: int) -> str:
        return self.key("weights", f"v{version:06d}")

    def write_weights(self, version: int, safetensors: bytes) -> str:
        """Publish policy weights as ``version``: ``weights/vNNNNNN/model.safetensors``, then its
        manifest ``weights.json`` (put-if-absent: the commit), then the pointer
        ``weights/latest.json``. A reader trusts a version only once its manifest is there."""
        prefix = self.weights_prefix(version)
        self.objects.put(f"{prefix}/model.safetensors", safetensors)
        manifest = {"version": version, "bytes": len(safetensors), "sha256": hashlib.sha256(safetensors).hexdigest()}
        self.objects.put(f"{prefix}/{WEIGHTS_MANIFEST}", json.dumps(manifest, sort_keys=True).encode(), if_absent=True)
        self.objects.put(self.key("weights", "latest.json"), json.dumps({"version": version}).encode())
        return prefix

    def published_weights(self) -> list[int]:
        """Committed weight versions, oldest first."""
        keys = self.objects.list(self.key("weights") + "/")
        return sorted(int(k.split("/")[-2][1:]) for k in keys if k.endswith("/" + WEIGHTS_MANIFEST))

    def read_weights(self, version: int) -> bytes:
        """The safetensors bytes of committed version ``version`` (checked against its manifest)."""
        prefix = self.weights_prefix(version)
        manifest = json.loads(self.objects.get(f"{prefix}/{WEIGHTS_MANIFEST}"))
        data = self.objects.get(f"{prefix}/model.safetensors")
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise ValueError(f"{prefix}/model.safetensors: its bytes are not the ones its manifest describes")
        return data

    def delete_weights(self, version: int) -> None:
        self._delete_committed(self.weights_prefix(version), WEIGHTS_MANIFEST)

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
            return read_committed(self.objects, prefix, keys=sorted(keys, key=shard_order))
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
