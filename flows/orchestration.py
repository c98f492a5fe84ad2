"""How the flow runs a campaign's steps as Prefect task runs: one per step, or one per round (or k
rounds) — the config's ``orchestration`` section, and the choice ``task_runs: auto`` makes.

A task run costs Prefect milliseconds (an API call each way, its events, its log lines): nothing
beside rounds of seconds, a large share of rounds of tens of milliseconds. ``auto`` runs this
attempt's first round a task run per stage, measures Prefect's share of its time, and keeps a task
run per stage while that share stays within ``task_runs_max_share``, else groups rounds.
Components know nothing of this: they run steps; this module decides how the flow wraps them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rftflow.components.campaign.schedule import Phase, Planned, Step
from rftflow.components.config import MOVED_KEYS, CampaignConfig, ConfigError, Mode

COMMIT_SECONDS = 5.0  # a task run of rounds spans at most this much of them: the UI's cadence

# the keys of this section before 0.2, at the top of the config
MOVED_KEYS.update({"task_runs": "orchestration.task_runs", "rounds_per_task_run": "orchestration.rounds_per_task_run",
                   "task_runs_max_share": "orchestration.task_runs_max_share"})


class OrchestrationConfig(BaseModel):
    """How the Prefect flow runs the steps as task runs (`rftflow.flows.orchestration`): how the
    campaign is run, not what it computes, so a change resumes the same campaign."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_runs: Literal["auto", "stage", "round"] = Field(
        "auto", description="Prefect task runs of a round: `stage`, one per stage (`explore[r=3]`, `verify[r=3]`, "
        "…: each timed, logged and failed on its own in the Prefect UI); `round`, one per round (`round[r=3]`) "
        "running its stages in order, each still timed and logged to MLflow (`time/<stage>_s`) and named in the "
        "task run's log line (no task retry for `buffer`: a round is not idempotent); `auto`, one per stage for "
        "this attempt's first round, then one per stage while Prefect's share of that round's time stays within "
        "`task_runs_max_share`, else one per k rounds (`round[r=2-5]`, a log line per round; k the fewest that "
        "bring a task run's cost under a quarter of `task_runs_max_share`, at most 5 s of rounds; an evaluation "
        "or checkpoint ends one) (mode `async`: always one per stage).",
    )
    rounds_per_task_run: int | None = Field(
        None, ge=1, description="Rounds one task run spans when task runs are per round (`task_runs: round`, or "
        "`auto`'s choice); consecutive rounds only (an evaluation or checkpoint ends one early). null: 1 for "
        "`round`, for `auto` chosen from the measured share.",
    )
    task_runs_max_share: float = Field(
        0.05, ge=0.0, le=1.0, description="`task_runs: auto`: the largest share of the first round's time "
        "(wall time of its task runs) that Prefect's task runs may take and keep one per stage.",
    )


def orchestration_of(cfg: CampaignConfig) -> OrchestrationConfig:
    """``cfg``'s ``orchestration`` section, checked: ``ConfigError`` in one line naming the key."""
    try:
        settings = OrchestrationConfig.model_validate(cfg.orchestration)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(["orchestration", *(str(p) for p in first["loc"])])
        message = "unknown config key" if first["type"] == "extra_forbidden" else first["msg"]
        raise ConfigError(f"config key {key!r}: {message}" + ("" if first["type"] == "extra_forbidden"
                                                              else f" (got {first.get('input')!r})")) from None
    if settings.task_runs == "round" and cfg.mode == Mode.ASYNC:
        raise ConfigError("orchestration.task_runs 'round' runs a round's stages in turn; mode 'async' overlaps the "
                          "explorer and the trainer: use task_runs 'stage' with it")
    if settings.rounds_per_task_run is not None and (settings.task_runs == "stage" or cfg.mode == Mode.ASYNC):
        raise ConfigError("orchestration.rounds_per_task_run groups rounds into task runs: it needs task_runs 'round' "
                          "or 'auto' (not 'stage', nor mode 'async', which runs a task run per stage)")
    return settings


def task_run_span(granularity: str | None, rounds_per_task_run: int) -> str:
    """What one task run of a round covers, in words: ``stage``, ``round`` or ``3 rounds`` (from a
    ``TaskRunPlan`` or a summary's ``task_runs`` and ``rounds_per_task_run``)."""
    if granularity != "round":
        return "stage"
    return "round" if rounds_per_task_run == 1 else f"{rounds_per_task_run} rounds"


