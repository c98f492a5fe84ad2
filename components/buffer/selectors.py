"""Task selectors: which training tasks the explorer gets each round.

Every selector is deterministic in (seed, round, batch) and, for ``curriculum``, the measured pass
rates, so a re-run round sees the same tasks. ``batch`` ≥ 1 are dynamic sampling's refills: a
seeded sample of k for every selector but ``curriculum`` (which takes the next-best tasks).

- ``sequential``: the taskset in its order, k per round, wrapping around.
- ``shuffle``: a fresh seeded shuffle per pass over the taskset, taken in order (every task once
  per pass).
- ``random``: an independent seeded sample of k per round (tasks may recur before a pass ends).
- ``curriculum``: the k distinct tasks whose estimated pass rate is closest to ``target``, ties
  in seeded random order: p̂ = (Σ reward + 2·m) / (n + 2), shrunk toward m, the mean reward over
  all attempts so far (0.5 before any), so an unseen task counts as an average one. When the
  policy solves most tasks, tasks it measured as hard are revisited before unseen ones. Pass
  rates come from ``PassRates``, fed by each round's verified rewards.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from rftflow.components.data.tasksets import Task

SELECTORS = ("sequential", "shuffle", "random", "curriculum")


class PassRates:
    """Reward sum and attempt count per task, and the rounds already counted (so a re-run round
    is not counted twice). Serialisable to a JSON-able dict (``state/pass_rates.json``)."""

    def __init__(self, state: Mapping[str, Any] | None = None):
        state = state or {}
        self.rounds: set[int] = set(state.get("rounds", []))
        self.tasks: dict[str, list[float]] = {k: list(v) for k, v in state.get("tasks", {}).items()}

    def add_round(self, round_no: int, results: Iterable[tuple[str, float]]) -> bool:
        """Count one round's (task_id, reward) results; False if that round was already counted."""
        if round_no in self.rounds:
            return False
        for task_id, reward in results:
            total = self.tasks.setdefault(task_id, [0.0, 0])
            total[0] += float(reward)
            total[1] += 1
        self.rounds.add(round_no)
        return True

    def mean(self) -> float:
        """m: mean reward over every counted attempt (0.5 before any)."""
        attempts = sum(n for _, n in self.tasks.values())
        return sum(t for t, _ in self.tasks.values()) / attempts if attempts else 0.5

    def estimate(self, task_id: str, prior: float | None = None) -> float:
        """p̂ = (Σ reward + 2·m) / (n + 2), m = ``prior`` or ``mean()``."""
        m = self.mean() if prior is None else prior
        total, n = self.tasks.get(task_id, (0.0, 0))
        return (total + 2.0 * m) / (n + 2.0)

    def to_state(self) -> dict[str, Any]:
        return {"rounds": sorted(self.rounds), "tasks": self.tasks}

    @classmethod
    def merged(cls, states: Iterable[Mapping[str, Any] | None]) -> PassRates:
        """Several campaigns' measurements summed per task (rounds are not carried over)."""
        out = cls()
        for state in states:
            for task_id, (total, n) in (state or {}).get("tasks", {}).items():
                mine = out.tasks.setdefault(task_id, [0.0, 0])
                mine[0] += total
                mine[1] += n
        return out


def measured_rewards(verified: pa.Table) -> list[tuple[str, float]]:
    """(task_id, reward before any reward shaping) of each scored row of a round's verified table:
    accepted rows and rows a pipeline dropped, not rows that broke the contract (their reward
    may be missing or out of range)."""
    reasons = verified.column("reason").to_pylist()
    rewards = verified.column("reward").to_pylist()
    per_fn = verified.column("rewards").to_pylist()
    return [(tid, dict(fns or []).get("unshaped", r)) for tid, r, fns, why in
            zip(verified.column("task_id").to_pylist(), rewards, per_fn, reasons)
            if why is None or why.startswith("pipeline:")]


def mixture_quotas(weights: dict[str, float], k: int) -> dict[str, int]:
    """``k`` tasks split by ``weights`` (largest remainder: each part gets ⌊k·w⌋, the rest go to the
    largest fractions, ties by order), the same every round, so each round keeps the weights."""
    total = sum(weights.values())
    exact = {name: k * w / total for name, w in weights.items()}
    quotas = {name: int(x) for name, x in exact.items()}
    for name in sorted(exact, key=lambda n: quotas[n] - exact[n])[:k - sum(quotas.values())]:
        quotas[name] += 1
    return quotas


def select_tasks(tasks: list[Task], round_no: int, k: int, seed: int, *, selector: str = "shuffle",
                 batch: int = 0, pass_rates: PassRates | None = None, target: float = 0.5) -> list[Task]:
    """The ``k`` tasks of round ``round_no`` (1-based), refill ``batch``, by ``selector``."""
    if selector == "curriculum":
        return _curriculum(tasks, round_no, k, seed, batch, pass_rates or PassRates(), target)
    if batch:
        return random.Random(f"{seed}:{round_no}:{batch}").sample(tasks, min(k, len(tasks)))
    start = (round_no - 1) * k
    if selector == "sequential":
        return [tasks[(start + i) % len(tasks)] for i in range(k)]
    if selector == "random":
        return random.Random(f"{seed}:{round_no}").sample(tasks, min(k, len(tasks)))
    if selector != "shuffle":
        raise ValueError(f"unknown task selector {selector!r}; known: {', '.join(SELECTORS)}")
    picked: list[Task] = []
    while len(picked) < k:
        epoch, offset = divmod(start + len(picked), len(tasks))
        order = _epoch_order(seed, epoch, len(tasks))
        picked.extend(tasks[i] for i in order[offset: offset + k - len(picked)])
    return picked


@functools.lru_cache(maxsize=4)
def _epoch_order(seed: int, epoch: int, n: int) -> tuple[int, ...]:
    """The ``shuffle`` selector's order of pass ``epoch`` over n tasks; kept, since a pass over a
    large taskset lasts many rounds and shuffling it each round would be wasted work."""
    order = list(range(n))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tuple(order)


def _curriculum(tasks: list[Task], round_no: int, k: int, seed: int, batch: int, rates: PassRates,
                target: float) -> list[Task]:
    distinct = list({t.task_id: t for t in tasks}.values())
    random.Random(f"{seed}:{round_no}").shuffle(distinct)  # the tie order
    m = rates.mean()
    ranked = sorted(distinct, key=lambda t: abs(rates.estimate(t.task_id, m) - target))  # stable
    return ranked[batch * k:(batch + 1) * k]
