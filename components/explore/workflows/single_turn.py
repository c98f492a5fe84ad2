"""``single_turn``: one sampled response per episode (the default; the explorer's original behaviour)."""

from __future__ import annotations

import pyarrow as pa

from rftflow.components.data.images import images_argument
from rftflow.components.data.tasksets import Task
from rftflow.components.evaluation import greedy
from rftflow.components.explore import explorer
from rftflow.components.explore.workflows.base import Sampling, Workflow
from rftflow.components.explore.workflows.episodes import Episode


class SingleTurn(Workflow):
    """The task's prompt → one response, mask all ones; experts are the gold answers."""

    name = "single_turn"

    def run(self, tasks: list[Task], engine, *, n: int, sampling: Sampling) -> list[list[Episode]]:
        groups = engine.generate([t.prompt for t in tasks], **images_argument(tasks), n=n,
                                 max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                                 greedy=sampling.greedy)
        return [[Episode(task, r.prompt_ids, list(r.response_ids), [1] * len(r.response_ids), list(r.logprobs),
                         text=r.text, done=True, finished=r.finished) for r in group]
                for task, group in zip(tasks, groups)]

    def explore(self, engine, tasks: list[Task], **kwargs) -> pa.Table:
        table = explorer.explore(engine, tasks, **kwargs)
        if self.domain is not None:
            table = table.set_column(table.schema.get_field_index("domain"), "domain",
                                     pa.array([self.domain] * table.num_rows, pa.string()))
        return table

    def expert_table(self, engine, tasks: list[Task], *, campaign: str, limit: int | None = None) -> pa.Table:
        return explorer.expert_demonstrations(engine, tasks, campaign=campaign, limit=limit)

    def evaluate(self, engine, tasks: list[Task], reward_fn, reward_name: str, max_new_tokens: int,
                 answers: list | None = None) -> dict[str, float]:
        return greedy.evaluate(engine, tasks, reward_fn, max_new_tokens, answers)

    def greedy_scores(self, engine, tasks: list[Task], reward_fn, reward_name: str, max_new_tokens: int) -> list[float]:
        return greedy.greedy_scores(engine, tasks, reward_fn, max_new_tokens)
