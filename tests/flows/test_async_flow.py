"""Mode ``async`` through Prefect: round t + 1's explore, verify and buffer task runs run while
round t's train task run does (two lanes submitted at once), and the campaign completes."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_async_flow_overlaps_exploring_the_next_round_with_training(prefect_api, tmp_path, default_config, small):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from rftflow.flows.campaign import rft_campaign

    overrides = [*small, "name=async", "mode=async", "rounds=3", "trainer.warmup_steps=4", "threads=1",
                 "buffer.expert_per_round=256"]  # a train stage long enough to see the overlap
    summary = rft_campaign(str(default_config), str(tmp_path / "run"), overrides=overrides)
    assert summary["mode"] == "async" and summary["eval_accuracy_after"] is not None
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[summary["prefect_flow_run_id"]])))
    spans = {run.name: (run.start_time, run.end_time) for run in runs if run.state.is_completed()}
    for t in (1, 2):  # explore[r=t+1] began before train[r=t] ended, and train[r=t] before the lane ended
        explore, train = spans[f"explore[r={t + 1}]"], spans[f"train[r={t}]"]
        assert explore[0] < train[1] and train[0] < spans[f"buffer[r={t + 1}]"][1], (t, explore, train)
    assert {f"sync[r={r}]" for r in (1, 2, 3)} <= set(spans)
