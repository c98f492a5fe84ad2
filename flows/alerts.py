"""Alerts: Prefect automations that call a webhook when a campaign fails, crashes or stalls.

``rftflow alerts WEBHOOK_URL`` (against the Prefect server ``PREFECT_API_URL`` names, or the one
``rftflow up`` runs) saves a ``Webhook`` block and two automations, replacing earlier ones of the
same names:

- ``rftflow: campaign failed or crashed``: a flow run of ``rft_campaign`` enters Failed or
  Crashed (a contract past its threshold, a store down past its budget, a killed process seen by
  the next attempt, a second Ctrl-C);
- ``rftflow: campaign stalled``: a campaign reported a round (the ``rftflow.campaign.round`` event
  ``flows.monitor`` emits with its progress) and then neither another round nor its end
  (``rftflow.campaign.ended``) within ``stall_minutes``.

Each posts a small JSON body naming the campaign and what happened. Automations are evaluated by
the Prefect server's services (``prefect server start`` runs them; ``rftflow up`` starts one).
"""

from __future__ import annotations

from datetime import timedelta

ROUND_EVENT, ENDED_EVENT = "rftflow.campaign.round", "rftflow.campaign.ended"
BLOCK_NAME = "rftflow-alerts"
FAILED, STALLED = "rftflow: campaign failed or crashed", "rftflow: campaign stalled"
PAYLOAD = ('{"alert": "%s", "event": "{{ event.event }}", "resource": "{{ event.resource.id }}", '
           '"name": "{{ event.resource.get(\'prefect.resource.name\', \'\') }}", '
           '"occurred": "{{ event.occurred }}"}')


def create_alerts(webhook_url: str, stall_minutes: float = 30.0) -> dict[str, str]:
    """Save the webhook block and both automations (see the module docstring); {name: automation id}."""
    from prefect import get_client
    from prefect.blocks.webhook import Webhook
    from prefect.events.actions import CallWebhook
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    block_id = Webhook(url=webhook_url, method="POST", headers={"Content-Type": "application/json"}).save(
        BLOCK_NAME, overwrite=True)
    automations = [
        AutomationCore(
            name=FAILED, description="A flow run of rft_campaign entered Failed or Crashed.",
            trigger=EventTrigger(expect={"prefect.flow-run.Failed", "prefect.flow-run.Crashed"},
                                 match_related={"prefect.resource.role": "flow", "prefect.resource.name": "rft_campaign"},
                                 posture=Posture.Reactive, threshold=1, within=timedelta(0)),
            actions=[CallWebhook(block_document_id=block_id, payload=PAYLOAD % "failed or crashed")]),
        AutomationCore(
            name=STALLED, description=f"No round finished for {stall_minutes:g} minutes in a running campaign.",
            trigger=EventTrigger(after={ROUND_EVENT}, expect={ROUND_EVENT, ENDED_EVENT},
                                 for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
                                 within=timedelta(minutes=stall_minutes)),
            actions=[CallWebhook(block_document_id=block_id, payload=PAYLOAD % "stalled")]),
    ]
    made = {}
    with get_client(sync_client=True) as client:
        for automation in automations:
            for old in client.read_automations_by_name(automation.name):
                client.delete_automation(old.id)
            made[automation.name] = str(client.create_automation(automation))
    return made


def campaign_resource(label: str) -> dict[str, str]:
    """The event resource of a campaign (one per run dir, see ``Preflight.label``)."""
    return {"prefect.resource.id": f"rftflow.campaign.{label}", "prefect.resource.name": label}
