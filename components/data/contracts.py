"""Data contracts, checked with great-expectations; rows that break one are quarantined.

Every row is either accepted or quarantined with a ``reason`` naming the failed expectation(s):
rows in = accepted + quarantined, always. ``enforce`` fails a batch whose bad fraction is above
the configured threshold, naming its first bad rows.

Contracts (one GX suite each, over a frame of the table's columns and derived ones: text lengths,
token counts, and ``violations``: a bit per per-row rule GX has no expectation for, set when the
row breaks it). An experience suite is one expectation, ``expect_multicolumn_values_within_bounds``:
each measured column within its configured [low, high], ``violations`` within [0, 0]. GX's cost
is per expectation and per column whatever the row count, and this suite runs every round: one
expectation, and one column of rule bits rather than a column per rule. A quarantined row's
reason names each broken rule:

- ``explorer`` experiences: ids, campaign, prompt non-null and non-empty (text lengths are measured
  without surrounding whitespace, so "  " is empty); response non-null;
  source ``explorer``; round ≥ 0; reward finite and within bounds; 1 ≤ token lengths ≤ bounds;
  no null or negative token id, mask values 0 or 1, no non-finite log-prob; log-probs present and, like the mask,
  as long as the response; weight version in [0, current] (not from the future); every group
  has ``repeat_times`` distinct experiences; no experience id repeated (later copies are the bad
  ones); an episode's turns tile its response and its mask is 1 exactly on the model's turns
  (``turns_consistent``); its environment did not fail (``episode_completed``: the reason then
  starts ``episode failed: …``, the environment's error); its images (the ``images`` column) are
  within their bounds, match their sha256 and decode (``images_valid``, named with each bad image's
  hash prefix and what is wrong with it, ``data.image_checks``). A row that breaks a rule is
  quarantined alone: the rest of its group is kept.
- ``expert`` demonstrations and ``human`` feedback: the same, with source ``expert``/``human``,
  a non-empty response, log-probs optional and no group-size rule.
- ``tasks``: the row parsed (valid UTF-8, JSON, an object); question, answer and prompt
  non-null, non-empty strings within the length bound; the images its metadata holds pass the
  same image rules (``image_error`` null).
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass
from functools import cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.data.image_checks import ImageBounds, column_problems, task_images_problem

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
# GX logs an INFO line per ephemeral context ("Created temporary directory ... docs site").
logging.getLogger("great_expectations.data_context").setLevel(logging.WARNING)

KINDS = ("explorer", "expert", "human", "tasks")


class ContractError(ValueError):
    """A batch with too many rows that break its contract; one line naming the first bad rows."""


@dataclass(frozen=True)
class ContractBounds:
    reward_min: float = 0.0
    reward_max: float = 1.0
    max_model_version: int = 2**62
    group_size: int | None = None  # explorer rows per group (repeat_times); None = unchecked
    max_prompt_tokens: int = 4096
    max_response_tokens: int = 4096
    max_text_chars: int = 100_000
    max_image_bytes: int = ImageBounds.max_bytes
    max_image_side: int = ImageBounds.max_side
    max_image_pixels: int = ImageBounds.max_pixels

    @classmethod
    def of(cls, contracts, **extra) -> ContractBounds:
        """The bounds of a ``ContractsConfig`` (``extra``: group_size, max_model_version)."""
        return cls(reward_min=contracts.reward_min, reward_max=contracts.reward_max,
                   max_prompt_tokens=contracts.max_prompt_tokens, max_response_tokens=contracts.max_response_tokens,
                   max_text_chars=contracts.max_text_chars, max_image_bytes=contracts.max_image_bytes,
                   max_image_side=contracts.max_image_side, max_image_pixels=contracts.max_image_pixels, **extra)

    @property
    def images(self) -> ImageBounds:
        return ImageBounds(self.max_image_bytes, self.max_image_side, self.max_image_pixels)


@dataclass
class Verdict:
    accepted: pa.Table
    quarantined: pa.Table  # the rejected rows plus a ``reason`` column

    @property
    def counts(self) -> dict[str, int]:
        return {"rows": self.accepted.num_rows + self.quarantined.num_rows,
                "accepted": self.accepted.num_rows, "quarantined": self.quarantined.num_rows}

    @property
    def reasons(self) -> dict[str, int]:
        """How many quarantined rows failed each expectation (a row may fail several)."""
        return dict(Counter(part for r in self.quarantined.column("reason").to_pylist() for part in r.split("; ")))

    def with_quarantined(self, rows: pa.Table) -> Verdict:
        """This verdict with ``rows`` (which carry their ``reason``) quarantined too."""
        return Verdict(self.accepted, pa.concat_tables([self.quarantined, rows], promote_options="default"))


@cache
def _batch_definition():
    """One ephemeral GX context per process, progress bars off, with an in-memory pandas asset."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    asset = context.data_sources.add_pandas("rftflow").add_dataframe_asset("rows")
    return asset.add_batch_definition_whole_dataframe("batch")


