"""Sample strategies applied to a round's experiences before training."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.compute as pc


def _flat_groups(table: pa.Table) -> pa.Array:
    """Ids of the groups whose rewards are all equal."""
    stats = table.group_by("group_id").aggregate([("reward", "min"), ("reward", "max")])
    return stats.filter(pc.equal(stats.column("reward_min"), stats.column("reward_max"))).column("group_id")


def drop_zero_variance_groups(table: pa.Table) -> tuple[pa.Table, int]:
    """DAPO dynamic sampling (arXiv:2503.14476): drop groups whose rewards are all equal — their
    group-relative advantages are all 0, so they only dilute the batch. Returns (kept rows, groups dropped)."""
    if table.num_rows == 0:
        return table, 0
    flat = _flat_groups(table)
    keep = pc.invert(pc.is_in(table.column("group_id"), value_set=flat))
    return table.filter(keep), len(flat)


def informative_groups(table: pa.Table) -> int:
    """How many groups have unequal rewards (the ones dynamic sampling keeps)."""
    if table.num_rows == 0:
        return 0
    return pc.count_distinct(table.column("group_id")).as_py() - len(_flat_groups(table))


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


def drop_stale(table: pa.Table, current_version: int, max_staleness: int) -> tuple[pa.Table, int]:
    """Keep rows whose ``model_version`` ≥ current_version − max_staleness. Returns (kept, dropped).
    The staleness bound η of asynchronous RL (AReaL, Fu et al. 2025, arXiv:2505.24298)."""
    keep = pc.greater_equal(table.column("model_version"), current_version - max_staleness)
    kept = table.filter(keep)
    return kept, table.num_rows - kept.num_rows


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
