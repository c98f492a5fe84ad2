"""The explorer's work: tasks → groups of rollouts → experience rows; gold answers → expert rows."""

from __future__ import annotations

import pyarrow as pa

from rftflow.components.data.experience import experience_id, make_experience, to_table
from rftflow.components.data.images import images_argument, row_images, task_images
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.data.tasksets import Task


def explore(engine: HFRolloutEngine, tasks: list[Task], *, campaign: str, round_no: int, repeat_times: int,
            temperature: float, max_new_tokens: int, model_version: int, first_slot: int = 0) -> pa.Table:
    """``repeat_times`` sampled responses per task (one group per task, ids numbered from
    ``first_slot``), unscored (reward null). A task's images go to the engine and into its rows."""
    groups = engine.generate([t.prompt for t in tasks], **images_argument(tasks), n=repeat_times,
                             max_new_tokens=max_new_tokens, temperature=temperature)
    rows = []
    for slot, (task, group) in enumerate(zip(tasks, groups), start=first_slot):
        group_id = f"r{round_no}-g{slot}-{task.task_id}"
        images = row_images(task.metadata)
        for k, r in enumerate(group):
            rows.append(make_experience(
                experience_id=experience_id(campaign, round_no, group_id, k), campaign=campaign, round=round_no,
                task_id=task.task_id, group_id=group_id, source="explorer", prompt=task.prompt, response=r.text,
                prompt_ids=r.prompt_ids, response_ids=r.response_ids, response_logprobs=r.logprobs,
                response_mask=[1] * len(r.response_ids), model_version=model_version,
                info={"finished": r.finished}, images=images,
            ))
    return to_table(rows)


def expert_demonstrations(engine: HFRolloutEngine, tasks: list[Task], *, campaign: str,
                          limit: int | None = None) -> pa.Table:
    """One expert experience per distinct task (the first ``limit`` of them): the gold answer as the
    response, ended with EOS."""
    tok = engine.tokenizer
    rows, seen = [], set()
    for task in tasks:
        if task.task_id in seen:
            continue
        if limit is not None and len(seen) == limit:
            break
        seen.add(task.task_id)
        response_ids = tok(task.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        images = task_images(task)
        rows.append(make_experience(
            experience_id=experience_id(campaign, "expert", task.task_id), campaign=campaign, round=0,
            task_id=task.task_id, group_id=f"expert-{task.task_id}", source="expert", prompt=task.prompt,
            response=task.answer, response_ids=response_ids,
            prompt_ids=engine.encode(task.prompt, images) if images else engine.encode(task.prompt),
            response_mask=[1] * len(response_ids), reward=1.0, rewards={"gold": 1.0}, model_version=0,
            info={"origin": "taskset gold answer"}, images=row_images(task.metadata),
        ))
    return to_table(rows)
