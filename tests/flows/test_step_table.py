"""A step added to the step table at run time runs as the built-in ones do: through
``CampaignRun.do`` (timed, logged to MLflow at its round) and as a Prefect task run named
``<step>[r=N]``, made from the same row."""

import pytest

from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from rftflow.components.campaign.schedule import Planned
from rftflow.components.campaign.steps import STEPS, register_step, unregister_step


@pytest.fixture(scope="module")
def attempt(tmp_path_factory, default_config, small):
    run = CampaignRun(preflight(default_config, tmp_path_factory.mktemp("steps"), [*small, "name=step-table"]))
    yield run
    run.end("finished")


@pytest.fixture
def noop():
    """A no-op step, ``noop``, that records the attempt and round it was given."""
    calls = []
    key = register_step("noop", lambda run, r: (calls.append((run, r)), {"noop/round": r})[1],
                        "Do nothing; say which round.")
    yield key, calls
    unregister_step(key)
    assert "noop" not in STEPS


def test_a_registered_step_runs_plain_timed_and_logged_at_its_round(attempt, noop):
    key, calls = noop
    result = attempt.do(Planned(key, 2))
    assert calls == [(attempt, 2)]
    assert result["noop/round"] == 2.0 and result["time/noop_s"] >= 0
    history = attempt.tracker.client.get_metric_history(attempt.tracker.run_id, "noop/round")
    assert [(m.step, m.value) for m in history] == [(2, 2.0)]
    assert attempt.state.stage == "noop" and attempt.state.round == 2


def test_a_registered_step_runs_as_a_prefect_task_run_of_its_name(prefect_api, attempt, noop):
    from prefect import flow, get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from rftflow.flows.campaign import _call

    key, calls = noop

    @flow(name="step-table")
    def one_step():
        from prefect import runtime

        return str(runtime.flow_run.id), _call(attempt, Planned(key, 3))

    flow_run_id, result = one_step()
    assert calls == [(attempt, 3)] and result["noop/round"] == 3.0
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    assert [(r.name, r.state.type.value) for r in runs] == [("noop[r=3]", "COMPLETED")]
    with pytest.raises(ValueError, match="'explore' is a built-in step"):
        unregister_step(STEPS["explore"].step)
    with pytest.raises(ValueError, match="'noop' is in the step table already"):
        register_step("noop", lambda run, r: {}, "again")
