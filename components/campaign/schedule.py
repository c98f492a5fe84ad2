"""The schedule of a campaign, defined once: its steps, a round's stages in order, and what is
left to do for each mode. The plain-Python runner (``CampaignRun.run``) and the Prefect flow
(``rft_campaign``) both walk ``phases``; each maps a ``Step`` to its own call (a method, a task).

A campaign (mode ``both``): ``prepare``, ``warm_start``, ``evaluate`` and ``checkpoint`` at round
0 when it starts fresh; each round's stages (``ROUND``: explore → verify → buffer → train → sync),
then ``evaluate`` and ``checkpoint`` when due; ``register`` and ``promote`` at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from rftflow.components.config import CampaignConfig, Mode


class Step(Enum):
    """A step of a campaign; its value names its Prefect task and its ``time/<step>_s`` metric."""

    PREPARE = "prepare"
    WARM_START = "warm_start"
    AWAIT_TASKSET = "await_taskset"
    EXPLORE = "explore"
    VERIFY = "verify"
    BUFFER = "buffer"
    TRAIN = "train"
    SYNC = "sync"
    EVALUATE = "evaluate"
    CHECKPOINT = "checkpoint"
    REGISTER = "register"
    PROMOTE = "promote"


ROUND = (Step.EXPLORE, Step.VERIFY, Step.BUFFER, Step.TRAIN, Step.SYNC)  # a round's stages, in order


@dataclass(frozen=True)
class Planned:
    """Step ``step`` of round ``round`` (0: before the rounds; the last round: after them)."""

    step: Step
    round: int


Lane = list[Planned]  # steps in order
Phase = list[Lane]  # lanes that may run at once (two in mode async, else one)


def round_stages(mode: str) -> tuple[Step, ...]:
    """The stages of a round that a process of ``mode`` runs: an explorer alone the first three,
    a trainer alone the last two, every other mode all five."""
    return {"explore": ROUND[:3], "train": ROUND[3:]}.get(mode, ROUND)


def eval_due(cfg: CampaignConfig, round_no: int) -> bool:
    return round_no % cfg.eval.every == 0 or round_no == cfg.rounds


def checkpoint_due(cfg: CampaignConfig, round_no: int) -> bool:
    return round_no % cfg.checkpoint.every == 0 or round_no == cfg.rounds


def sync_due(cfg: CampaignConfig, round_no: int) -> bool:
    """Weights move every ``sync.interval`` rounds, after the last, and before each evaluation and
    checkpoint (so both see the trainer's policy)."""
    return round_no % cfg.sync.interval == 0 or eval_due(cfg, round_no) or checkpoint_due(cfg, round_no)


def needed_version(cfg: CampaignConfig, round_no: int) -> int:
    """The oldest weights the explorer may explore ``round_no`` with, when it runs ``sync.offset``
    rounds ahead: those the trainer published after round p = ⌊(round − 1 − offset) / interval⌋ ·
    interval (the start weights while p ≤ 0: version 1 after a warm start, else 0). Rows of the round
    are then at most offset + interval − 1 versions behind the trainer that trains on them."""
    sync = cfg.sync
    published = (round_no - 1 - sync.offset) // sync.interval * sync.interval
    return (1 if cfg.trainer.warmup_steps else 0) + max(0, published)


def phases(cfg: CampaignConfig, *, first_round: int, fresh: bool) -> Iterator[Phase]:
    """What is left of the campaign, as phases (see ``Phase``), from round ``first_round`` on;
    ``fresh``: it has not started (prepare and the warm start come first).

    ``both``: as the module docstring says. ``train``: the same without explore/verify/buffer (its
    ``train`` waits for an explorer process to commit the round). ``explore``: wait for the
    trainer's taskset, then explore, verify and buffer each round. ``async``: as ``both``, but the
    explorer runs ``sync.offset`` rounds ahead: round t + offset is explored, verified and stored
    while round t trains (two lanes)."""
    one = lambda step, r: [[Planned(step, r)]]  # noqa: E731 — a phase of one step
    stages, mode, last = round_stages(cfg.mode), cfg.mode, cfg.rounds
    if mode == Mode.EXPLORE:
        if fresh:
            yield one(Step.AWAIT_TASKSET, 0)
        for r in range(first_round, last + 1):
            yield from (one(step, r) for step in stages)
        return
    if fresh:
        yield from (one(step, 0) for step in (Step.PREPARE, Step.WARM_START, Step.EVALUATE, Step.CHECKPOINT))
    ahead = cfg.sync.offset if mode == Mode.ASYNC else 0
    explore = (lambda r: [Planned(step, r) for step in ROUND[:3]] if first_round <= r <= last else [])
    for r in range(first_round, min(first_round + ahead, last + 1)):  # the explorer's head start
        yield [explore(r)]
    for r in range(first_round, last + 1):
        if ahead:
            yield [lane for lane in (explore(r + ahead), [Planned(Step.TRAIN, r)]) if lane]
            yield one(Step.SYNC, r)
        else:
            yield from (one(step, r) for step in stages)
        if eval_due(cfg, r):
            yield one(Step.EVALUATE, r)
        if checkpoint_due(cfg, r):
            yield one(Step.CHECKPOINT, r)
    yield one(Step.REGISTER, last)
    if cfg.promotion.after_campaign:
        yield one(Step.PROMOTE, last)