MEMOIZED = "Memoized"  # the suffix of the memoized classes' names (``…_memoized`` as GX types)


@cache
def _within_bounds():
    """``ExpectMulticolumnValuesWithinBounds``: every row's value in each column of ``bounds``
    (column → [low, high], None = open) lies within it; a null is not checked (as GX's
    ``expect_column_values_to_be_between``: nulls are the flags' business). Built on first use, so
    importing this module does not import GX."""
    from typing import ClassVar, Optional

    from great_expectations.execution_engine import PandasExecutionEngine
    from great_expectations.expectations.expectation import MulticolumnMapExpectation
    from great_expectations.expectations.metrics.map_metric_provider import MulticolumnMapMetricProvider
    from great_expectations.expectations.metrics.map_metric_provider.multicolumn_condition_partial import (
        multicolumn_condition_partial,
    )

    class MulticolumnValuesWithinBounds(MulticolumnMapMetricProvider):  # registers itself with GX
        condition_metric_name = "multicolumn_values.within_bounds"
        condition_domain_keys = ("batch_id", "table", "column_list", "row_condition", "condition_parser",
                                 "ignore_row_if")
        condition_value_keys = ("bounds",)

        @multicolumn_condition_partial(engine=PandasExecutionEngine)
        def _pandas(cls, column_list, bounds, **kwargs):
            import pandas as pd

            outside = _outside_bounds(column_list, bounds)
            return pd.Series(~np.any(list(outside.values()), axis=0), index=column_list.index)

    class ExpectMulticolumnValuesWithinBounds(MulticolumnMapExpectation):
        """Each row's value in every column of ``bounds`` lies within that column's [low, high]."""

        bounds: dict[str, list[Optional[float]]]
        map_metric: ClassVar[str] = "multicolumn_values.within_bounds"
        success_keys: ClassVar[tuple[str, ...]] = ("mostly", "bounds")
        args_keys: ClassVar[tuple[str, ...]] = ("column_list", "bounds")

    ExpectMulticolumnValuesWithinBounds.update_forward_refs(Optional=Optional)  # the annotations are strings here
    return ExpectMulticolumnValuesWithinBounds


def _outside_bounds(frame, bounds: dict) -> dict[str, np.ndarray]:
    """Per column of ``bounds``: the rows whose (non-null) value lies outside [low, high]."""
    outside = {}
    for column, (low, high) in bounds.items():
        values = frame[column].to_numpy(dtype=float, na_value=np.nan)  # a null compares False: never outside
        bad = np.zeros(len(values), dtype=bool)
        if low is not None:
            bad |= values < low
        if high is not None:
            bad |= values > high
        outside[column] = bad
    return outside


