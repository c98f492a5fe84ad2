from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="prepare", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def prepare(campaign: Campaign, tracker: Tracker) -> dict[str, float]:
    """Store the taskset splits and expert demonstrations (idempotent)."""
    return tracked("prepare", 0, tracker, campaign.prepare)
