from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.tracking import Tracker


@task(name="register", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def register(campaign: Campaign, tracker: Tracker, tags: dict[str, str]) -> dict[str, str]:
    """Save the final model, log it to the MLflow run and register it as a new model version."""
    model_dir = campaign.save_model(campaign.run_dir / "model")
    source = tracker.log_artifacts(model_dir, "model")
    name = campaign.cfg.tracking.registered_model
    version = tracker.register(name, source, tags)
    return {"model_name": name, "model_version": version, "model_uri": f"models:/{name}/{version}"}
