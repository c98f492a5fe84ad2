"""Tasksets: reasoning-gym generators or JSONL/Parquet files → a train split and a held-out eval split.

The eval split is disjoint from train by question text (no eval question ever appears in train).
Bad task files fail before any work starts, naming the file and the row (1-based).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from components.config import TasksetConfig

REASONING_GYM_PREFIX = "reasoning_gym:"
TASK_SCHEMA = pa.schema(
    [
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),
        pa.field("metadata", pa.string()),
    ]
)


class TasksetError(ValueError):
    """A taskset that cannot be used; the message is one line naming the file/row or key."""


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    prompt: str
    answer: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def entry(self) -> dict[str, Any]:
        """The reasoning-gym style entry verifiers take: question, answer, metadata."""
        return {"question": self.question, "answer": self.answer, "metadata": self.metadata}


def task_id(question: str) -> str:
    """Content hash of the question: the same question is the same task."""
    return hashlib.sha256(question.encode()).hexdigest()[:16]


def _format_prompt(template: str, question: str, answer: str, metadata: dict[str, Any]) -> str:
    fields = {**metadata, "question": question, "answer": answer}
    try:
        return template.format(**fields)
    except KeyError as e:
        raise TasksetError(
            f"taskset.prompt_template: unknown field {e.args[0]!r}; available: {', '.join(sorted(fields))}"
        ) from None


def _reasoning_gym_entries(name: str, params: dict[str, Any], size: int, seed: int) -> list[dict[str, Any]]:
    import reasoning_gym

    try:
        return list(reasoning_gym.create_dataset(name, size=size, seed=seed, **params))
    except (ValueError, TypeError, AssertionError) as e:
        raise TasksetError(f"taskset {REASONING_GYM_PREFIX}{name} with params {params}: {e}") from None


def _file_rows(path: Path) -> list[tuple[int, Any]]:
    """(row number, row) pairs of a JSONL or Parquet file."""
    if not path.is_file():
        raise TasksetError(f"taskset file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return list(enumerate(pq.read_table(path).to_pylist(), start=1))
        except Exception as e:  # noqa: BLE001 — pyarrow raises several types for corrupt files
            raise TasksetError(f"{path}: not a readable Parquet file ({e})") from None
    if path.suffix not in (".jsonl", ".json"):
        raise TasksetError(f"{path}: unsupported taskset file type {path.suffix!r}; use .jsonl or .parquet")
    rows = []
    with path.open("rb") as f:  # decode line by line, so a bad byte is reported on its own line
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise TasksetError(f"{path}:{lineno}: not valid UTF-8") from None
            if line.strip():
                try:
                    rows.append((lineno, json.loads(line)))
                except json.JSONDecodeError as e:
                    raise TasksetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    return rows


def _file_entries(path: Path, cfg: TasksetConfig) -> list[dict[str, Any]]:
    entries = []
    for row_no, row in _file_rows(path):
        if not isinstance(row, dict):
            raise TasksetError(f"{path}:{row_no}: expected an object, got {type(row).__name__}")
        entry = {}
        for key, target in ((cfg.question_key, "question"), (cfg.answer_key, "answer")):
            value = row.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not value.strip():
                raise TasksetError(f"{path}:{row_no}: missing or empty {key!r} (need a non-empty string)")
            entry[target] = value
        entry["metadata"] = {k: v for k, v in row.items() if k not in (cfg.question_key, cfg.answer_key)}
        entries.append(entry)
    if not entries:
        raise TasksetError(f"{path}: no tasks")
    return entries


def _to_task(entry: dict[str, Any], template: str) -> Task:
    question, answer = str(entry["question"]), str(entry["answer"])
    metadata = json.loads(json.dumps(entry.get("metadata") or {}, default=str))  # JSON-safe
    return Task(task_id(question), question, _format_prompt(template, question, answer, metadata), answer, metadata)


def load_tasks(cfg: TasksetConfig, seed: int) -> tuple[list[Task], list[Task]]:
    """(train, eval): the distinct questions are shuffled with ``seed`` and the first ``eval_size``
    held out, so the eval split is a uniform sample of distinct tasks, disjoint from train by question.
    Train keeps the source's repeats (a generator's frequent tasks stay frequent in exploration)."""
    if cfg.source.startswith(REASONING_GYM_PREFIX):
        entries = _reasoning_gym_entries(cfg.source[len(REASONING_GYM_PREFIX):], cfg.params, cfg.size, seed)
    else:
        entries = _file_entries(Path(cfg.source), cfg)
    tasks = [_to_task(e, cfg.prompt_template) for e in entries]
    distinct = list(dict.fromkeys(t.task_id for t in tasks))
    random.Random(seed).shuffle(distinct)
    held_out_ids = set(distinct[:cfg.eval_size])
    if len(held_out_ids) == len(distinct):
        raise TasksetError(
            f"taskset {cfg.source}: {len(distinct)} distinct tasks leave none for training after holding out "
            f"taskset.eval_size={cfg.eval_size}"
        )
    first = {}
    for t in tasks:
        first.setdefault(t.task_id, t)
    held_out = [first[i] for i in distinct[:cfg.eval_size]]
    train = [t for t in tasks if t.task_id not in held_out_ids]
    return train, held_out


def check_taskset(cfg: TasksetConfig) -> None:
    """Fail fast (``TasksetError``) on a bad taskset: every file row parsed, the generator created."""
    if cfg.source.startswith(REASONING_GYM_PREFIX):
        entries = _reasoning_gym_entries(cfg.source[len(REASONING_GYM_PREFIX):], cfg.params, 1, 0)
    else:
        entries = _file_entries(Path(cfg.source), cfg)
    _to_task(entries[0], cfg.prompt_template)


def tasks_to_table(tasks: list[Task]) -> pa.Table:
    return pa.Table.from_pylist(
        [{"task_id": t.task_id, "question": t.question, "prompt": t.prompt, "answer": t.answer,
          "metadata": json.dumps(t.metadata, sort_keys=True)} for t in tasks],
        schema=TASK_SCHEMA,
    )


def tasks_from_table(table: pa.Table) -> list[Task]:
    return [
        Task(r["task_id"], r["question"], r["prompt"], r["answer"], json.loads(r["metadata"] or "{}"))
        for r in table.to_pylist()
    ]


__all__ = ["Task", "TasksetError", "check_taskset", "load_tasks", "tasks_from_table", "tasks_to_table"]
