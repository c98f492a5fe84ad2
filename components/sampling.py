"""Sample strategies applied to a round's experiences before training."""

from __future__ import annotations

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
    (chosen, rejected) pairs. Returns (paired rows, number of pairs)."""
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
    """Keep rows whose ``model_version`` ≥ current_version − max_staleness. Returns (kept, dropped)."""
    keep = pc.greater_equal(table.column("model_version"), current_version - max_staleness)
    kept = table.filter(keep)
    return kept, table.num_rows - kept.num_rows
