"""The object-store contract and the shard commit protocol, on ``file://`` and on a real S3 HTTP
server (moto's server mode on 127.0.0.1, a fresh bucket per test; see tests/s3server.py)."""

import logging
import os
import io
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from botocore.exceptions import ClientError

from rftflow.components.buffer.shards import ShardError, committed_shards, read_committed, shard_key, write_shard
from rftflow.components.buffer.store import FileStore, S3Store, StoreUnavailable, open_store

MiB = 1024 * 1024


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


def test_put_overwrites_and_put_if_absent_does_not(store):
    assert store.put("k", b"first") and store.put("k", b"second")
    assert store.get("k") == b"second"
    assert store.put("k", b"third", if_absent=True) is False
    assert store.get("k") == b"second"
    assert store.put("fresh", b"", if_absent=True) is True and store.get("fresh") == b""


def test_put_if_absent_has_exactly_one_winner(store):
    for round_ in range(3):
        results = []
        barrier = threading.Barrier(8)

        def racer(i: int) -> None:
            barrier.wait()
            results.append((store.put(f"race/key{round_}", f"writer-{i}".encode(), if_absent=True), i))

        threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [i for ok, i in results if ok]
        assert len(results) == 8 and len(winners) == 1
        assert store.get(f"race/key{round_}") == f"writer-{winners[0]}".encode()


def test_shard_is_invisible_until_committed_and_rewrites_are_idempotent(store):
    table = pa.table({"x": [1, 2, 3]})
    store.put(shard_key("exp/round=1", 0), b"half-written garbage")  # a crashed writer's leftover
    assert committed_shards(store, "exp") == []
    key = write_shard(store, "exp/round=1", table)
    write_shard(store, "exp/round=1", pa.table({"x": [9]}))  # re-run of the same round: no-op
    assert committed_shards(store, "exp") == [key]
    assert read_committed(store, "exp").column("x").to_pylist() == [1, 2, 3]


def test_a_staging_shard_is_read_back_as_committed_by_whoever_committed_it(open_at):
    from rftflow.components.buffer.experiences import ExperienceStore

    rows = pa.table({"x": pa.array([1, 2, 3], pa.int32()), "tag": ["a", None, "c"]})
    writer, reader = ExperienceStore(open_at(), "c1"), ExperienceStore(open_at(), "c1")
    writer.write_staging(1, "rollouts", rows)
    from_store = reader.read_staging(1, "rollouts")
    assert writer.read_staging(1, "rollouts").equals(from_store) and from_store.equals(rows)
    # a rerun of the stage commits nothing (the shard is there): the next stage reads the
    # committed rows, not the rerun's
    rerun = ExperienceStore(open_at(), "c1")
    rerun.write_staging(1, "rollouts", pa.table({"x": pa.array([9], pa.int32()), "tag": ["z"]}))
    assert rerun.read_staging(1, "rollouts").equals(rows)
    # what the writer kept goes with its first read: a retried stage reads the store
    writer.write_staging(2, "verified", rows)
    writer.read_staging(2, "verified")
    store = open_at()
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": pa.array([7], pa.int32()), "tag": ["q"]}), sink)
    store.put(shard_key("c1/staging/round=2/verified"), sink.getvalue())  # the store's bytes change
    with pytest.raises(ShardError):
        writer.read_staging(2, "verified")
    # accepted rows: kept for this process's trainer, or not (an explorer alone never reads them)
    kept, not_kept = writer.write_usual(1, rows), writer.write_usual(2, rows, keep=False)
    for key in (kept, not_kept):
        store.put(key, sink.getvalue())
    assert writer.shard(kept).equals(rows)
    with pytest.raises(ShardError):
        writer.shard(not_kept)


def test_a_shard_overwritten_after_its_commit_fails_loudly_on_read(store):
    # two writers raced: A committed, then B's data landed over A's bytes under A's marker
    key = write_shard(store, "race/round=1", pa.table({"x": [1, 2, 3]}))
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": [7]}), sink)
    store.put(key, sink.getvalue())
    with pytest.raises(ShardError, match=r"race/round=1/part-00000.parquet is corrupt: \d+ bytes where its commit "
                                         r"marker records \d+ \(truncated or replaced"):
        read_committed(store, "race")


