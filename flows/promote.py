"""The ``promote_model`` flow: challenger vs ``champion`` on the campaign's held-out tasks; the
alias moves only on a clear, significant win (see ``components.promotion``). Its flow run is tagged
with the campaign (``campaign <label>``), the model and its registry, and once decided the versions
compared (``challenger v<k>``, ``champion v<j>`` or ``champion none``) and the verdict."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from prefect import flow, get_client, runtime
from prefect.states import Failed, State

from rftflow.components.config import ConfigError
from rftflow.components.campaign.preflight import preflight
from rftflow.components.tracking import registry_name
from rftflow.tasks.stages import promote_task


def _tagged(*tags: str) -> None:
    """Add ``tags`` to this flow run's (best effort: a view, never a failed promotion)."""
    import logging
    from uuid import UUID

    if not runtime.flow_run.id:
        return
    try:
        with get_client(sync_client=True) as client:
            flow_run_id = UUID(str(runtime.flow_run.id))
            known = client.read_flow_run(flow_run_id).tags
            client.update_flow_run(flow_run_id, tags=[*known, *(t for t in tags if t not in known)])
    except Exception as e:  # noqa: BLE001 — the API's errors, as a warning
        logging.getLogger("rftflow").warning("promote flow run not tagged: %s", e)


def _flow_run_name() -> str:
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
    model = checked.cfg.tracking.registered_model
    _tagged(f"campaign {checked.label}", f"model {model} ({registry_name(checked.tracking_uri)})")
    state = promote_task(checked, version, return_state=True)
    if not state.is_completed():
        return Failed(message=state.message)
    decision = state.result()
    _tagged(f"challenger v{decision['challenger']}",
            f"champion v{decision['champion']}" if decision["champion"] else "champion none",
            "promoted" if decision["promoted"] else "not promoted")
    return decision
