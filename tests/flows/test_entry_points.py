"""The validation gate at the flow's entry points: ``rft_campaign`` called with a mapping or a YAML
path, and a run of a deployment of it (served by a Prefect runner, run in its own process) —
bad input ends the flow run Failed with the culprit in its one-line message, nothing written."""

import asyncio
import signal

import pytest

from rftflow.components.config import ConfigError


@pytest.mark.parametrize("as_mapping", [True, False], ids=["mapping", "yaml path"])
def test_the_flow_called_with_bad_input_fails_before_any_work(prefect_api, tmp_path, default_config, as_mapping):
    from rftflow.components.config import load_config
    from rftflow.components.campaign.preflight import campaign_label
    from rftflow.flows.campaign import rft_campaign

    config = load_config(default_config).model_dump(mode="json") if as_mapping else str(default_config)
    overrides = ["storage.url=ftp://x/y"]
    state = rft_campaign(config, str(tmp_path / "run"), overrides=overrides, return_state=True)
    assert state.is_failed() and state.message == ("storage.url 'ftp://x/y': unsupported scheme 'ftp'; "
                                                   "supported: file://, s3://")
    with pytest.raises(ConfigError, match="unknown config key 'trainer.lrr'"):  # a direct call raises it
        rft_campaign(config, str(tmp_path / "run"), overrides=["trainer.lrr=1"])
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_deployment_run_passes_the_same_gate(prefect_api, tmp_path, default_config):
    from prefect import get_client
    from prefect.runner import Runner

    from rftflow.flows.campaign import rft_campaign

    runner = Runner(name="gate-test")
    deployment = runner.add_flow(rft_campaign, name="gate-test", parameters={"config": str(default_config)})

    async def run_deployment() -> tuple[str, str]:
        async with get_client() as client:
            run = await client.create_flow_run_from_deployment(deployment, parameters={
                "config": str(default_config), "run_dir": str(tmp_path / "run"), "overrides": ["model.path=/nonexistent"]})
        await runner.start(run_once=True)  # one poll: the run goes to a new process, as with a worker
        async with get_client() as client:
            state = (await client.read_flow_run(run.id)).state
        return state.type.value, state.message

    sigterm = signal.getsignal(signal.SIGTERM)  # the runner takes SIGTERM over in the main thread
    try:
        kind, message = asyncio.run(run_deployment())
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert kind == "FAILED" and message.startswith("model.path '/nonexistent': no such directory")
    assert not (tmp_path / "run").exists()


def test_date_templates_give_each_scheduled_run_its_own_name_and_run_dir(prefect_api, tmp_path, default_config):
    from datetime import datetime, timezone

    from prefect import get_client

    from rftflow.components.campaign.preflight import campaign_label
    from rftflow.flows.campaign import rft_campaign

    today = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    state = rft_campaign(str(default_config), str(tmp_path / "{date}"), return_state=True,
                         overrides=["name=nightly-{date}", f"taskset.source={tmp_path}/tasks-{{date}}.jsonl"])
    assert state.is_failed() and state.message.startswith(f"taskset file not found: {tmp_path}/tasks-{today}.jsonl")
    with get_client(sync_client=True) as client:
        name = client.read_flow_run(state.state_details.flow_run_id).name
    # the day, and the run dir's hash (two campaigns of one name in two run dirs get two names)
    assert name == campaign_label(f"nightly-{today}", tmp_path / today)
