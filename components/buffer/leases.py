"""Leases on a round's shards, in the store, for several explorer processes on one campaign.

A round's tasks are cut into ``explorer.shards`` shards; an explorer process explores a shard only
while it holds the shard's lease. A lease is a generation object
``<campaign>/leases/round=N/shard-K/gNNNNN.json`` created put-if-absent: of several processes
claiming generation 0 (or taking over generation g + 1), exactly one wins. The holder rewrites its
generation (a new ``beat``) every ``lease_seconds / 4``; another process takes the shard over when
the newest generation has not changed for ``lease_seconds`` by its own clock (so the processes'
clocks need not agree). The holder that finds a newer generation has lost the shard and commits
nothing of it; and because a shard's rows are committed put-if-absent under keys fixed by the
round and shard, a shard's experiences are stored exactly once whoever commits them.
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from rftflow.components.buffer.layout import round_dir
from rftflow.components.buffer.store import ObjectStore

log = logging.getLogger("rftflow")


@dataclass
class Lease:
    """Shard ``shard`` of round ``round_no``, held as generation ``generation``."""

    round_no: int
    shard: int
    generation: int
    key: str
    beat: int = 0
    lost: bool = False  # a newer generation appeared: another process took the shard over


class ShardLeases:
    """This process's leases on a campaign's shards (``owner``: a name unique to the process)."""

    def __init__(self, objects: ObjectStore, campaign: str, lease_seconds: float, owner: str | None = None):
        self.objects, self.campaign, self.lease_seconds = objects, campaign, lease_seconds
        self.owner = owner or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.held: dict[tuple[int, int], Lease] = {}
        self._seen: dict[str, tuple[bytes, float]] = {}  # another's newest generation: its bytes, since when
        self._lock = threading.Lock()
        self._beating: threading.Thread | None = None
        self._stop = threading.Event()

    def _prefix(self, round_no: int, shard: int) -> str:
        return f"{self.campaign}/leases/{round_dir(round_no)}/shard-{shard}/"

    def _body(self, lease: Lease) -> bytes:
        return json.dumps({"owner": self.owner, "generation": lease.generation, "beat": lease.beat}).encode()

    def _newest(self, round_no: int, shard: int) -> tuple[int, str] | None:
        keys = [k for k in self.objects.list(self._prefix(round_no, shard)) if k.endswith(".json")]
        if not keys:
            return None
        key = max(keys)
        return int(key.rsplit("/g", 1)[1].removesuffix(".json")), key

    def acquire(self, round_no: int, shard: int) -> Lease | None:
        """The shard's lease for this process: claimed if nobody holds it, taken over if its
        holder has not renewed it for ``lease_seconds``; None while another process holds it."""
        if (round_no, shard) in self.held:
            return self.held[(round_no, shard)]
        newest = self._newest(round_no, shard)
        if newest is None:
            generation = 0
        else:
            generation, key = newest
            try:
                data = self.objects.get(key)
            except KeyError:  # pruned meanwhile: look again next time
                return None
            first = self._seen.setdefault(key, (data, time.monotonic()))
            if first[0] != data:  # renewed since: its holder is alive
                self._seen[key] = (data, time.monotonic())
                return None
            if time.monotonic() - first[1] < self.lease_seconds:
                return None
            generation += 1
        lease = Lease(round_no, shard, generation, f"{self._prefix(round_no, shard)}g{generation:05d}.json")
        if not self.objects.put(lease.key, self._body(lease), if_absent=True):
            return None  # another process won this generation
        if generation:
            log.warning("explorer %s: took over shard %d of round %d (its lease was not renewed for %.0f s)",
                        self.owner, shard, round_no, self.lease_seconds)
        with self._lock:
            self.held[(round_no, shard)] = lease
        self._start_beating()
        return lease

    def release(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (its shard is committed, or lost)."""
        with self._lock:
            self.held.pop((lease.round_no, lease.shard), None)

    def still_held(self, lease: Lease) -> bool:
        """Whether no newer generation of ``lease``'s shard exists (asked just before a commit)."""
        newest = self._newest(lease.round_no, lease.shard)
        lease.lost = lease.lost or (newest is not None and newest[0] > lease.generation)
        return not lease.lost

    def renew(self) -> None:
        """A new beat on each held lease; a lease whose shard another process took over is lost."""
        with self._lock:
            leases = list(self.held.values())
        for lease in leases:
            if not self.still_held(lease):
                log.warning("explorer %s: lost shard %d of round %d to another explorer", self.owner, lease.shard,
                            lease.round_no)
                self.release(lease)
                continue
            lease.beat += 1
            self.objects.put(lease.key, self._body(lease))

    def _start_beating(self) -> None:
        if self._beating is not None:
            return

        def beat() -> None:
            while not self._stop.wait(self.lease_seconds / 4):
                try:
                    self.renew()
                except Exception as e:  # the store is down: the next beat tries again
                    log.warning("explorer %s: lease renewal failed (%s: %s)", self.owner, type(e).__name__,
                                (str(e).splitlines() or [""])[0][:200])

        self._beating = threading.Thread(target=beat, name="rftflow-leases", daemon=True)
        self._beating.start()

    def close(self) -> None:
        self._stop.set()


def shard_slice(tasks: int, shards: int, shard: int) -> range:
    """The slots (positions in a round's selection of ``tasks`` tasks) of shard ``shard``: contiguous,
    the sizes differing by at most one."""
    return range(shard * tasks // shards, (shard + 1) * tasks // shards)


def shard_of_groups(group_ids: list[str], tasks: int, shards: int) -> list[int]:
    """The shard of each row by its ``group_id`` (``r<round>-g<slot>-<task>``: the slot names it)."""
    bounds = [shard_slice(tasks, shards, k).stop for k in range(shards)]
    return [bisect.bisect_right(bounds, int(_SLOT.match(g).group(1))) for g in group_ids]


_SLOT = re.compile(r"r\d+-g(\d+)-")
