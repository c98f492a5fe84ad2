"""Write-behind: a campaign's round writes reach the store from one background thread, in order.

A round's shards (the rollouts hand-off, accepted experiences, quarantine) and its small state
files are written while the next stages compute: the store's latency (HTTP round trips on
``s3://``, ``fsync`` on ``file://``) is waited out beside the compute instead of in it; it pays
where each request has latency (``benchmarks/write_behind.py`` measures it). What keeps it safe:

- one thread, first in first out: the store sees the writes in the order they were made, so a
  crash leaves a prefix of them — what a crash a moment earlier leaves, which resume handles (a
  campaign resumes from its newest checkpoint and redoes the rounds after it);
- read-your-writes: every other caller gets ``OrderedStore``, which waits for the queue before a
  write of its own (a checkpoint, weights, the campaign's state: never ahead of the rounds they
  follow) and before reading a key that a queued write touches;
- a failed write is raised by the next ``flush`` (and the next ``submit``); the campaign flushes
  at the end of every round (``Campaign.sync``), so a round is in the store before the next begins
  (the store's own retries, ``storage.outage_seconds``, ride out an outage first). Writes still
  queued when the interpreter exits are finished first (``concurrent.futures`` joins its threads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from rftflow.components.buffer.store import ObjectStore


class WriteBehind:
    """A queue of writes run by one thread, in submission order; ``pending`` names the keys queued.
    After a write fails, the ones queued behind it are not run (the store keeps a prefix)."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None  # started on the first write
        self._queued: list[tuple[tuple[str, ...], Future]] = []  # (keys a write puts, its future), oldest first
        self._failure: BaseException | None = None  # the first write that failed, until raised
        self._lock = threading.Lock()

    def submit(self, keys: tuple[str, ...], write: Callable[[], Any]) -> None:
        """Queue ``write``, which puts ``keys``; raises the error of an earlier write that failed."""
        self._raise_failure()
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rftflow-write-behind")
            self._queued.append((keys, self._executor.submit(self._run, write)))

    def _run(self, write: Callable[[], Any]) -> None:
        if self._failure is not None:
            return
        try:
            write()
        except BaseException as e:
            with self._lock:
                self._failure = e

    def pending(self, prefix: str = "") -> list[str]:
        """The keys under ``prefix`` (or equal to it) that queued writes have not yet put."""
        with self._lock:
            self._queued = [(k, f) for k, f in self._queued if not f.done()]
            return [key for keys, _ in self._queued for key in keys if key.startswith(prefix)]

    def flush(self) -> None:
        """Wait until every queued write has run; raise the first one's error, if one failed."""
        with self._lock:
            futures = [f for _, f in self._queued]
        for future in futures:
            future.result()
        self._raise_failure()

    def _raise_failure(self) -> None:
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:  # raised once; what was queued behind it was dropped
            raise failure


class OrderedStore:
    """``store`` as seen beside a ``WriteBehind`` over it: its writes wait for the queued ones, and
    a read of a key (or listing of a prefix) that a queued write touches waits for the queue."""

    def __init__(self, store: ObjectStore, queue: WriteBehind):
        self.inner, self.queue, self.url = store, queue, store.url

    def __repr__(self) -> str:
        return f"OrderedStore({self.inner!r})"

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        self.queue.flush()
        return self.inner.put(key, data, if_absent=if_absent)

    def delete(self, key: str) -> None:
        self.queue.flush()
        self.inner.delete(key)

    def get(self, key: str) -> bytes:
        self._settle(key)
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        self._settle(key)
        return self.inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        self._settle(prefix)
        return self.inner.list(prefix)

    def _settle(self, prefix: str) -> None:
        if self.queue.pending(prefix):
            self.queue.flush()

    def __getattr__(self, name: str) -> Any:  # close() and the like
        return getattr(self.inner, name)
