"""Operations on groups of experiences (a task's responses, one ``group_id``)."""

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
