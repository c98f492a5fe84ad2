"""Shard leases in a real store (file:// and S3 over HTTP against moto): one winner per claim, a
lease kept alive by its renewals, taken over once they stop, and the loser commits nothing."""

from __future__ import annotations

import threading
import time

import pytest

from rftflow.components.buffer.leases import ShardLeases, shard_of_groups, shard_slice
from rftflow.components.buffer.store import open_store


@pytest.fixture(params=["file", "s3"])
def objects(request, tmp_path):
    if request.param == "file":
        return open_store((tmp_path / "store").as_uri())
    server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    return open_store(f"s3://{bucket}/leases", endpoint_url=server.endpoint_url)


def test_of_several_processes_claiming_a_shard_at_once_exactly_one_wins(objects):
    contenders = [ShardLeases(objects, "c", lease_seconds=30, owner=f"p{i}") for i in range(6)]
    won, start = [], threading.Barrier(len(contenders))

    def claim(leases):
        start.wait()
        if leases.acquire(3, 1) is not None:
            won.append(leases.owner)

    threads = [threading.Thread(target=claim, args=(c,)) for c in contenders]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(won) == 1
    for c in contenders:
        c.close()


def test_a_renewed_lease_is_kept_and_a_silent_one_is_taken_over(objects):
    """Renewals counted, not timed: after each renewal the other process's look finds the lease
    alive however long it waited; once they stop, the next look past its lease length takes over."""
    holder = ShardLeases(objects, "c", lease_seconds=3600, owner="holder")  # it renews when told (below)
    other = ShardLeases(objects, "c", lease_seconds=0.05, owner="other")
    lease = holder.acquire(1, 0)
    assert lease is not None and lease.generation == 0
    assert other.acquire(1, 0) is None  # its first look: the lease is new to it
    for _ in range(3):
        time.sleep(0.1)  # longer than the other's lease length: only the renewal keeps the lease
        holder.renew()
        assert other.acquire(1, 0) is None
    holder.close()  # the holder stops renewing (it died)
    time.sleep(0.1)
    taken = other.acquire(1, 0)
    assert taken is not None and taken.generation == 1
    assert not holder.still_held(lease) and other.still_held(taken)  # the old holder must not commit
    other.close()


def test_a_held_lease_is_renewed_by_its_own_thread_until_closed(objects):
    """The holder's thread rewrites its lease's generation (a new beat) every lease_seconds / 4,
    counted here in the store, and stops at ``close``."""
    import json

    holder = ShardLeases(objects, "c", lease_seconds=0.2, owner="holder")
    lease = holder.acquire(2, 0)
    beats = [0]
    deadline = time.monotonic() + 120  # generous: what is asserted is the count, not the pace
    while beats[-1] < 3 and time.monotonic() < deadline:
        beats.append(json.loads(objects.get(lease.key))["beat"])
        time.sleep(0.01)
    assert beats[-1] >= 3 and beats == sorted(beats), beats  # renewals stored, in order
    holder.close()
    holder._beating.join(timeout=120)
    assert not holder._beating.is_alive()


def test_shards_cut_a_round_into_contiguous_slices_and_rows_find_their_shard():
    assert [shard_slice(10, 3, k) for k in range(3)] == [range(0, 3), range(3, 6), range(6, 10)]
    groups = [f"r4-g{slot}-task{slot}" for slot in range(10)]
    assert shard_of_groups(groups, 10, 3) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