@cache
def _memoized(base: type):
    """GX's expectation class ``base``, but computing its ``configuration`` once per object.

    GX 1.x rebuilds an expectation's configuration (a pydantic ``dict()``) for every keyword it
    reads, some 800 times per validation of the explorer suite: half its time. This subclass keeps
    the built configuration until a field is set. It registers under its own name, so GX's own
    classes stay as they are; ``check`` names failures by the GX expectation it extends."""
    from great_expectations.compatibility import pydantic

    def configuration(self):
        if self._configuration is None:
            self._configuration = base.configuration.fget(self)
        return self._configuration

    def __setattr__(self, field, value):
        if field != "_configuration":
            base.__setattr__(self, "_configuration", None)
        base.__setattr__(self, field, value)

    return type(f"{base.__name__}{MEMOIZED}", (base,), {
        "__module__": __name__, "_configuration": pydantic.PrivateAttr(None),
        "configuration": property(configuration), "__setattr__": __setattr__})


class _Expectations:
    """``gx.expectations``, memoized (``_memoized``): ``E.ExpectColumnValuesToBeNull(...)``."""

    def __getattr__(self, name: str):
        import great_expectations as gx

        return _memoized(getattr(gx.expectations, name))


def _gx_name(expectation_type: str) -> str:
    """The GX expectation a (memoized) expectation type extends: ``expect_..._to_be_between``."""
    return expectation_type.removesuffix(f"_{MEMOIZED.lower()}")


@cache
def contract_suite(kind: str, bounds: ContractBounds):
    """The GX suite of contract ``kind`` (see the module docstring), over the columns of ``_frame``."""
    import great_expectations as gx

    E = _Expectations()
    suite = gx.ExpectationSuite(name=f"{kind}_contract")
    add = suite.add_expectation
    if kind == "tasks":
        add(E.ExpectColumnValuesToBeNull(column="parse_error"))
        add(E.ExpectColumnValuesToBeNull(column="image_error"))
        for column in ("question", "answer", "prompt"):
            add(E.ExpectColumnValuesToNotBeNull(column=column))
            add(E.ExpectColumnValueLengthsToBeBetween(column=column, min_value=1, max_value=bounds.max_text_chars))
        return suite
    limits = experience_bounds(kind, bounds)
    add(_memoized(_within_bounds())(column_list=list(limits), bounds=limits, ignore_row_if="never"))
    return suite


IDS = ("experience_id", "campaign", "task_id", "group_id")


def experience_bounds(kind: str, bounds: ContractBounds) -> dict[str, list]:
    """The experience contract ``kind`` as bounds over ``_experience_frame``'s columns: measured
    numbers within the configured limits (a null text has length 0; a null response, which may be
    empty, -1), and no per-row rule broken (``violations`` in [0, 0])."""
    limits = {
        "prompt_length": [1, bounds.max_text_chars],
        # an explorer response may be empty (the model stopped at once); a demonstration or a rated one not
        "response_length": [0 if kind == "explorer" else 1, bounds.max_text_chars],
        "reward": [bounds.reward_min, bounds.reward_max],
        "prompt_tokens": [1, bounds.max_prompt_tokens],
        "response_tokens": [1, bounds.max_response_tokens],
        "model_version": [0, bounds.max_model_version],
        "violations": [0, 0],
    }
    if kind == "explorer" and bounds.group_size is not None:
        limits["group_size"] = [bounds.group_size, bounds.group_size]
    return limits


def _flags(kind: str) -> tuple[str, ...]:
    """The per-row rules of an experience contract, each a flag that must be true; rule i is bit i
    of the frame's ``violations``."""
    flags = (*(f"{c}_present" for c in IDS), "source_matches", "round_valid", "reward_is_finite",
             "token_lengths_consistent", "tokens_complete", "token_values_valid", "experience_id_is_first",
             "turns_consistent", "episode_completed", "images_valid")
    return (*flags, "has_logprobs") if kind == "explorer" else flags


def _not_finite(values: pa.Array) -> pa.Array:
    return pc.fill_null(pc.invert(pc.is_finite(values)), True)


