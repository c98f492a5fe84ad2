"""The object-store contract and the shard commit protocol (file://; s3:// joins in a later issue)."""

import threading

import pyarrow as pa
import pytest

from components.shards import committed_shards, read_committed, shard_key, write_shard
from components.storage import open_store


@pytest.fixture
def store(tmp_path):
    return open_store((tmp_path / "store").as_uri())


def test_put_get_list_delete(store):
    assert store.put("a/b/1.bin", b"one") and store.put("a/b/2.bin", b"two") and store.put("a/c.bin", b"c")
    assert store.get("a/b/1.bin") == b"one" and store.exists("a/c.bin")
    assert store.list("a/b/") == ["a/b/1.bin", "a/b/2.bin"]
    assert store.list("a/") == ["a/b/1.bin", "a/b/2.bin", "a/c.bin"]
    store.delete("a/c.bin")
    store.delete("a/c.bin")  # idempotent
    assert not store.exists("a/c.bin")
    with pytest.raises(KeyError, match="a/c.bin"):
        store.get("a/c.bin")
    with pytest.raises(ValueError, match="invalid object key"):
        store.put("../escape", b"x")


def test_put_if_absent_has_exactly_one_winner(store):
    results = []
    barrier = threading.Barrier(8)

    def racer(i: int) -> None:
        barrier.wait()
        results.append((store.put("race/key", f"writer-{i}".encode(), if_absent=True), i))

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for ok, i in results if ok]
    assert len(winners) == 1
    assert store.get("race/key") == f"writer-{winners[0]}".encode()


def test_shard_is_invisible_until_committed_and_rewrites_are_idempotent(store):
    table = pa.table({"x": [1, 2, 3]})
    store.put(shard_key("exp/round=000001", 0), b"half-written garbage")  # a crashed writer's leftover
    assert committed_shards(store, "exp") == []
    key = write_shard(store, "exp/round=000001", table)
    write_shard(store, "exp/round=000001", pa.table({"x": [9]}))  # re-run of the same round: no-op
    assert committed_shards(store, "exp") == [key]
    assert read_committed(store, "exp").column("x").to_pylist() == [1, 2, 3]
