"""Scoring: a round's table of rollouts scored against its tasks (greedy evaluation on held-out tasks,
with the same rewards, is ``components.evaluation``)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.data.tasksets import Task
from rftflow.components.evaluation.greedy import reward_name_of, score_all
from rftflow.components.evaluation.verdicts import Graded, Score, is_correct
from rftflow.components.verify.rewards import RewardFn
from rftflow.components.verify.shaping import shaping_terms


def score(table: pa.Table, tasks_by_id: dict[str, Task], reward_fn: RewardFn, reward_name: str) -> pa.Table:
    """Fill ``reward`` and ``rewards`` by scoring each row against its task (as
    ``evaluation.greedy.reward_of`` does); a score's reason goes into the row's ``info``
    (``reward_reason``). ``rewards`` holds each term's value (the task's own reward by its name,
    ``reward.combine``'s terms, the length shaping's), ``reward`` their total. A row whose reward could not be computed gets a null reward and
    ``info.reward_unavailable`` (``unavailable_reasons``)."""
    tasks = [tasks_by_id[tid] for tid in table.column("task_id").to_pylist()]
    names = [reward_name_of(t, reward_fn, reward_name) for t in tasks]
    scores: list[Score] = [Score(float(sum(s or ()))) for s in table.column("step_rewards").to_pylist()]  # env_return
    text = [i for i, name in enumerate(names) if name != "env_return"]
    responses = table.column("response").to_pylist()
    for i, s in zip(text, score_all([responses[i] for i in text], [tasks[i] for i in text], reward_fn)):
        scores[i] = s
    rewards = [s.value for s in scores]
    terms = [None if r is None else dict(r.terms) if isinstance(r, Graded) else {name.rpartition(":")[2]: r}
             for name, r in zip(names, rewards)]
    shaping = getattr(reward_fn, "shaping", None)
    if shaping is not None and (shaping.overlong or shaping.length):
        lengths = pc.list_value_length(table.column("response_ids")).fill_null(0).to_pylist()
        shaped = shaping_terms(shaping, reward_fn.max_new_tokens, lengths, table.column("group_id").to_pylist(),
                               [r is not None and is_correct(r) for r in rewards])
        for name, (weight, values) in shaped.items():
            for i, value in enumerate(values):
                if rewards[i] is not None:
                    rewards[i], terms[i][name] = rewards[i] + weight * value, value
    infos = table.column("info").to_pylist()
    for i, s in enumerate(scores):
        if s.reason is not None:
            info = json.loads(infos[i] or "{}")
            info["reward_unavailable" if s.value is None else "reward_reason"] = s.reason
            infos[i] = json.dumps(info, sort_keys=True)
    table = table.set_column(table.schema.get_field_index("info"), "info", pa.array(infos, pa.string()))
    table = table.set_column(table.schema.get_field_index("reward"), "reward",
                             pa.array([None if r is None else float(r) for r in rewards], pa.float64()))
    per_fn = pa.array([None if t is None else list(t.items()) for t in terms], table.schema.field("rewards").type)
    return table.set_column(table.schema.get_field_index("rewards"), "rewards", per_fn)


def unavailable_reasons(scored: pa.Table) -> list[str | None]:
    """Per row of a ``score``d table: why its reward could not be computed, or None."""
    return [json.loads(i).get("reward_unavailable") if i and "reward_unavailable" in i else None
            for i in scored.column("info").to_pylist()]
