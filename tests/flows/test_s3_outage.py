"""The S3 store goes away mid-campaign (a proxy in front of the test server refuses connections,
then answers 503 SlowDown): within ``storage.outage_seconds`` the campaign rides it out and ends
as an undisturbed one; past it, the flow fails in one line and the same call resumes once the
store is back. Nothing is lost or repeated either way."""

from __future__ import annotations

import hashlib
import threading
import time
from urllib.parse import urlsplit

import pytest

from rftflow.components.buffer.store import open_store
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from tests.faultproxy import FaultProxy

pytestmark = pytest.mark.slow  # outages of 11-15 s

OUTAGE = ["name=outage", "rounds=4", "checkpoint.every=2", "eval.every=2", "trainer.warmup_steps=20",
          "storage.addressing_style=path"]


def _weights(run_dir) -> str:
    return hashlib.sha256((run_dir / "model" / "model.safetensors").read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, default_config, small) -> str:
    run_dir = tmp_path_factory.mktemp("undisturbed")
    CampaignRun(preflight(default_config, run_dir, [*small, *OUTAGE])).run()
    return _weights(run_dir)


def _outage_at_round(bucket: str, server, proxy: FaultProxy, round_no: int, schedule) -> threading.Thread:
    """Once round ``round_no`` is stored (seen through the server directly), play ``schedule``:
    (proxy mode, seconds) pairs; then forward again."""
    direct = open_store(f"s3://{bucket}/campaigns", endpoint_url=server.endpoint_url)

    def play() -> None:
        while not direct.exists(f"outage/experiences/usual/round={round_no}/_commit/part-00000.json"):
            time.sleep(0.05)
        for mode, seconds in schedule:
            getattr(proxy, mode)()
            time.sleep(seconds)
        proxy.forward()

    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


def _store(bucket: str, proxy: FaultProxy) -> list[str]:
    return [f"storage.url=s3://{bucket}/campaigns", f"storage.endpoint_url={proxy.endpoint_url}"]


def test_an_outage_within_the_budget_is_ridden_out(s3_server, s3_bucket, tmp_path, default_config, small, undisturbed,
                                                   caplog):
    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy:
        outage = _outage_at_round(s3_bucket, s3_server, proxy, 2, [("refuse", 8), ("slow_down", 3)])
        started = time.monotonic()
        summary = CampaignRun(preflight(default_config, tmp_path, [*small, *OUTAGE, *_store(s3_bucket, proxy)])).run()
        outage.join()
    assert time.monotonic() - started > 11  # it did wait the outage out
    assert any("retrying for up to 120 s" in r.getMessage() for r in caplog.records)
    assert summary["rounds"] == 4 and _weights(tmp_path) == undisturbed


def test_an_outage_past_the_budget_fails_in_one_line_and_resumes(prefect_api, s3_server, s3_bucket, tmp_path,
                                                                default_config, small, undisturbed):
    from rftflow.flows.campaign import rft_campaign

    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy:
        overrides = [*small, *OUTAGE, *_store(s3_bucket, proxy), "storage.outage_seconds=4", "storage.max_attempts=2"]
        outage = _outage_at_round(s3_bucket, s3_server, proxy, 3, [("refuse", 15)])  # after the round-2 checkpoint
        state = rft_campaign(str(default_config), str(tmp_path), overrides=overrides, return_state=True)
        assert state.is_failed() and "\n" not in state.message
        assert state.message.startswith(f"store s3://{s3_bucket}/campaigns unavailable for ")
        assert state.message.endswith("run the same command again once it is back")
        outage.join()  # the store is back
        summary = rft_campaign(str(default_config), str(tmp_path), overrides=overrides)
    assert summary["resumed_from_round"] == 2 and _weights(tmp_path) == undisturbed
    usual = open_store(f"s3://{s3_bucket}/campaigns", endpoint_url=s3_server.endpoint_url).list("outage/experiences/usual/")
    assert sorted(k.split("/")[3] for k in usual if k.endswith(".parquet")) == [f"round={r}" for r in range(1, 5)]
