from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="verify", task_run_name="verify[r={round_no}]", cache_policy=NO_CACHE)
def verify(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Score the round's rollouts and check the experience contract."""
    return tracked("verify", round_no, tracker, lambda: campaign.verify(round_no))