def _any_element(column: pa.ChunkedArray, *tests) -> list[np.ndarray]:
    """Per row of a list column, for each test: whether ``test(elements)`` holds for any element
    (a null list: no). Elements are read row by row through the offsets, so values hidden under a
    null list (Arrow allows them) are never looked at."""
    lists = column.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    parents = np.repeat(np.arange(len(lists)), lengths)
    elements = pc.list_flatten(lists)  # skips null lists, so it lines up with ``parents``
    hits = []
    for test in tests:
        hit = np.zeros(len(lists), dtype=bool)
        if len(elements):
            hit[parents[np.asarray(pc.fill_null(test(elements), False).to_numpy(zero_copy_only=False), bool)]] = True
        hits.append(hit)
    return hits


def _negative(values: pa.Array) -> pa.Array:
    return pc.less(values, 0)


def _not_binary(values: pa.Array) -> pa.Array:
    return pc.invert(pc.is_in(values, pa.array([0, 1], values.type)))


def image_problems(table: pa.Table, bounds: ImageBounds) -> list[str | None]:
    """Per experience row: what is wrong with its images (``data.image_checks``), or None."""
    if "images" not in table.column_names or table.column("images").null_count == table.num_rows:
        return [None] * table.num_rows
    return column_problems(table.column("images"), bounds)


def _experience_frame(table: pa.Table, kind: str, images: list[str | None] | None = None):
    """The numbers the experience contract ``kind`` checks, one row per experience (see
    ``experience_bounds``): text lengths, token counts, the reward, and ``violations``, the bits
    of the per-row rules (``_flags``) the row breaks (``images``: each row's image problem)."""
    import pandas as pd

    def length(column: str, null: int):  # text: without surrounding whitespace (" " is empty)
        if pa.types.is_string(table.schema.field(column).type):
            return pc.fill_null(pc.utf8_length(pc.utf8_trim_whitespace(table.column(column))), null).to_numpy()
        return pc.fill_null(pc.list_value_length(table.column(column)), null).to_numpy()

    columns = {f"{c}_present": length(c, 0) > 0 for c in IDS}  # non-null and non-empty
    columns["prompt_length"] = length("prompt", 0)
    columns["response_length"] = length("response", -1)
    columns["source_matches"] = pc.fill_null(pc.equal(table.column("source"), kind), False).to_numpy(zero_copy_only=False)
    columns["round_valid"] = pc.fill_null(table.column("round"), -1).to_numpy() >= 0
    columns["prompt_tokens"] = length("prompt_ids", 0)
    columns["response_tokens"] = length("response_ids", 0)
    rewards = table.column("reward").to_numpy(zero_copy_only=False).astype(float)  # a null: NaN
    columns["reward_is_finite"] = np.isfinite(rewards)
    columns["reward"] = np.where(columns["reward_is_finite"], rewards, np.nan)  # NaN is never outside bounds
    ids, logprobs, mask = (length(c, -1) for c in ("response_ids", "response_logprobs", "response_mask"))
    columns["token_lengths_consistent"] = (ids >= 0) & ((logprobs == -1) | (logprobs == ids)) & ((mask == -1) | (mask == ids))
    if kind == "explorer":
        columns["has_logprobs"] = logprobs >= 0
    prompt_null, prompt_negative = _any_element(table.column("prompt_ids"), pc.is_null, _negative)
    response_null, response_negative = _any_element(table.column("response_ids"), pc.is_null, _negative)
    mask_null, mask_not_binary = _any_element(table.column("response_mask"), pc.is_null, _not_binary)
    (logprob_not_finite,) = _any_element(table.column("response_logprobs"), _not_finite)
    columns["tokens_complete"] = ~(prompt_null | response_null | mask_null | logprob_not_finite)
    columns["token_values_valid"] = ~(prompt_negative | response_negative | mask_not_binary)
    columns["turns_consistent"] = _turns_consistent(table)
    columns["episode_completed"] = np.array([episode_error(i) is None for i in table.column("info").to_pylist()],
                                            dtype=bool)
    columns["images_valid"] = np.array([problem is None for problem in images or [None] * table.num_rows], dtype=bool)
    group_ids, experience_ids = table.column("group_id").to_pylist(), table.column("experience_id").to_pylist()
    seen: set = set()
    first = [not (e in seen or seen.add(e)) for e in experience_ids]
    columns["experience_id_is_first"] = np.array(first, dtype=bool)
    # a group's size counts distinct experiences: a repeated row is quarantined, its group not
    sizes = Counter(g for g, f in zip(group_ids, first) if f)
    columns["group_size"] = np.array([sizes[g] for g in group_ids], dtype=np.int64)
    columns["model_version"] = pc.fill_null(table.column("model_version"), -1).to_numpy()
    violations = np.zeros(table.num_rows, dtype=np.int64)
    for bit, flag in enumerate(_flags(kind)):
        violations |= (~columns.pop(flag)).astype(np.int64) << bit
    columns["violations"] = violations
    return pd.DataFrame(columns)  # at once: setting a column at a time copies the frame each time


