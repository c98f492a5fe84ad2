"""Write-behind of a campaign's round writes, on ``file://`` and on a real S3 HTTP server: queued
writes are read back at once in this process, reach the store in the order they were made, never
let a later direct write (checkpoint, state) overtake them, and a failed one fails the next flush."""

import io
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.shards import ShardError, committed_shards, encode_shard, is_committed, read_shard, shard_key
from rftflow.components.data.experience import make_experience, to_table


class GatedStore:
    """A store whose ``put`` waits while the gate is closed, and records the order of the puts."""

    def __init__(self, store):
        self.inner, self.url, self.puts = store, store.url, []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_on: str | None = None  # a put of a key containing this raises

    def put(self, key, data, if_absent=False):
        assert self.gate.wait(30), "the gate was never opened"
        if self.fail_on and self.fail_on in key:
            raise ConnectionError(f"store down while writing {key}")
        self.puts.append(key)
        return self.inner.put(key, data, if_absent=if_absent)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def rows(round_no: int, n: int = 4) -> pa.Table:
    return to_table(make_experience(
        experience_id=f"e{round_no}-{i}", campaign="c", round=round_no, task_id=f"t{i}", group_id=f"g{round_no}",
        source="explorer", prompt="1 + 2 =", response="3", prompt_ids=[1, 2, 3], response_ids=[4, 5],
        response_logprobs=[-0.5, -0.25], response_mask=[1, 1], reward=1.0, rewards={"score": 1.0},
        model_version=1, info={"finished": True}) for i in range(n))


def test_a_shard_read_back_equals_the_table_written():
    # the shard caches hand the written table itself to readers in this process: it must be what
    # read_shard would decode from the bytes (reason column and nulls included)
    table = rows(1)
    verified = table.append_column("reason", pa.array([None, "bad", None, None], pa.string()))
    for t in (table, verified, pa.concat_tables([table, table])):
        assert pq.ParquetFile(io.BytesIO(encode_shard(t))).read().equals(t)


def test_queued_round_writes_are_read_in_process_and_stored_in_order(store):
    # given a store that holds every put until released
    gated = GatedStore(store)
    queued = ExperienceStore(gated, "c", write_behind=True)
    gated.gate.clear()
    # when a round's writes are made (none can reach the store yet)
    table = rows(1)
    queued.write_staging(1, "rollouts", table)
    usual = queued.write_usual(1, table)
    queued.write_state("fifo_cursor", {"shard": usual, "offset": 4})
    # then this process reads them back at once, from memory
    assert queued.read_staging(1, "rollouts").equals(table)
    assert queued.usual_shards() == [usual] and queued.shard(usual).equals(table)
    assert committed_shards(store, "c/experiences/usual") == [] and gated.puts == []
    # and once released, the store holds them, written in the order they were made
    gated.gate.set()
    queued.flush()
    assert read_shard(store, usual).equals(table)
    assert queued.read_state("fifo_cursor") == {"shard": usual, "offset": 4}
    assert [k.split("/")[1] for k in gated.puts] == ["staging", "staging", "experiences", "experiences", "state"]
    assert gated.puts.index("c/state/fifo_cursor.json") > gated.puts.index(usual)


def test_a_direct_write_or_a_read_of_a_queued_key_waits_for_the_queue(store):
    gated = GatedStore(store)
    queued = ExperienceStore(gated, "c", write_behind=True)
    gated.gate.clear()
    queued.write_usual(1, rows(1))
    queued.write_state("pass_rates", {"t1": 0.5})
    opener = threading.Timer(0.3, gated.gate.set)
    opener.start()
    # a checkpoint's put (through ``objects``) lands after the queued round writes, never before
    queued.objects.put("c/checkpoints/v000001/checkpoint.json", b"{}")
    assert gated.puts[-1] == "c/checkpoints/v000001/checkpoint.json"
    assert is_committed(store, "c/experiences/usual/round=1")
    opener.join()
    # a read of a key still queued sees the queued value
    gated.gate.clear()
    queued.write_state("pass_rates", {"t1": 1.0})
    threading.Timer(0.3, gated.gate.set).start()
    assert queued.read_state("pass_rates") == {"t1": 1.0}


def test_a_failed_queued_write_fails_the_next_flush_and_nothing_after_it_is_written(store):
    gated = GatedStore(store)
    gated.fail_on = "round=2"
    queued = ExperienceStore(gated, "c", write_behind=True)
    gated.gate.clear()
    queued.write_usual(1, rows(1))
    queued.write_usual(2, rows(2))
    queued.write_state("fifo_cursor", {"shard": "round=2", "offset": 4})
    gated.gate.set()
    with pytest.raises(ConnectionError, match="round=2"):
        queued.flush()
    queued.flush()  # raised once
    # the store keeps what was written before the failure, nothing queued behind it
    assert is_committed(store, "c/experiences/usual/round=1")
    assert not is_committed(store, "c/experiences/usual/round=2")
    assert queued.read_state("fifo_cursor") is None


def test_a_queued_shard_that_another_writer_commits_first_fails_loudly(store):
    gated = GatedStore(store)
    queued = ExperienceStore(gated, "c", write_behind=True)
    gated.gate.clear()
    queued.write_usual(1, rows(1, n=4))
    ExperienceStore(store, "c").write_usual(1, rows(1, n=2))  # another process, at the same time
    gated.gate.set()
    with pytest.raises(ShardError, match="another writer committed it"):
        queued.flush()
    # the loser's bytes went over the winner's before its marker lost: a reader is told, never mixed up
    with pytest.raises(ShardError, match="round=1/part-00000.parquet is corrupt"):
        read_shard(store, shard_key("c/experiences/usual/round=1"))
