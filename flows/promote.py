"""The ``promote_model`` flow: challenger vs ``champion`` on the campaign's held-out tasks; the
alias moves only on a clear, significant win (see ``components.promotion``)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State

from rftflow.components.campaign.bench import BenchModelError
from rftflow.components.config import ConfigError
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.promotion import decision_dict, promote


def _promote_name() -> str:
    from prefect import runtime

    parameters = runtime.task_run.parameters
    return f"promote[{parameters['checked'].cfg.tracking.registered_model} v{parameters.get('version') or 'newest'}]"


@task(name="promote", task_run_name=_promote_name, cache_policy=NO_CACHE)
def promote_task(checked, version: str | None) -> dict[str, Any] | State:
    """Evaluate both versions, decide, tag, move the alias."""
    try:
        decision = promote(checked, version)
    except BenchModelError as e:
        return Failed(message=str(e), data=e)
    return {**decision_dict(decision), "line": decision.line()}


def _flow_run_name() -> str:
    from prefect import runtime

    params = runtime.flow_run.parameters
    return f"promote-{params.get('version') or 'newest'}-{datetime.now(timezone.utc):%Y-%m-%d}"


@flow(name="promote_model", flow_run_name=_flow_run_name)
def promote_model(config: dict[str, Any] | str, run_dir: str | None = None, overrides: list[str] | None = None,
                  version: str | None = None) -> dict[str, Any] | State:
    """Promote version ``version`` (default: the newest) of the campaign's registered model to
    ``champion`` if it beats the current one; returns the decision (``line``: it in one line).
    ``config``, ``run_dir`` and ``overrides`` name the campaign as ``rft_campaign`` does (its
    tracking URI, registered model, held-out taskset and ``promotion.*`` keys)."""
    try:
        checked = preflight(config, run_dir, overrides or [])
    except ConfigError as e:
        return Failed(message=str(e), data=e)
    state = promote_task(checked, version, return_state=True)
    return state.result() if state.is_completed() else Failed(message=state.message)