def episode_error(info: str | None) -> str | None:
    """Why an episode's environment failed (its ``info["error"]``), or None."""
    if not info or '"error"' not in info:
        return None
    try:
        return json.loads(info).get("error")
    except (ValueError, AttributeError):
        return None


def _turns_consistent(table: pa.Table) -> np.ndarray:
    """Per row: no ``turns`` (a single answer), or turns whose token spans tile the response in
    order, and a mask that is 1 exactly on the ``assistant`` turns' tokens."""
    ok = np.ones(table.num_rows, dtype=bool)
    if "turns" not in table.column_names or table.column("turns").null_count == table.num_rows:
        return ok
    for i, (turns, ids, mask) in enumerate(zip(*(table.column(c).to_pylist() for c in
                                                  ("turns", "response_ids", "response_mask")))):
        if turns is None:
            continue
        position, expected = 0, []
        for turn in turns:
            if turn["start"] != position or turn["end"] < turn["start"]:
                ok[i] = False
                break
            expected += [int(turn["role"] == "assistant")] * (turn["end"] - turn["start"])
            position = turn["end"]
        else:
            ok[i] = position == len(ids or ()) and (mask is None or list(mask) == expected)
    return ok


def _task_frame(table: pa.Table, bounds: ImageBounds = ImageBounds()):
    """The task contract's columns: ``parse_error``, the texts, and ``image_error`` (what is wrong
    with the images of the row's metadata, ``data.image_checks``)."""
    import pandas as pd

    def text(column: str) -> list:  # without surrounding whitespace, so "   " counts as empty
        values = table.column(column)
        return (pc.utf8_trim_whitespace(values) if pa.types.is_string(values.type) else values).to_pylist()

    columns = {"parse_error": table.column("parse_error").to_pylist(),
               **{c: text(c) for c in ("question", "answer", "prompt")},
               "image_error": ([task_images_problem(m, bounds) for m in table.column("metadata").to_pylist()]
                               if "metadata" in table.column_names else [None] * table.num_rows)}
    return pd.DataFrame({c: pd.Series(values, dtype=object) for c, values in columns.items()})


def _broken(kind: str, column: str, value) -> list[str]:
    """What a value outside its bounds says: the column's name, or for ``violations`` the name of
    each rule whose bit is set."""
    if column != "violations":
        return [column]
    return [flag for bit, flag in enumerate(_flags(kind)) if int(value) >> bit & 1]


def _validate(frame, suite, result_format: str):
    """GX's validation of ``suite`` on ``frame``: its ``Validator`` over the batch definition,
    which builds the batch once (``Batch.validate`` builds it a second time inside)."""
    from great_expectations.validator.v1_validator import Validator

    return Validator(_batch_definition(), result_format={"result_format": result_format},
                     batch_parameters={"dataframe": frame}).validate_expectation_suite(suite)


