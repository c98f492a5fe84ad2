"""Data pipelines: ordered steps over task tables and experience tables, configured in YAML.

A step is ``{op: <name>, **options}``. Operators are pure functions registered per kind
(``tasks``, ``experiences``) with ``@register_operator(kind, name)``; each returns the kept table,
or (kept, dropped). ``run_pipeline`` never loses a row: the dropped ones come back with a
``reason`` naming the step (``pipeline:length_filter(max_tokens=16)``), and rows in = kept +
dropped at every step (a transform like ``synthesize`` may add rows, never remove them).
Options an operator declares but the step leaves out come from the run's context (e.g. ``seed``,
``pass_rates``).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import typing
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.data.groups import drop_zero_variance_groups
from rftflow.components.data.images import image_digests
from rftflow.components.data.tasksets import reasoning_gym_tasks, task_id, tasks_to_table

PIPELINE_KINDS = ("tasks", "experiences")
_OPERATORS: dict[str, dict[str, Callable]] = {kind: {} for kind in PIPELINE_KINDS}


def register_operator(kind: str, name: str) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(table, **options) -> table | (kept, dropped)`` as ``name`` for ``kind``."""
    def decorate(fn: Callable) -> Callable:
        _OPERATORS[kind][name] = fn
        return fn

    return decorate


def _operator(kind: str, index: int, step: Mapping[str, Any]) -> tuple[Callable, dict[str, Any]]:
    where = f"pipelines.{kind}[{index}]"
    if not isinstance(step, Mapping) or "op" not in step:
        raise ValueError(f"{where}: a step is a mapping with an 'op' key, got {step!r}")
    name, options = step["op"], {k: v for k, v in step.items() if k != "op"}
    if name not in _OPERATORS[kind]:
        raise ValueError(f"{where}: unknown operator {name!r}; known: {', '.join(sorted(_OPERATORS[kind]))}")
    fn = _OPERATORS[kind][name]
    params = inspect.signature(fn).parameters
    unknown = sorted(set(options) - {p for p in params if p != "table"})
    if unknown:
        allowed = ", ".join(p for p in params if p != "table") or "none"
        raise ValueError(f"{where} ({name}): unknown option(s) {', '.join(unknown)}; options: {allowed}")
    return fn, _typed_options(fn, options, f"{where} ({name})")


@functools.cache
def _option_types(fn: Callable) -> dict[str, Any]:
    """A pydantic ``TypeAdapter`` per annotated option of operator ``fn`` (built once: every round
    runs the pipeline)."""
    from pydantic import TypeAdapter

    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a user operator's annotations that do not resolve: its options go as given
        return {}
    return {name: TypeAdapter(hint) for name, hint in hints.items() if name not in ("table", "return")}


def _typed_options(fn: Callable, options: dict[str, Any], where: str) -> dict[str, Any]:
    """``options`` validated against ``fn``'s annotations with pydantic ("2" → 2.0 for a float; a
    two-element clip for ``tuple[float, float]``), so a bad value fails at config time, not in a round."""
    from pydantic import ValidationError

    types = _option_types(fn)
    typed = {}
    for key, value in options.items():
        if key not in types:
            typed[key] = value
            continue
        try:
            typed[key] = types[key].validate_python(value)
        except ValidationError as e:
            error = e.errors()[0]
            at = f" at [{']['.join(map(str, error['loc']))}]" if error["loc"] else ""
            raise ValueError(f"{where}: option {key}={value!r}: {error['msg']}{at}") from None
    return typed


def check_pipeline(kind: str, steps: Sequence[Mapping[str, Any]]) -> None:
    """Fail (``ValueError``, one line naming the step) on an unknown operator or option."""
    for index, step in enumerate(steps):
        _operator(kind, index, step)


@dataclass
class PipelineResult:
    kept: pa.Table
    dropped: pa.Table  # the removed rows plus ``reason``
    counts: dict[str, int] = field(default_factory=dict)  # rows dropped per "<index>:<op>"
    added: int = 0  # rows a transform added (synthesize): rows in + added = kept + dropped


def run_pipeline(kind: str, table: pa.Table, steps: Sequence[Mapping[str, Any]], **context: Any) -> PipelineResult:
    """Apply ``steps`` in order (see the module docstring)."""
    dropped, counts, added = [], {}, 0
    for index, step in enumerate(steps):
        before = table.num_rows
        fn, options = _operator(kind, index, step)
        params = inspect.signature(fn).parameters
        extra = {k: v for k, v in context.items() if k in params and k not in options}
        out = fn(table, **options, **extra)
        table, removed = out if isinstance(out, tuple) else (out, None)
        label = f"pipeline:{step['op']}(" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"
        n = 0 if removed is None else removed.num_rows
        grown = removed is None and table.num_rows >= before  # a transform may only add rows (synthesize)
        if not grown and table.num_rows + n != before:
            raise RuntimeError(f"pipelines.{kind}[{index}] ({step['op']}) lost rows: {before} in, "
                               f"{table.num_rows} kept + {n} dropped")
        added += table.num_rows - before if grown else 0
        if n:
            dropped.append(removed.append_column("reason", pa.array([label] * n, pa.string())))
        counts[f"{index}:{step['op']}"] = n
    schema = table.schema.append(pa.field("reason", pa.string()))
    lost = pa.concat_tables(dropped, promote_options="default") if dropped else schema.empty_table()
    return PipelineResult(table, lost, counts, added)


def _split(table: pa.Table, keep: list[bool]) -> tuple[pa.Table, pa.Table]:
    mask = pa.array(keep, pa.bool_())
    return table.filter(mask), table.filter(pc.invert(mask))


