"""The taskset splits of a running campaign, read from its store once each."""

from __future__ import annotations

import functools

from rftflow.components.data.tasksets import Task, tasks_from_table


class TaskSplits:
    """``train``, its tasks ``by_id`` and ``eval``, each read from ``store`` (its ``read_tasks``) on
    first use; ``keep_train`` takes the train split a fresh ``prepare`` has just stored instead."""

    def __init__(self, store):
        self.store = store

    def keep_train(self, tasks: list[Task]) -> None:
        self.__dict__["train"] = tasks
        self.__dict__.pop("by_id", None)

    @functools.cached_property
    def train(self) -> list[Task]:
        return tasks_from_table(self.store.read_tasks("train"))

    @functools.cached_property
    def by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.train}

    @functools.cached_property
    def eval(self) -> list[Task]:
        return tasks_from_table(self.store.read_tasks("eval"))