def test_a_shard_truncated_or_altered_after_its_commit_is_named_with_what_differs(store):
    key = write_shard(store, "cut/round=1", pa.table({"x": list(range(100))}))
    data = store.get(key)
    store.put(key, data[: len(data) // 2])
    with pytest.raises(ShardError, match=rf"{key} is corrupt: {len(data) // 2} bytes where its commit marker records "
                                         rf"{len(data)} \(truncated"):
        read_committed(store, "cut")
    store.put(key, data[:-1] + bytes([data[-1] ^ 1]))  # same size, one bit flipped
    with pytest.raises(ShardError, match=rf"{key} is corrupt: its bytes differ from the sha256"):
        read_committed(store, "cut")


def test_missing_key_raises_key_error_naming_the_key(store):
    with pytest.raises(KeyError, match="no/such/object.bin"):
        store.get("no/such/object.bin")
    assert not store.exists("no/such/object.bin")
    store.delete("no/such/object.bin")
    assert store.list("no/") == []


@pytest.mark.parametrize("bad", ["", "/abs", "a/../b", "..", "a//b", "./a", "a/"])
def test_bad_keys_are_refused_the_same_way(store, bad):
    for call in (lambda: store.put(bad, b"x"), lambda: store.get(bad), lambda: store.exists(bad),
                 lambda: store.delete(bad)):
        with pytest.raises(ValueError, match="invalid object key"):
            call()


def test_list_is_sorted_and_relative_to_the_store_prefix(open_at):
    root = open_at()
    for key in ("x/2", "x/10", "x/1", "xy/1", "x/sub/z", "b"):
        root.put(key, key.encode())
    assert root.list() == ["b", "x/1", "x/10", "x/2", "x/sub/z", "xy/1"]
    assert root.list("x") == ["x/1", "x/10", "x/2", "x/sub/z", "xy/1"]  # a plain string prefix
    assert root.list("x/") == ["x/1", "x/10", "x/2", "x/sub/z"]
    sub = open_at("x")
    assert sub.list() == ["1", "10", "2", "sub/z"]  # not xy/…: the store prefix is a directory
    assert sub.list("sub/") == ["sub/z"] and sub.get("sub/z") == b"x/sub/z"
    assert sub.put("3", b"three") and root.get("x/3") == b"three"


def test_list_returns_every_key_past_one_page(store):
    keys = [f"many/part-{i:05d}" for i in range(1100)]  # > 1000: S3 lists in pages of 1000
    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(lambda k: store.put(k, b"."), keys))
    store.put("other/1", b".")
    assert store.list("many/") == keys
    assert len(store.list()) == 1101


def test_list_leaves_out_what_another_writer_deletes_meanwhile(store):
    """A trainer process deletes old weight versions while an explorer process lists them."""
    stop, churning, errors = threading.Event(), threading.Event(), []

    def churn():
        v = 0
        while not stop.is_set():
            store.put(f"weights/v{v:06d}/model.bin", b"w")
            store.put(f"weights/v{v:06d}/weights.json", b"{}")
            if v >= 2:
                store.delete(f"weights/v{v - 2:06d}/weights.json")
                store.delete(f"weights/v{v - 2:06d}/model.bin")
                churning.set()  # from here on two versions are there between deletes
            v += 1

    writer = threading.Thread(target=churn)
    writer.start()
    try:  # the listings start once the writer deletes (on a loaded machine it may start late)
        assert churning.wait(60), "the writer thread did not get going within 60 s"
        listings = []
        for _ in range(300):
            try:
                listings.append(store.list("weights/"))
            except OSError as e:
                errors.append(e)
    finally:
        stop.set()
        writer.join()
    assert not errors, errors[:3]
    assert all(keys == sorted(keys) and all(k.startswith("weights/v") for k in keys) for keys in listings)
    assert max(len(keys) for keys in listings) >= 2  # the listings saw versions come and go


def test_large_object_round_trips_as_multipart(open_at):
    store = open_at(multipart_threshold=5 * MiB)
    data = os.urandom(11 * MiB)
    assert store.put("big/blob.bin", data)
    assert store.get("big/blob.bin") == data
    if isinstance(store, S3Store):
        etag = store.client.head_object(Bucket=store.bucket, Key=f"{store.prefix}/big/blob.bin")["ETag"]
        assert etag.strip('"').endswith("-2")  # 8 MiB + 3 MiB parts: a multipart upload
        small = open_at(multipart_threshold=64 * MiB)
        small.put("big/single.bin", data)
        etag = small.client.head_object(Bucket=store.bucket, Key=f"{store.prefix}/big/single.bin")["ETag"]
        assert "-" not in etag and small.get("big/single.bin") == data


# -- s3:// specifics ----------------------------------------------------------------------------


def test_s3_keys_live_under_the_url_prefix(s3_server, s3_bucket):
    with open_store(f"s3://{s3_bucket}/runs/r1/", endpoint_url=s3_server.endpoint_url) as store:
        assert store.url == f"s3://{s3_bucket}/runs/r1"
        store.put("experiences/a.parquet", b"a")
        raw = store.client.list_objects_v2(Bucket=s3_bucket)
        assert [o["Key"] for o in raw["Contents"]] == ["runs/r1/experiences/a.parquet"]
    with open_store(f"s3://{s3_bucket}/runs/r", endpoint_url=s3_server.endpoint_url) as sibling:
        assert sibling.list() == []  # "runs/r" is not a prefix of "runs/r1/…" as a directory
    with open_store(f"s3://{s3_bucket}", endpoint_url=s3_server.endpoint_url) as whole:
        assert whole.url == f"s3://{s3_bucket}" and whole.list() == ["runs/r1/experiences/a.parquet"]


def test_s3_endpoint_region_and_credentials_come_from_the_environment(s3_server, s3_bucket):
    assert os.environ["AWS_ENDPOINT_URL"] == s3_server.endpoint_url  # set by the s3_server fixture
    with open_store(f"s3://{s3_bucket}/env") as store:
        assert store.put("k", b"v") and store.get("k") == b"v"
        assert store.client.meta.endpoint_url == s3_server.endpoint_url
        assert store.client.meta.region_name == "us-east-1"


def test_s3_options_reach_the_client(s3_server, s3_bucket):
    store = open_store(f"s3://{s3_bucket}/opts", endpoint_url=s3_server.endpoint_url, region="eu-west-1",
                       addressing_style="path", checksum="when_required", max_attempts=4, retry_mode="adaptive")
    with store:
        config = store.client.meta.config
        assert config.s3["addressing_style"] == "path" and store.client.meta.region_name == "eu-west-1"
        assert config.request_checksum_calculation == "when_required"
        assert config.response_checksum_validation == "when_required"
        assert config.retries == {"mode": "adaptive", "total_max_attempts": 4}
        assert store.put("k", b"v", if_absent=True) and store.get("k") == b"v"
    for option, value in [("addressing_style", "dns"), ("checksum", "always"), ("retry_mode", "legacy"),
                          ("max_attempts", 0)]:
        with pytest.raises(ValueError, match=option):
            open_store(f"s3://{s3_bucket}/opts", **{option: value})


def test_s3_retries_throttling_and_server_errors(s3_server, s3_bucket):
    with open_store(f"s3://{s3_bucket}/retry", endpoint_url=s3_server.endpoint_url, max_attempts=3) as store:
        s3_server.fail_next(1, 503)  # SlowDown
        assert store.put("k", b"v")
        s3_server.fail_next(1, 500)
        assert store.get("k") == b"v"
    # botocore's attempts spent: the store's outage budget keeps trying, then says so in one line
    with open_store(f"s3://{s3_bucket}/retry", endpoint_url=s3_server.endpoint_url, max_attempts=1,
                    outage_seconds=30) as store:
        s3_server.fail_next(3, 503)
        assert store.put("k2", b"v") and store.get("k2") == b"v"
    with open_store(f"s3://{s3_bucket}/retry", endpoint_url=s3_server.endpoint_url, max_attempts=1,
                    outage_seconds=0) as store:
        s3_server.fail_next(1, 503)
        with pytest.raises(StoreUnavailable, match=rf"store s3://{s3_bucket}/retry unavailable for 0 s \(put k3: "
                                                   r"ClientError: .*SlowDown.*\); run the same command again"):
            store.put("k3", b"v")
        assert not store.exists("k3")


def test_threads_in_one_outage_share_its_budget_and_its_one_warning(s3_server, s3_bucket, caplog):
    import time
    from urllib.parse import urlsplit

    from tests.faultproxy import FaultProxy

    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy, \
            open_store(f"s3://{s3_bucket}/outage", endpoint_url=proxy.endpoint_url, outage_seconds=6) as store:
        store.put("k", b"v")
        proxy.hang()
        began = time.monotonic()

        def late_get():  # joins the outage 2 s after it began: only the budget's rest is left to it
            time.sleep(2)
            with pytest.raises(StoreUnavailable):
                store.get("k")
            return time.monotonic() - began

        with caplog.at_level(logging.WARNING, logger="rftflow.store"), ThreadPoolExecutor(2) as pool:
            late = pool.submit(late_get)
            with pytest.raises(StoreUnavailable):
                store.get("k")
            ended = [time.monotonic() - began, late.result()]
        warnings = [r for r in caplog.records if "retrying for up to 6 s" in r.getMessage()]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert max(ended) < 6 + 2 * store.try_timeout, ended  # not 2 s + a budget of its own
        proxy.forward()
        assert store.get("k") == b"v"  # the outage ends with a success; the next one is logged again
        proxy.hang()
        with caplog.at_level(logging.WARNING, logger="rftflow.store"), pytest.raises(StoreUnavailable):
            store.get("k")
        assert len([r for r in caplog.records if "retrying for up to 6 s" in r.getMessage()]) == 2


def test_a_put_if_absent_whose_answer_was_lost_finds_its_own_object_and_succeeds(s3_server, s3_bucket):
    """A commit marker's put reaches the store, the connection drops before the answer: the retry's
    412 is this put's own earlier write, not another writer's."""
    import threading
    from urllib.parse import urlsplit

    from tests.faultproxy import FaultProxy

    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy, \
            open_store(f"s3://{s3_bucket}/lost", endpoint_url=proxy.endpoint_url, max_attempts=1,
                       outage_seconds=60) as store:
        proxy.lose_answers()
        back = threading.Timer(1.5, proxy.forward)
        back.start()
        assert store.put("marker", b"mine", if_absent=True)  # written by a try whose answer was lost
        back.join()
        assert store.get("marker") == b"mine"
        assert not store.put("marker", b"theirs", if_absent=True)  # another writer's bytes still lose


def test_s3_secrets_never_appear_in_url_repr_pickle_errors_or_logs(s3_server, s3_bucket, monkeypatch, caplog):
    secret, token = "SECRET-sentinel-7f3a9c", "TOKEN-sentinel-1b2d4e"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)  # moto accepts any credentials
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    caplog.set_level(logging.DEBUG)  # botocore's DEBUG records print request headers
    endpoint = s3_server.endpoint_url.replace("http://", f"http://user:{secret}@")
    shown = [repr(open_store(f"s3://{s3_bucket}/p", endpoint_url=endpoint))]
    store = open_store(f"s3://{s3_bucket}/p", endpoint_url=s3_server.endpoint_url)
    store.put("k", b"v")
    shown += [store.url, repr(store), pickle.dumps(store).decode("latin-1")]
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get("k") == b"v" and clone.url == store.url
    with pytest.raises(KeyError) as missing:
        store.get("missing")
    nobucket = open_store("s3://no-such-bucket-rftflow/p", endpoint_url=s3_server.endpoint_url)
    with pytest.raises(ClientError) as no_bucket:
        nobucket.put("k", b"v")
    with pytest.raises(ValueError) as in_url:
        open_store(f"s3://AKIDEXAMPLE:{secret}@{s3_bucket}/p")
    with pytest.raises(ValueError) as other_scheme:
        open_store(f"gs://user:{secret}@bucket/p")
    shown += [str(missing.value), str(no_bucket.value), str(in_url.value), str(other_scheme.value), caplog.text]
    assert "x-amz-security-token" in caplog.text.lower()  # the header was logged, with its value masked
    for text in shown:
        assert secret not in text and token not in text
    assert "supported: file://, s3://" in str(other_scheme.value)
    for s in (store, clone, nobucket):
        s.close()


