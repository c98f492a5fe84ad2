from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="sync", task_run_name="sync[r={round_no}]", cache_policy=NO_CACHE)
def sync(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Push the trainer's new weights to the explorer and bump the weight version."""
    return tracked("sync", round_no, tracker, lambda: campaign.sync(round_no))
