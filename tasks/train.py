from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker
from tasks.stage import tracked


@task(name="train", task_run_name="train[r={round_no}]", cache_policy=NO_CACHE)
def train(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Update the policy on the round's experiences with the configured algorithm."""
    return tracked("train", round_no, tracker, lambda: campaign.train(round_no))


@task(name="warm_start", task_run_name="warm_start[steps={steps}]", cache_policy=NO_CACHE)
def warm_start(campaign: Campaign, tracker: Tracker, steps: int, progress=None) -> dict[str, float]:
    """Expert-only SFT before the RL rounds (logged at step 0)."""
    return tracked("warm_start", 0, tracker, lambda: campaign.warm_start(progress))
