from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="explore", task_run_name="explore[r={round_no}]", cache_policy=NO_CACHE)
def explore(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Sample tasks and generate groups of responses; writes the round's rollouts to staging."""
    return tracked("explore", round_no, tracker, lambda: campaign.explore(round_no))
