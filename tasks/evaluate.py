from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="evaluate", task_run_name="evaluate[r={round_no}]", cache_policy=NO_CACHE)
def evaluate(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Greedy accuracy on the held-out split, logged at step = round (0 = before the RL rounds)."""
    return tracked("evaluate", round_no, tracker, campaign.evaluate)