def check(table: pa.Table, kind: str, bounds: ContractBounds = ContractBounds()) -> Verdict:
    """Validate ``table`` against contract ``kind``; split accepted / quarantined (with ``reason``).

    Experience kinds read the Experience schema; ``tasks`` reads ``parse_error``, ``question``,
    ``answer``, ``prompt`` (see ``tasksets.parse_task_rows``).
    """
    if kind not in KINDS:
        raise ValueError(f"unknown contract {kind!r}; known: {', '.join(KINDS)}")
    if table.num_rows == 0:
        return Verdict(table, table.append_column("reason", pa.array([], pa.string())))
    images = None if kind == "tasks" else image_problems(table, bounds.images)
    frame = _task_frame(table, bounds.images) if kind == "tasks" else _experience_frame(table, kind, images)
    _batch_definition()  # the GX context first: a suite is made in it
    # a pass/fail run first (about half the cost); the row indices of failures only when some row fails
    if _validate(frame, contract_suite(kind, bounds), "BOOLEAN_ONLY").success:
        return Verdict(table, table.slice(0, 0).append_column("reason", pa.array([], pa.string())))
    result = _validate(frame, contract_suite(kind, bounds), "COMPLETE")
    reasons: dict[int, list[str]] = {}
    for r in result.results:
        if r.success:
            continue
        kwargs, expectation = r.expectation_config.kwargs, _gx_name(r.expectation_config.type)
        indices = r.result.get("unexpected_index_list")
        if indices is None:  # the expectation could not run: no row can be called good or bad
            info = r.exception_info or {}
            raise RuntimeError(f"{kind} contract: {expectation}({kwargs.get('column') or kwargs.get('column_list')}) "
                               f"did not run: {info.get('exception_message') or info}")
        outside = _outside_bounds(frame, kwargs["bounds"]) if "bounds" in kwargs else {}
        for index in indices:
            if outside:  # name the columns outside their bounds on this row, and the rules it breaks
                labels = [f"{expectation}({name})" for column, bad in outside.items() if bad[index]
                          for name in _broken(kind, column, frame.at[index, column])]
                if f"{expectation}(episode_completed)" in labels:  # the environment's failure comes first
                    labels.insert(0, f"episode failed: {episode_error(table.column('info')[index].as_py())}")
                if f"{expectation}(images_valid)" in labels:  # which image, and what is wrong with it
                    at = labels.index(f"{expectation}(images_valid)")
                    labels[at] += f": {images[index]}"
            elif kwargs["column"] in ("parse_error", "image_error"):
                labels = [f"{expectation}({kwargs['column']}): {frame.at[index, kwargs['column']]}"]
            else:
                labels = [f"{expectation}({kwargs['column']})"]
            reasons.setdefault(int(index), []).extend(labels)
    for index, labels in reasons.items():  # a row that did not parse has only that to say
        parse = [label for label in labels if "(parse_error)" in label]
        reasons[index] = parse or labels
    bad = sorted(reasons)
    good = [i for i in range(table.num_rows) if i not in reasons]
    quarantined = table.take(pa.array(bad, pa.int64())).append_column(
        "reason", pa.array(["; ".join(reasons[i]) for i in bad], pa.string()))
    return Verdict(table.take(pa.array(good, pa.int64())), quarantined)


def check_experiences(table: pa.Table, bounds: ContractBounds = ContractBounds(), kind: str = "explorer") -> Verdict:
    """``check`` for an experience table (``explorer``, ``expert`` or ``human``)."""
    return check(table, kind, bounds)


def enforce(verdict: Verdict, max_bad_fraction: float, what: str, row_label: str = "experience_id",
            label=None) -> None:
    """Raise ``ContractError`` if more than ``max_bad_fraction`` of the rows were quarantined,
    naming the first three bad rows (by column ``row_label``, or ``label(row)``) and their reasons."""
    counts = verdict.counts
    if counts["rows"] == 0 or counts["quarantined"] / counts["rows"] <= max_bad_fraction:
        return
    first = verdict.quarantined.slice(0, 3)
    names = [label(row) for row in first.to_pylist()] if label else first.column(row_label).to_pylist()
    named = " | ".join(f"{name}: {reason}" for name, reason in zip(names, first.column("reason").to_pylist()))
    raise ContractError(
        f"{what}: {counts['quarantined']} of {counts['rows']} rows ({counts['quarantined'] / counts['rows']:.0%}) "
        f"break the contract, above contracts.max_bad_fraction={max_bad_fraction}; first: {named}")
