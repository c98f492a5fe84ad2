"""Sample strategies applied to a round's experiences before training."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc


def drop_zero_variance_groups(table: pa.Table) -> tuple[pa.Table, int]:
    """DAPO dynamic sampling (arXiv:2503.14476): drop groups whose rewards are all equal — their
    group-relative advantages are all 0, so they only dilute the batch. Returns (kept rows, groups dropped)."""
    if table.num_rows == 0:
        return table, 0
    stats = table.group_by("group_id").aggregate([("reward", "min"), ("reward", "max")])
    flat = stats.filter(pc.equal(stats.column("reward_min"), stats.column("reward_max"))).column("group_id")
    keep = pc.invert(pc.is_in(table.column("group_id"), value_set=flat))
    return table.filter(keep), len(flat)


def drop_stale(table: pa.Table, current_version: int, max_staleness: int) -> tuple[pa.Table, int]:
    """Keep rows whose ``model_version`` ≥ current_version − max_staleness. Returns (kept, dropped)."""
    keep = pc.greater_equal(table.column("model_version"), current_version - max_staleness)
    kept = table.filter(keep)
    return kept, table.num_rows - kept.num_rows