def test_open_store_keeps_file_urls_and_plain_paths(tmp_path):
    plain = open_store(str(tmp_path / "plain"))
    assert isinstance(plain, FileStore) and plain.url == (tmp_path / "plain").as_uri()
    assert open_store((tmp_path / "plain").as_uri(), endpoint_url=None).url == plain.url  # None options: fine
    with pytest.raises(TypeError, match="s3://"):
        open_store((tmp_path / "plain").as_uri(), endpoint_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match=r"supported: file://, s3://"):
        open_store("ftp://host/path")
    with pytest.raises(ValueError, match="bucket"):
        open_store("s3:///prefix-without-bucket")
    with pytest.raises(ValueError, match="query"):
        open_store("s3://bucket/p?region=x")


def test_file_urls_round_trip_through_as_uri(tmp_path):
    spaced = tmp_path / "my dir" / "store"
    store = open_store(str(spaced))
    store.put("k", b"v")
    assert "%20" in store.url  # the URL summary.json records ...
    assert open_store(store.url).get("k") == b"v"  # ... opens the same directory
    assert open_store(f"file://localhost{spaced}").get("k") == b"v"
    with pytest.raises(ValueError, match="a host part is not a directory"):
        open_store("file://rel/store")


def test_config_refuses_credentials_in_storage_urls_without_echoing_them(monkeypatch):
    from rftflow.components.buffer.store import store_options
    from rftflow.components.config import ConfigError, load_config

    for key, url in (("storage.url", "s3://AKID:SECRET-x1@bucket/p"),
                     ("storage.endpoint_url", "http://user:SECRET-x1@127.0.0.1:9000")):
        with pytest.raises(ConfigError, match=rf"{key}.*credentials do not belong in a URL") as e:
            load_config(None, [f"{key}={url}"])
        assert "SECRET-x1" not in str(e.value)
    # unset checksum and attempts: the AWS environment decides, else when_required and 5
    monkeypatch.delenv("AWS_REQUEST_CHECKSUM_CALCULATION", raising=False)
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    options = store_options(load_config(None, []).storage)
    assert options["checksum"] == "when_required" and options["max_attempts"] == 1
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    options = store_options(load_config(None, []).storage)
    assert options["checksum"] is None and options["max_attempts"] is None  # botocore reads the environment
