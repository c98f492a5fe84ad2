"""The step table: each step of a campaign defined once, as one row — the function that runs it,
whether the attempt records it, whether an orchestrator may retry it, and one line on what it does.

``CampaignRun.do`` looks a step up here (the plain-Python runner); ``tasks/stages.py`` makes the
Prefect task of each row (its name, the ``<step>[r=N]`` task-run name, retries when idempotent, no
cache). A row's ``work(run, round_no)`` gets the attempt (``CampaignRun``: ``run.campaign`` holds the
stages) and the round, and returns the step's metrics. ``register_step`` adds a row at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rftflow.components.campaign.schedule import Step


@dataclass(frozen=True)
class Custom:
    """A step added at run time (``register_step``); like ``Step``, its ``value`` is its name."""

    value: str


StepKey = Step | Custom
Work = Callable[[Any, int], dict[str, Any]]  # (the attempt, round) → metrics


@dataclass(frozen=True)
class StepSpec:
    """A row of the table. ``tracked``: ``CampaignRun._tracked`` times the work, logs its numeric
    metrics to MLflow at step = round and records the step in the state (else the work records
    itself). ``idempotent``: redoing it is harmless, so an orchestrator retries it (IO only)."""

    step: StepKey
    work: Work
    summary: str
    tracked: bool = True
    idempotent: bool = False

    @property
    def name(self) -> str:
        return self.step.value


def _row(step: Step, work: Work, summary: str, **options: Any) -> tuple[str, StepSpec]:
    return step.value, StepSpec(step, work, summary, **options)


STEPS: dict[str, StepSpec] = dict((
    _row(Step.PREPARE, lambda run, r: run.campaign.prepare(),
         "Store the taskset splits and expert demonstrations (idempotent).", idempotent=True),
    _row(Step.WARM_START, lambda run, r: run.campaign.warm_start(run.on_warmup_step),
         "Expert-only SFT before the RL rounds; the start weights to the explorer."),
    _row(Step.AWAIT_TASKSET, lambda run, r: run.campaign.await_taskset(),
         "An explorer process: wait for the trainer's taskset."),
    _row(Step.EXPLORE, lambda run, r: run.campaign.explore(r),
         "Sample tasks and generate groups of responses → staging."),
    _row(Step.VERIFY, lambda run, r: run.campaign.verify(r),
         "Score the round's rollouts and check the experience contract."),
    _row(Step.BUFFER, lambda run, r: run.campaign.buffer(r),
         "Commit verified rows to the buffer, rejected ones to quarantine (idempotent).", idempotent=True),
    _row(Step.TRAIN, lambda run, r: run.campaign.train(r),
         "Update the policy on the round's batch (a trainer process first waits for the explorer's round)."),
    _row(Step.SYNC, lambda run, r: run.campaign.sync(r),
         "Publish the trainer's weights to the explorer, when due (sync.interval)."),
    _row(Step.EVALUATE, lambda run, r: run.evaluate(r),
         "Greedy accuracy on the held-out split (round 0: before the rounds)."),
    _row(Step.CHECKPOINT, lambda run, r: run.checkpoint(r),
         "Weights, optimizer, RNG, buffer state to the store; all but the optimizer to MLflow.", tracked=False),
    _row(Step.REGISTER, lambda run, r: run.register(r),
         "Log the final model and register it as a model version (once).", tracked=False, idempotent=True),
    _row(Step.PROMOTE, lambda run, r: run.promote(r),
         "The registered version against @champion: the alias moves on a clear win."),
))


def spec_of(step: StepKey) -> StepSpec:
    """The row of ``step``; ``KeyError`` naming the known steps for one never registered."""
    try:
        return STEPS[step.value]
    except KeyError:
        raise KeyError(f"no step {step.value!r} in the step table (known: {', '.join(STEPS)})") from None


def register_step(name: str, work: Work, summary: str, *, tracked: bool = True, idempotent: bool = False) -> Custom:
    """Add step ``name`` (``work(run, round_no) -> metrics``) to the table; its key, for
    ``Planned(key, round)``. A name already in the table is refused."""
    if name in STEPS:
        raise ValueError(f"step {name!r} is in the step table already")
    key = Custom(name)
    STEPS[name] = StepSpec(key, work, summary, tracked=tracked, idempotent=idempotent)
    return key


def unregister_step(key: Custom) -> None:
    """Remove a step ``register_step`` added (the built-in steps stay)."""
    if not isinstance(key, Custom):
        raise ValueError(f"{key.value!r} is a built-in step")
    STEPS.pop(key.value, None)
