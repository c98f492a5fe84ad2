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
    with path.open(encoding="utf-8", errors="strict") as f:
        try:
            for lineno, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        rows.append((lineno, json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise TasksetError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
        except UnicodeDecodeError:
            raise TasksetError(f"{path}:{len(rows) + 1}: not valid UTF-8") from None
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
    """(train, eval) tasks. reasoning-gym: eval from its own seed stream, train from another with
    eval questions removed; files: shuffled with ``seed``, the first ``eval_size`` distinct questions
    held out."""
    if cfg.source.startswith(REASONING_GYM_PREFIX):
        name = cfg.source[len(REASONING_GYM_PREFIX):]
        eval_entries = _reasoning_gym_entries(name, cfg.params, cfg.eval_size * 4, seed * 2 + 1)
        train_entries = _reasoning_gym_entries(name, cfg.params, cfg.size, seed * 2)
    else:
        entries = _file_entries(Path(cfg.source), cfg)
        random.Random(seed).shuffle(entries)
        eval_entries, train_entries = entries, entries
    eval_tasks: dict[str, Task] = {}
    for entry in eval_entries:
        task = _to_task(entry, cfg.prompt_template)
        eval_tasks.setdefault(task.task_id, task)
        if len(eval_tasks) == cfg.eval_size:
            break
    train = [t for t in (_to_task(e, cfg.prompt_template) for e in train_entries) if t.task_id not in eval_tasks]
    if not train:
        raise TasksetError(f"taskset {cfg.source}: no training tasks left after holding out {len(eval_tasks)}")
    return train, list(eval_tasks.values())


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


def select_tasks(tasks: list[Task], round_no: int, k: int, seed: int) -> list[Task]:
    """The ``k`` tasks of round ``round_no`` (1-based): a fresh seeded shuffle per pass over the
    taskset, taken in order — deterministic in (seed, round), so a re-run round sees the same tasks."""
    picked: list[Task] = []
    start = (round_no - 1) * k
    while len(picked) < k:
        epoch, offset = divmod(start + len(picked), len(tasks))
        order = list(range(len(tasks)))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        picked.extend(tasks[i] for i in order[offset: offset + k - len(picked)])
    return picked


__all__ = ["Task", "TasksetError", "check_taskset", "load_tasks", "select_tasks", "tasks_from_table", "tasks_to_table"]
