"""The campaign's stage tasks: one ``Campaign`` method each, timed and logged to MLflow at
step = round. Task runs are named by stage and round (``explore[r=3]``) for the Prefect UI;
``ROUND_TASKS`` maps each stage of ``components.campaign.ROUND`` to its task (the flow walks ``ROUND``).

They receive the ``Campaign`` (models inside), hence ``cache_policy=NO_CACHE``: Prefect must
never pickle or hash it. Retries only where the work is idempotent IO, and never after a data
contract failed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prefect import task
from prefect.cache_policies import NO_CACHE

from components.campaign import Campaign
from components.data.contracts import ContractError
from components.tracking import Tracker


def not_a_contract(_task, _task_run, state) -> bool:
    """Retry condition: retry a failed stage unless a data contract failed (bad data stays bad)."""
    try:
        state.result()
    except ContractError:
        return False
    except Exception:  # noqa: BLE001 — anything else may be transient (a store hiccup)
        return True
    return True


def tracked(name: str, step: int, tracker: Tracker, work: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run ``work``, add ``time/<name>_s``, log the metrics to MLflow at ``step``, return them."""
    start = time.perf_counter()
    metrics = {k: float(v) for k, v in work().items()}
    metrics[f"time/{name}_s"] = time.perf_counter() - start
    tracker.log_metrics(metrics, step=step)
    return metrics


@task(name="prepare", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1, retry_condition_fn=not_a_contract)
def prepare(campaign: Campaign, tracker: Tracker) -> dict[str, float]:
    """Store the taskset splits and expert demonstrations (idempotent)."""
    return tracked("prepare", 0, tracker, campaign.prepare)


@task(name="warm_start", task_run_name="warm_start[steps={steps}]", cache_policy=NO_CACHE)
def warm_start(campaign: Campaign, tracker: Tracker, steps: int, progress=None) -> dict[str, float]:
    """Expert-only SFT before the RL rounds (logged at step 0)."""
    return tracked("warm_start", 0, tracker, lambda: campaign.warm_start(progress))


@task(name="explore", task_run_name="explore[r={round_no}]", cache_policy=NO_CACHE)
def explore(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Sample tasks and generate groups of responses; writes the round's rollouts to staging."""
    return tracked("explore", round_no, tracker, lambda: campaign.explore(round_no))


@task(name="verify", task_run_name="verify[r={round_no}]", cache_policy=NO_CACHE)
def verify(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Score the round's rollouts and check the experience contract."""
    return tracked("verify", round_no, tracker, lambda: campaign.verify(round_no))


@task(name="buffer", task_run_name="buffer[r={round_no}]", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=1)
def buffer(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Commit verified experiences to the buffer and rejected ones to quarantine (idempotent)."""
    return tracked("buffer", round_no, tracker, lambda: campaign.buffer(round_no))


@task(name="train", task_run_name="train[r={round_no}]", cache_policy=NO_CACHE)
def train(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Update the policy on the round's experiences with the configured algorithm."""
    return tracked("train", round_no, tracker, lambda: campaign.train(round_no))


@task(name="sync", task_run_name="sync[r={round_no}]", cache_policy=NO_CACHE)
def sync(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Push the trainer's new weights to the explorer and bump the weight version."""
    return tracked("sync", round_no, tracker, lambda: campaign.sync(round_no))


@task(name="evaluate", task_run_name="evaluate[r={round_no}]", cache_policy=NO_CACHE)
def evaluate(campaign: Campaign, tracker: Tracker, round_no: int) -> dict[str, float]:
    """Greedy accuracy on the held-out split, logged at step = round (0 = before the RL rounds)."""
    return tracked("evaluate", round_no, tracker, campaign.evaluate)


ROUND_TASKS = {"explore": explore, "verify": verify, "buffer": buffer, "train": train, "sync": sync}  # keys: ROUND
