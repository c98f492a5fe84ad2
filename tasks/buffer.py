from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="buffer", task_run_name="buffer[r={round_no}]", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def buffer(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Commit verified experiences to the buffer and rejected ones to quarantine (idempotent)."""
    return tracked("buffer", round_no, tracker, lambda: campaign.store_round(round_no))