# task operators ------------------------------------------------------------------------------
def _clean(text: str | None) -> str | None:
    return None if text is None else " ".join(unicodedata.normalize("NFKC", text).split())


@register_operator("tasks", "normalize")
def normalize_tasks(table: pa.Table) -> pa.Table:
    """NFKC-normalise question, answer and prompt; strip; collapse whitespace runs to one space.
    The task id is the question's hash, so it is recomputed."""
    for column in ("question", "answer", "prompt"):
        cleaned = pa.array([_clean(v) for v in table.column(column).to_pylist()], pa.string())
        table = table.set_column(table.schema.get_field_index(column), table.schema.field(column), cleaned)
    ids = pa.array([task_id(q, image_digests(json.loads(m or "{}"))) for q, m in
                    zip(table.column("question").to_pylist(), table.column("metadata").to_pylist())], pa.string())
    return table.set_column(table.schema.get_field_index("task_id"), table.schema.field("task_id"), ids)


@register_operator("tasks", "length_filter")
def task_length_filter(table: pa.Table, min_chars: int = 1, max_chars: int | None = None,
                       column: str = "prompt") -> tuple[pa.Table, pa.Table]:
    """Keep tasks whose ``column`` (default the prompt) has min_chars ≤ length ≤ max_chars characters."""
    lengths = [len(v or "") for v in table.column(column).to_pylist()]
    return _split(table, [min_chars <= n and (max_chars is None or n <= max_chars) for n in lengths])


def content_hash(question: str, answer: str) -> str:
    """sha256 of the normalised question and the answer."""
    return hashlib.sha256(f"{_clean(question)}\x1f{answer}".encode()).hexdigest()


@register_operator("tasks", "dedupe")
def dedupe_tasks(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Drop a task whose content hash (question, answer) appeared earlier in the table."""
    seen: set[str] = set()
    keep = [not (h in seen or seen.add(h)) for h in (content_hash(q, a) for q, a in zip(
        table.column("question").to_pylist(), table.column("answer").to_pylist()))]
    return _split(table, keep)


@register_operator("tasks", "prioritize")
def prioritize_tasks(table: pa.Table, target: float = 0.5, pass_rates=None) -> pa.Table:
    """Order tasks by |estimated pass rate − target| (closest first, stable); drops nothing.
    Without measured pass rates (``pass_rates`` from the context) the order is unchanged."""
    if pass_rates is None:
        return table
    m = pass_rates.mean()
    order = sorted(range(table.num_rows),
                   key=lambda i: abs(pass_rates.estimate(table.column("task_id")[i].as_py(), m) - target))
    return table.take(pa.array(order, pa.int64()))


@register_operator("tasks", "synthesize")
def synthesize_tasks(table: pa.Table, dataset: str, n: int, params: dict | None = None,
                     prompt_template: str = "{question}", seed: int = 0) -> pa.Table:
    """Append ``n`` tasks from reasoning-gym ``dataset`` generated with ``params`` (the difficulty,
    e.g. ``max_digits``) and ``seed``; built exactly as a reasoning-gym taskset is."""
    new = reasoning_gym_tasks(dataset, params or {}, n, seed + 1, prompt_template)
    return pa.concat_tables([table, tasks_to_table(new).cast(table.schema)])


# experience operators ------------------------------------------------------------------------
@register_operator("experiences", "shape_reward")
def shape_reward(table: pa.Table, add: float = 0.0, scale: float = 1.0,
                 clip: tuple[float, float] | None = None) -> pa.Table:
    """reward' = clip(scale · reward + add, low, high); the original stays in ``rewards["unshaped"]``.
    NaN stays NaN (the contract has quarantined non-finite rewards before this runs)."""
    rewards = table.column("reward").to_pylist()
    shaped = []
    for r in rewards:
        v = None if r is None else scale * r + add
        if v is not None and clip is not None and v == v:
            v = min(max(v, clip[0]), clip[1])
        shaped.append(v)
    # a second shaping keeps the first original: "unshaped" is the verifier's reward
    per_fn = [m if r is None or any(k == "unshaped" for k, _ in m or []) else [*(m or []), ("unshaped", r)]
              for m, r in zip(table.column("rewards").to_pylist(), rewards)]
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(shaped, pa.float64()))
    return table.set_column(table.schema.get_field_index("rewards"), "rewards",
                            pa.array(per_fn, table.schema.field("rewards").type))


@register_operator("experiences", "drop_zero_variance")
def drop_zero_variance(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Drop groups whose rewards are all equal (``groups.drop_zero_variance_groups``)."""
    kept, _ = drop_zero_variance_groups(table)
    keep_ids = set(kept.column("experience_id").to_pylist())
    return _split(table, [e in keep_ids for e in table.column("experience_id").to_pylist()])


@register_operator("experiences", "dedupe")
def dedupe_experiences(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Drop a row whose (task_id, response) or experience_id appeared earlier in the table."""
    pairs, ids, keep = set(), set(), []
    for eid, tid, resp in zip(*(table.column(c).to_pylist() for c in ("experience_id", "task_id", "response"))):
        keep.append((tid, resp) not in pairs and eid not in ids)
        pairs.add((tid, resp))
        ids.add(eid)
    return _split(table, keep)


@register_operator("experiences", "length_filter")
def experience_length_filter(table: pa.Table, min_tokens: int = 1,
                             max_tokens: int | None = None) -> tuple[pa.Table, pa.Table]:
    """Keep rows with min_tokens ≤ len(response_ids) ≤ max_tokens."""
    lengths = [len(ids or []) for ids in table.column("response_ids").to_pylist()]
    return _split(table, [min_tokens <= n and (max_tokens is None or n <= max_tokens) for n in lengths])
