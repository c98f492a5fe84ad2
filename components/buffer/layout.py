"""Where each kind of object of a campaign lives in the store: its keys, and where a run's store is.

Typed reads and writes are by what is stored: ``experiences.ExperienceStore`` (tasks, rounds,
demonstrations, feedback, quarantine, the buffer's state), ``weights.WeightStore`` (checkpoints,
published weights), ``campaign.state.StateStore`` (the campaign's state).

Object layout under ``<campaign>/`` (every Parquet shard committed with a marker, see ``shards``)::

    tasksets/<split>/part-*.parquet                    train and eval tasks
    staging/round=N/rollouts/part-*.parquet            explorer output, verify's input (a hand-off)
    experiences/usual/round=N/part-*.parquet           accepted explorer experiences (part K: shard K)
    experiences/expert/taskset/part-*.parquet          demonstrations: the taskset's gold answers
    experiences/expert/ingest-<hash>/part-*.parquet    demonstrations: ingested ones (and corrections)
    experiences/human/ingest-<hash>/part-*.parquet     rated responses (human feedback)
    quarantine/round=N/part-*.parquet                  rows that broke the contract, with ``reason``
    quarantine/{tasks,tasks-pipeline,expert,ingest-<hash>}/  bad task rows, demonstrations, ingested rows
    quarantine/failed/round=N/part-*.parquet           the bad rows of a round that failed its contract
    images/<sha256>                                    a picture rows show (vision tasks), stored once
                                                       by its content hash; the rows hold the hash and key
    checkpoints/vNNNNNN/                               weights (a Hugging Face model dir), optimizer,
                                                       RNG and buffer state; checkpoint.json commits it
    checkpoints/corrupt/vNNNNNN-<UTC time>/            a checkpoint found corrupt, set aside with
                                                       corrupt.json (why) until ``buffer gc``
    warm_start/sNNNNNNNN/                              the warm start's own checkpoint after NNNNNNNN
                                                       steps (the newest; gone after the next checkpoint)
    weights/vNNNNNN/model.safetensors                  published policy weights (sync.method=checkpoint);
                                                       weights.json commits a version
    weights/latest.json                                the newest published version (a pointer)
    state/campaign/gNNNNNNNN.json                      the campaign's state, one generation per update
                                                       (state/explorer/: an explorer process's own;
                                                       state/explorer-<hash>/: each of several)
    leases/round=N/shard-K/gNNNNN.json                 which explorer process explores shard K of round
                                                       N (explorer.shards > 1; see ``leases``)
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

import json
import re
from pathlib import Path
from typing import Any

from rftflow.components.buffer.store import ObjectStore, open_store, store_options

# What ``rftflow buffer`` can read: kind → key prefix under the campaign.
# ``quarantine`` is every rejected row except those of rounds that failed (above the bad-row threshold),
# which are ``failed``: such a round may run again and quarantine the same rows under its own round.
KINDS = {"usual": ("experiences", "usual"), "expert": ("experiences", "expert"), "human": ("experiences", "human"),
         "quarantine": ("quarantine",), "failed": ("quarantine", "failed"), "tasks": ("tasksets",)}

STORE_FILE = "store.json"
CHECKPOINT_MANIFEST = "checkpoint.json"  # a checkpoint's commit marker, written last
WEIGHTS_MANIFEST = "weights.json"  # a published weight version's commit marker, written last
# how to reach the store (and how long to wait for it), never credentials: what `rftflow status RUN_DIR` and
# `rftflow buffer RUN_DIR` open it with
_WHERE = ("endpoint_url", "region", "addressing_style", "outage_seconds")
_ROUND = re.compile(r"/round=(\d+)/")


def run_store_url(storage, run_dir: str | Path) -> str:
    """The store URL of a run: ``storage.url``, else ``file://<run_dir>/store``."""
    return storage.url or (Path(run_dir).resolve() / "store").as_uri()


def open_run_store(storage, run_dir: str | Path, *, record: bool = True) -> ObjectStore:
    """The store of a run (``storage``: a ``StorageConfig``; default ``file://<run_dir>/store``),
    recorded in ``<run_dir>/store.json`` (``record_run_store``) so that ``rftflow buffer RUN_DIR``
    finds it, even after a crash; ``record=False`` leaves that to the caller, once its work is done
    (a command that fails leaves the run dir's files as they were)."""
    url = run_store_url(storage, run_dir)
    store = open_store(url, **(store_options(storage) if url.startswith("s3://") else {}))
    if record:
        record_run_store(storage, run_dir, store)
    return store


def record_run_store(storage, run_dir: str | Path, store: ObjectStore) -> None:
    """``<run_dir>/store.json``: where ``store`` is (URL, endpoint, region, addressing style, outage
    budget; never credentials)."""
    run_dir = Path(run_dir)
    options = store_options(storage) if store.url.startswith("s3://") else {}
    run_dir.mkdir(parents=True, exist_ok=True)
    where = {"url": store.url, **{k: options[k] for k in _WHERE if options.get(k)}}
    (run_dir / STORE_FILE).write_text(json.dumps(where, indent=2) + "\n")


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


def checkpoint_prefix(campaign: str, version: int) -> str:
    return f"{campaign}/checkpoints/v{version:06d}"


def weights_prefix(campaign: str, version: int) -> str:
    return f"{campaign}/weights/v{version:06d}"