@dataclass(frozen=True)
class Rounds:
    """Rounds ``first`` to ``last``, each its stages in order, as one task run."""

    first: int
    last: int


class TaskRunPlan:
    """How this attempt's steps become task runs: ``granularity`` ``stage`` or ``round`` (None while
    ``auto`` still measures the first round), ``rounds_per_task_run`` once per round."""

    def __init__(self, settings: OrchestrationConfig, mode: str, stages: tuple[Step, ...]):
        self.settings, self.stages = settings, stages
        self.granularity: str | None = {"auto": "stage" if mode == Mode.ASYNC else None}.get(settings.task_runs,
                                                                                         settings.task_runs)
        self.rounds_per_task_run = settings.rounds_per_task_run or 1
        self._first_round = [0.0, 0.0]  # auto: the first round's task runs' wall seconds, and the steps' own

    @property
    def per_round(self) -> bool:
        return self.granularity == "round"

    def span(self) -> str:
        return task_run_span(self.granularity, self.rounds_per_task_run)

    def measured(self, planned: Planned, wall: float, own: float) -> tuple[str, dict[str, float]] | None:
        """``task_runs: auto``: count a stage's task run of the first round (``wall`` seconds, its
        step's ``own`` seconds with its MLflow and state writes inside). After the round's last
        stage, choose for the rounds after it: one task run per stage while Prefect's share of the
        round, (Σ wall − Σ own) / Σ wall, is at most ``task_runs_max_share`` (s), else one per k
        rounds (``rounds_per_task_run`` when set): the fewest for which one task run's cost c (the
        round's Prefect time / its stages) is at most s/4 of theirs, c / (c + k · own) ≤ s/4, and
        at most ``COMMIT_SECONDS`` of rounds. A quarter: the first round is slower than later ones
        (warm-up), and a task run also slows the work after it (cold caches, Prefect's threads),
        so the measured share understates the cost. Returns the choice in one line and its
        metrics when made."""
        if self.granularity is not None or planned.step not in self.stages:
            return None
        self._first_round[0] += wall
        self._first_round[1] += own
        if planned.step != self.stages[-1]:
            return None
        wall, own = self._first_round
        share = (wall - own) / wall if wall > 0 else 0.0
        max_share = self.settings.task_runs_max_share
        self.granularity = "round" if share > max_share else "stage"
        if self.per_round and self.settings.rounds_per_task_run is None:
            cost, target = (wall - own) / len(self.stages), max_share / 4
            fit = max(1, int(COMMIT_SECONDS / own)) if own > 0 else 1
            needed = math.ceil(cost * (1 - target) / (target * own)) if target > 0 and own > 0 else fit
            self.rounds_per_task_run = max(1, min(fit, needed))
        then = f"one task run per {self.span()}"
        if self.per_round:
            then += " from here on (orchestration.task_runs: stage keeps one per stage)"
        line = (f"task_runs auto: Prefect's task runs took {share:.0%} of round {planned.round} "
                f"({(wall - own) * 1e3:.0f} ms of {wall * 1e3:.0f} ms; task_runs_max_share {max_share:.0%}): {then}")
        return line, {"time/prefect_share": share,
                      "time/rounds_per_task_run": self.rounds_per_task_run}

    def cut(self, phases: list[Phase]) -> list[list[list[Planned | Rounds]]]:
        """``phases`` as task runs will run them: per round, up to ``rounds_per_task_run``
        consecutive rounds (none with a step between them: an evaluation or a checkpoint ends a
        group) as one ``Rounds``; else as they are."""
        if not self.per_round:
            return phases
        cut: list = []
        for phase in phases:
            (planned,), = phase  # per round: single-lane phases of one step
            if planned.step not in self.stages:
                cut.append([[planned]])
                continue
            group = cut[-1][0][0] if cut and isinstance(cut[-1][0][0], Rounds) else None
            if group is not None and group.last == planned.round:
                continue  # a later stage of a round already in the group
            if group is not None and group.last == planned.round - 1 and \
                    group.last - group.first + 1 < self.rounds_per_task_run:
                cut[-1][0][0] = Rounds(group.first, planned.round)
                continue
            cut.append([[Rounds(planned.round, planned.round)]])
        return cut
