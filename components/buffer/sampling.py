"""Sampling: which stored experiences the trainer sees each round, and in what order.

Every sample strategy of the loop is here; the trainer receives a batch already mixed and ordered
(``TrainBatch``) and only steps through its micro-batches:

- explorer rows: ``fifo`` (on-policy: the oldest rows not yet trained on, whole groups; the cursor
  in ``state/fifo_cursor.json``) or ``replay`` (off-policy: whole groups by priority, each used at
  most ``reuse_limit`` times; use counts in ``state/replay_uses.json``). Both move their state only
  when the batch's ``commit`` runs, after the train step, so a crash re-serves rows, never loses them.
- filters on them: the staleness bound (``algorithm.max_staleness``), DAPO's zero-variance groups,
  DPO's (chosen, rejected) pairs.
- expert rows: demonstrations and well-rated human rows, ``buffer.expert_per_round`` of them, or
  ``buffer.expert_ratio`` of the round (Trinity-RFT's ``mix`` sample strategy).
- the order: ``trainer.epochs`` shuffled passes cut into micro-batches of ``trainer.micro_batch_size``
  rows; with an expert ratio every micro-batch holds the round's expert share; pairs never split.
- the warm start: micro-batches drawn from the expert rows.

Two seeded generators: ``pick_rng`` chooses rows (replay ties, expert rows), ``order_rng`` orders
them (shuffles, warm-start draws).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.buffer.experiences import ExperienceStore

from rftflow.components.buffer.layout import shard_order
from rftflow.components.data.experience import SCHEMA
from rftflow.components.data.groups import drop_zero_variance_groups

Commit = Callable[[], None]
Row = dict[str, Any]


# explorer rows -------------------------------------------------------------------------------
def take_fifo(store: ExperienceStore, max_rows: int | None = None, max_round: int | None = None
              ) -> tuple[pa.Table, Commit]:
    """The oldest explorer rows not yet consumed, in store order, whole groups, about ``max_rows``
    of them (a group is never split; None = all), from rounds up to ``max_round`` (None = all:
    a round redone after a resume never takes the rows of later rounds stored before the crash).
    The cursor (``state/fifo_cursor.json``: next shard and row) moves only when ``commit`` runs."""
    cursor = store.read_state("fifo_cursor", {"shard": "", "offset": 0})
    taken, n, after = [], 0, dict(cursor)
    for key in store.usual_shards(max_round):
        if shard_order(key) < shard_order(cursor["shard"]):
            continue
        table = store.shard(key)
        start = cursor["offset"] if key == cursor["shard"] else 0
        if start >= table.num_rows:
            continue
        end = table.num_rows if max_rows is None else _group_end(table, start + max_rows - n)
        taken.append(table.slice(start, end - start))
        n, after = n + end - start, {"shard": key, "offset": end}
        if max_rows is not None and n >= max_rows:
            break
    rows = pa.concat_tables(taken) if taken else SCHEMA.empty_table()
    return rows, lambda: store.write_state("fifo_cursor", after)


def take_replay(store: ExperienceStore, n_rows: int, current_version: int, rng: random.Random, *,
                decay: float = 1.0, reuse_limit: int = 2, max_staleness: int | None = None,
                max_round: int | None = None) -> tuple[pa.Table, Commit]:
    """Whole groups by priority = model_version − decay × uses (ties in ``rng`` order), until
    ``n_rows`` rows, from rounds up to ``max_round``; groups used ``reuse_limit`` times or older
    than ``max_staleness`` versions are out. Use counts (``state/replay_uses.json``) are bumped
    when ``commit`` runs."""
    shards = [store.shard(k) for k in store.usual_shards(max_round)]
    if not shards:
        return SCHEMA.empty_table(), lambda: None
    table = pa.concat_tables(shards)
    uses: dict[str, int] = store.read_state("replay_uses", {})
    stats = table.group_by("group_id").aggregate([("model_version", "max"), ("group_id", "count")])
    candidates = []
    for gid, version, size in zip(*(stats.column(c).to_pylist() for c in
                                    ("group_id", "model_version_max", "group_id_count"))):
        used = uses.get(gid, 0)
        if used >= reuse_limit or (max_staleness is not None and version < current_version - max_staleness):
            continue
        candidates.append((-(version - decay * used), rng.random(), gid, size))
    picked, rows = [], 0
    for _, _, gid, size in sorted(candidates):
        if rows >= n_rows:
            break
        picked.append(gid)
        rows += size
    chosen = table.filter(pc.is_in(table.column("group_id"), value_set=pa.array(picked, pa.string())))

    def commit() -> None:
        for gid in picked:
            uses[gid] = uses.get(gid, 0) + 1
        store.write_state("replay_uses", uses)

    return chosen, commit


def _group_end(table: pa.Table, end: int) -> int:
    """``end`` moved forward to the end of the group that row ``end − 1`` belongs to."""
    if end >= table.num_rows:
        return table.num_rows
    groups = table.column("group_id")
    last = groups[end - 1].as_py()
    while end < table.num_rows and groups[end].as_py() == last:
        end += 1
    return end


def drop_stale(table: pa.Table, current_version: int, max_staleness: int) -> tuple[pa.Table, int]:
    """Keep rows whose ``model_version`` ≥ current_version − max_staleness. Returns (kept, dropped).
    The staleness bound η of asynchronous RL (AReaL, Fu et al. 2025, arXiv:2505.24298)."""
    keep = pc.greater_equal(table.column("model_version"), current_version - max_staleness)
    kept = table.filter(keep)
    return kept, table.num_rows - kept.num_rows


def first_groups(table: pa.Table, n: int) -> pa.Table:
    """Rows of the first ``n`` groups, in order of first appearance (DAPO fills a batch to exactly n)."""
    ids = pc.unique(table.column("group_id"))
    return table.filter(pc.is_in(table.column("group_id"), value_set=ids[:n])) if len(ids) > n else table


def preference_pairs(table: pa.Table) -> tuple[pa.Table, int]:
    """Online-DPO pairs from each group: the i-th best response against the i-th worst, for
    i < ⌊G/2⌋ while the best one's reward is strictly higher. Rows come out as consecutive
    (chosen, rejected) pairs. Returns (paired rows, number of pairs). Best-vs-worst pairing of
    sampled responses as in online DPO (Guo et al. 2024, arXiv:2402.04792)."""
    order: list[int] = []
    rewards = table.column("reward").to_pylist()
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(table.column("group_id").to_pylist()):
        by_group.setdefault(g, []).append(i)
    for members in by_group.values():
        ranked = sorted(members, key=lambda i: -rewards[i])  # stable: ties keep sampling order
        for k in range(len(ranked) // 2):
            best, worst = ranked[k], ranked[-1 - k]
            if rewards[best] <= rewards[worst]:
                break
            order += [best, worst]
    return table.take(pa.array(order, pa.int64())), len(order) // 2


# expert rows ---------------------------------------------------------------------------------
def expert_pool(store: ExperienceStore, human_min_reward: float | None) -> pa.Table:
    """Demonstrations (gold answers, ingested ones), plus human-rated responses whose reward is at
    least ``human_min_reward`` (None: no human rows)."""
    expert = store.read_expert()
    if human_min_reward is None:
        return expert
    human = store.read_human()
    good = human.filter(pc.greater_equal(human.column("reward"), human_min_reward))
    return pa.concat_tables([expert, good]) if good.num_rows else expert


def sample_rows(table: pa.Table, n: int, rng: random.Random) -> pa.Table:
    """``n`` rows drawn without replacement, in table order (all of them if fewer)."""
    if n <= 0 or table.num_rows == 0:
        return SCHEMA.empty_table()
    return table.take(sorted(rng.sample(range(table.num_rows), min(n, table.num_rows))))


# order ---------------------------------------------------------------------------------------
def stratified_order(is_expert: list[bool], per_step: int, rng: random.Random) -> list[int]:
    """A shuffled order of row indices in which every run of ``per_step`` rows holds the batch's
    share of expert rows, ±1 (Trinity-RFT's ``mix`` sample strategy): run k ending at row e gets
    round(n_expert · e / n) expert rows in all so far, each kind shuffled on its own."""
    expert = [i for i, x in enumerate(is_expert) if x]
    usual = [i for i, x in enumerate(is_expert) if not x]
    rng.shuffle(expert)
    rng.shuffle(usual)
    order: list[int] = []
    taken = 0
    for end in range(per_step, len(is_expert) + per_step, per_step):
        end = min(end, len(is_expert))
        want = round(len(expert) * end / len(is_expert)) - taken
        order += expert[taken:taken + want] + usual[len(order) - taken:end - taken - want]
        taken += want
    return order


# the round's batch ---------------------------------------------------------------------------
@dataclass
class TrainBatch:
    """A round's training data, mixed and ordered: ``rows`` once each (advantages are computed over
    them), ``steps`` the micro-batches in training order (indices into ``rows``, every epoch), and
    ``commit`` to run once the rows are trained on."""

    rows: list[Row]
    steps: list[list[int]]
    commit: Commit = lambda: None  # noqa: E731
    metrics: dict[str, float] = field(default_factory=dict)


class Sampler:
    """Builds each round's ``TrainBatch`` and the warm start's micro-batches from a campaign's store.

    ``buffer``: a ``BufferConfig``; ``algorithm``: the resolved ``Algorithm``; ``micro_batch_size``
    and ``epochs`` from the trainer's config; ``round_rows`` the explorer rows a round produces
    (replay's default size); ``groups_per_round`` the groups DAPO fills a batch with.
    """

    def __init__(self, store: ExperienceStore, buffer, algorithm, *, micro_batch_size: int, epochs: int,
                 round_rows: int, groups_per_round: int, seed: int, stale_possible: bool = True):
        self.store, self.buffer, self.algorithm = store, buffer, algorithm
        self.stale_possible = stale_possible  # else rows are always fresh: their staleness, 0, is not reported
        self.micro_batch_size, self.epochs = micro_batch_size, epochs
        self.round_rows, self.groups_per_round = round_rows, groups_per_round
        self.pick_rng, self.order_rng = random.Random(seed), random.Random(seed)

    def round_batch(self, current_version: int, round_no: int | None = None) -> TrainBatch:
        """Explorer rows of rounds up to ``round_no`` (FIFO or replay, then the algorithm's filters)
        and expert rows, ordered."""
        algo, buf = self.algorithm, self.buffer
        parts, metrics, commit = [], {}, (lambda: None)
        if algo.uses_explorer:
            if buf.sampling == "replay":
                usual, commit = take_replay(self.store, buf.train_rows or self.round_rows, current_version,
                                            self.pick_rng, decay=buf.priority_decay, reuse_limit=buf.reuse_limit,
                                            max_staleness=algo.max_staleness, max_round=round_no)
            else:
                usual, commit = take_fifo(self.store, buf.train_rows, round_no)
                if algo.max_staleness is not None:
                    usual, stale = drop_stale(usual, current_version, algo.max_staleness)
                    metrics["sample/dropped_stale"] = float(stale)
            metrics["sample/usual_rows"] = float(usual.num_rows)
            if usual.num_rows and self.stale_possible:  # staleness: the trainer's version − the version that sampled the row
                staleness = pc.subtract(pa.scalar(current_version, pa.int64()), usual.column("model_version").cast(pa.int64()))
                metrics["sample/staleness_max"] = float(pc.max(staleness).as_py())
                metrics["sample/staleness_mean"] = float(pc.mean(staleness).as_py())
            if algo.dynamic_sampling:
                usual, dropped = drop_zero_variance_groups(usual)
                usual = first_groups(usual, self.groups_per_round)
                metrics["sample/dropped_groups"] = float(dropped)
            if algo.pairwise:
                usual, pairs = preference_pairs(usual)
                metrics["sample/pairs"] = float(pairs)
            parts.append(usual)
        if algo.uses_expert:
            n_expert = buf.expert_per_round
            if buf.expert_ratio is not None and algo.uses_explorer:  # a share of the batch, set by the explorer rows
                n_expert = round(sum(p.num_rows for p in parts) * buf.expert_ratio / (1 - buf.expert_ratio))
            parts.append(sample_rows(expert_pool(self.store, buf.human_min_reward), n_expert, self.pick_rng))
        table = pa.concat_tables(parts)
        sources = Counter(table.column("source").to_pylist())
        metrics["sample/expert_rows"] = sources["expert"]
        if algo.uses_expert and buf.human_min_reward is not None and self.store.read_human().num_rows:
            metrics["sample/human_rows"] = sources["human"]  # how much of the rated feedback a round draws
        rows = table.to_pylist()
        return TrainBatch(rows, self._steps(rows), commit, metrics)

    def _steps(self, rows: list[Row]) -> list[list[int]]:
        """``epochs`` passes over ``rows`` in micro-batches: shuffled; stratified by source with an
        expert ratio; whole (chosen, rejected) pairs for a pairwise loss."""
        if not rows:
            return []
        unit = 2 if self.algorithm.pairwise else 1
        per_step = max(unit, self.micro_batch_size // unit * unit)
        stratify = self.buffer.expert_ratio is not None and not self.algorithm.pairwise
        is_expert = [r["source"] != "explorer" for r in rows]
        steps = []
        for _ in range(self.epochs):
            if stratify:
                order = stratified_order(is_expert, per_step, self.order_rng)
            else:
                units = list(range(0, len(rows), unit))
                self.order_rng.shuffle(units)
                order = [i + k for i in units for k in range(unit)]
            steps += [order[s:s + per_step] for s in range(0, len(order), per_step)]
        return steps

    def warm_start_steps(self, steps: int) -> list[list[Row]]:
        """``steps`` micro-batches of expert rows, each drawn without replacement from all of them."""
        pool = expert_pool(self.store, None).to_pylist()
        return [self.order_rng.sample(pool, min(self.micro_batch_size, len(pool))) for _ in range(steps)]
