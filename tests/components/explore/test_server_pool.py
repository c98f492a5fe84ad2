"""A pool of two real vLLM CPU servers (one thread each, each on its own core) behind the ``openai``
engine: requests spread by load, a server SIGKILLed mid-round has its requests answered by the
other (every task's group exactly once), and a server that comes back is synced to the newest
weights before it serves (the sync check's log-prob probe asks each live replica)."""

from __future__ import annotations

import threading
import time

import pyarrow.compute as pc
import pytest

from rftflow.infra.vllm_server import start_server, vllm_available, vllm_problem, vllm_servers

pytestmark = pytest.mark.skipif(not vllm_available(), reason=f"{vllm_problem()} (RFTFLOW_ALLOW_MISSING=vllm)")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from rftflow.components.explore.models import resolve_model_path

    logs = tmp_path_factory.mktemp("vllm-pool")
    with vllm_servers(resolve_model_path("builtin:tiny"), 2, threads=1, served_model="tiny", log_dir=logs) as started:
        try:
            yield started
        finally:
            for server in started:  # a test may have put a restarted server in the list
                server.stop()


def test_requests_spread_over_the_replicas_and_every_group_comes_back_once(servers, tiny):
    from rftflow.components.explore.engines import OpenAIRolloutEngine

    engine = OpenAIRolloutEngine([s.url for s in servers], "tiny", tiny[1])
    prompts = [f"{a} + {a + 1} =" for a in range(24)]
    groups = engine.generate(prompts, n=3, max_new_tokens=8)
    assert [len(g) for g in groups] == [3] * 24
    assert all(r.prompt_ids == engine.encode(p) for p, g in zip(prompts, groups) for r in g)
    served = [r.served for r in engine.pool.replicas]
    assert all(s >= 1 for s in served) and sum(served) == 4, served  # 24 prompts → 4 requests, 2 per replica
    assert all(r.outstanding == 0 for r in engine.pool.replicas)


@pytest.mark.slow
def test_a_server_killed_mid_round_loses_nothing_and_one_that_comes_back_is_synced(servers, tmp_path,
                                                                                   default_config, small):
    from rftflow.components.campaign.stages import Campaign
    from rftflow.components.explore.models import resolve_model_path

    tasks, repeat = 32, 4
    campaign = Campaign.from_config(default_config, tmp_path, [
        *small, "name=pool", "rounds=3", "explorer.engine=openai", "explorer.served_model=tiny",
        f"explorer.base_url=[{servers[0].url}, {servers[1].url}]", f"explorer.tasks_per_round={tasks}",
        f"explorer.repeat_times={repeat}", "explorer.max_new_tokens=48", "sync.check_logprobs_every=1",
        "trainer.warmup_steps=0", "threads=1"])
    campaign.prepare()
    campaign.warm_start()
    pool = campaign.engine.pool
    victim = pool.replicas[1]

    def kill_when_busy() -> None:  # SIGKILL the second server's group while it has requests in flight
        deadline = time.monotonic() + 120
        while victim.outstanding == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        servers[1].kill()

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    campaign.run_round(1)
    killer.join()
    assert not victim.up and servers[1].proc.poll() is not None
    usual = campaign.store.read_kind("usual", 1)
    per_task = usual.group_by("task_id").aggregate([([], "count_all")]).column("count_all").to_pylist()
    assert len(per_task) == tasks and set(per_task) == {repeat}  # every task's group, exactly once
    assert pc.count_distinct(usual.column("experience_id")).as_py() == usual.num_rows == tasks * repeat

    # the server comes back on its port: before it serves again it gets the newest weights
    servers[1] = start_server(resolve_model_path("builtin:tiny"), threads=1, served_model="tiny",
                              port=servers[1].port, cores="1")
    time.sleep(max(0.0, pool.replicas[1].probed_at + 5.5 - time.monotonic()))  # past REVIVE_SECONDS
    served_before = victim.served
    metrics = campaign.run_round(2)  # its sync check probes both replicas' log-probs against the trainer's
    assert victim.up and victim.served > served_before
    assert metrics["sync/checked"] == 1.0 and metrics["sync/logprob_max_diff"] < 1e-3
    assert campaign.store.read_kind("usual", 2).num_rows == tasks * repeat


@pytest.mark.slow
def test_a_frozen_server_is_found_by_its_health_and_its_requests_go_to_the_other(servers, tiny, monkeypatch):
    """A server SIGSTOPped mid-request (it accepts and never answers) is marked down once it does not
    answer ``/health`` either, and its requests are answered by the other: every group once."""
    import os
    import signal

    from rftflow.components.explore import server_pool
    from rftflow.components.explore.engines import OpenAIRolloutEngine

    monkeypatch.setattr(server_pool, "HEALTH_SECONDS", 2.0)  # the first health check sooner than 10 s
    engine = OpenAIRolloutEngine([s.url for s in servers], "tiny", tiny[1])
    victim, frozen = engine.pool.replicas[0], []

    def freeze_when_busy() -> None:
        deadline = time.monotonic() + 120
        while victim.outstanding == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        os.killpg(servers[0].proc.pid, signal.SIGSTOP)
        frozen.append(victim.outstanding)

    freezer = threading.Thread(target=freeze_when_busy)
    freezer.start()
    prompts = [f"{a} + {a + 1} =" for a in range(48)]
    try:
        groups = engine.generate(prompts, n=3, max_new_tokens=32)
    finally:
        freezer.join()
        os.killpg(servers[0].proc.pid, signal.SIGCONT)
    assert frozen and frozen[0] >= 1  # it held requests when it froze
    assert not victim.up and victim.failure.startswith("Hung: no answer to /health"), victim.failure
    assert [len(g) for g in groups] == [3] * 48
    assert all(r.prompt_ids == engine.encode(p) for p, g in zip(prompts, groups) for r in g)
    assert engine.pool.replicas[1].served >= 3  # its own two requests and the frozen one's
