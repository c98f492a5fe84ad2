"""Explorer rows as a round stages them (unscored), for the verify tests: one group per call."""

from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.data.tasksets import Task


def rollouts(responses: list[str], task: Task, group: str = "r1-g0") -> tuple:
    """(a table of one group of ``responses`` to ``task``, one token per character, unscored; tasks by id)."""
    rows = [make_experience(experience_id=f"{group}-{k}", campaign="c", round=1, task_id=task.task_id,
                            group_id=f"{group}-{task.task_id}", source="explorer", prompt=task.prompt, response=text,
                            prompt_ids=[1, 2], response_ids=[3] * max(1, len(text)),
                            response_logprobs=[-0.5] * max(1, len(text)), response_mask=[1] * max(1, len(text)),
                            model_version=0)
            for k, text in enumerate(responses)]
    return to_table(rows), {task.task_id: task}
