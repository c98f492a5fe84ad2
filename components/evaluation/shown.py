"""What an evaluation shows of itself: a few held-out tasks with their greedy answers and rewards,
as tables for MLflow (``Tracker.log_table``: its UI shows a table's pictures inline).

Each taskset's (mixture part's) first ``per_taskset`` answers, in held-out order, so every
evaluation of a campaign shows the same tasks and a reader sees one task's answer change from
round to round. Tasks with pictures go in a table of their own (``pictures``, a column of PIL
images: MLflow refuses a column that mixes pictures and empty cells).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rftflow.components.data.images import task_images
from rftflow.components.evaluation.greedy import Answer


def answer_tables(answers: Sequence[Answer], per_taskset: int) -> dict[str, dict[str, list[Any]]]:
    """``{"text": columns, "pictures": columns}`` (only those with rows), each column a list:
    ``taskset``, ``task_id``, ``prompt``, (``picture``,) ``answer``, ``reward``."""
    seen: dict[str | None, int] = {}
    tables: dict[str, dict[str, list[Any]]] = {}
    for answer in answers:
        part = answer.task.metadata.get("taskset")
        seen[part] = seen.get(part, 0) + 1
        if seen[part] > per_taskset:
            continue
        pictures = task_images(answer.task)
        table = tables.setdefault("pictures" if pictures else "text", {})
        row = {"taskset": part or "", "task_id": answer.task.task_id, "prompt": answer.task.prompt,
               **({"picture": pictures[0]} if pictures else {}), "answer": answer.text, "reward": answer.reward}
        for column, value in row.items():
            table.setdefault(column, []).append(value)
    return tables
