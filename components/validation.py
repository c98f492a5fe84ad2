"""The experience contract, checked with great-expectations; rows that break it are quarantined.

Every row is either accepted or quarantined with a ``reason`` naming the failed expectation(s):
rows in = accepted + quarantined, always.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from functools import cache

import pyarrow as pa

from components.experience import SOURCES

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# GX logs an INFO line per ephemeral context ("Created temporary directory ... docs site").
logging.getLogger("great_expectations.data_context").setLevel(logging.WARNING)


@dataclass(frozen=True)
class ContractBounds:
    reward_min: float = 0.0
    reward_max: float = 1.0
    max_model_version: int = 2**62


@dataclass
class Verdict:
    accepted: pa.Table
    quarantined: pa.Table  # the rejected rows plus a ``reason`` column

    @property
    def counts(self) -> dict[str, int]:
        return {"rows": self.accepted.num_rows + self.quarantined.num_rows,
                "accepted": self.accepted.num_rows, "quarantined": self.quarantined.num_rows}


@cache
def _batch_definition():
    """One ephemeral GX context per process, progress bars off, with an in-memory pandas asset."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    asset = context.data_sources.add_pandas("rftflow").add_dataframe_asset("experiences")
    return asset.add_batch_definition_whole_dataframe("batch")


def experience_suite(bounds: ContractBounds):
    """The experience contract as a GX suite (over the derived columns of ``_frame``)."""
    import great_expectations as gx

    E = gx.expectations
    suite = gx.ExpectationSuite(name="experience_contract")
    for column in ("experience_id", "task_id", "group_id", "prompt", "response"):
        suite.add_expectation(E.ExpectColumnValuesToNotBeNull(column=column))
    suite.add_expectation(E.ExpectColumnValuesToBeInSet(column="source", value_set=list(SOURCES)))
    suite.add_expectation(E.ExpectColumnValuesToBeInSet(column="reward_is_finite", value_set=[True]))
    suite.add_expectation(E.ExpectColumnValuesToBeBetween(
        column="reward", min_value=bounds.reward_min, max_value=bounds.reward_max))
    suite.add_expectation(E.ExpectColumnValuesToBeInSet(column="token_lengths_consistent", value_set=[True]))
    suite.add_expectation(E.ExpectColumnValuesToBeBetween(
        column="model_version", min_value=0, max_value=bounds.max_model_version))
    return suite


def _frame(table: pa.Table):
    """The columns the contract reads, plus derived checks GX has no built-in for."""
    df = table.select(["experience_id", "task_id", "group_id", "source", "prompt", "response", "reward",
                       "model_version"]).to_pandas()
    df["reward_is_finite"] = [r is not None and math.isfinite(r) for r in table.column("reward").to_pylist()]
    ids, logprobs, mask = (table.column(c).to_pylist() for c in ("response_ids", "response_logprobs", "response_mask"))
    df["token_lengths_consistent"] = [
        bool(i) and (lp is None or len(lp) == len(i)) and (m is None or len(m) == len(i))
        for i, lp, m in zip(ids, logprobs, mask)
    ]
    return df


def check_experiences(table: pa.Table, bounds: ContractBounds = ContractBounds()) -> Verdict:
    """Validate ``table`` (Experience schema) against the contract; split accepted / quarantined."""
    if table.num_rows == 0:
        return Verdict(table, table.append_column("reason", pa.array([], pa.string())))
    result = _batch_definition().get_batch(batch_parameters={"dataframe": _frame(table)}).validate(
        experience_suite(bounds), result_format={"result_format": "COMPLETE"}
    )
    reasons: dict[int, list[str]] = {}
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        label = f"{cfg.type}({cfg.kwargs.get('column')})"
        for index in r.result.get("unexpected_index_list") or []:
            reasons.setdefault(int(index), []).append(label)
    bad = sorted(reasons)
    good = [i for i in range(table.num_rows) if i not in reasons]
    quarantined = table.take(pa.array(bad, pa.int64())).append_column("reason", pa.array(["; ".join(reasons[i]) for i in bad], pa.string()))
    return Verdict(table.take(pa.array(good, pa.int64())), quarantined)
