"""The explorer's work: tasks → groups of rollouts → experience rows; gold answers → expert rows;
scoring with a reward function; greedy held-out evaluation."""

from __future__ import annotations

import pyarrow as pa

from rftflow.components.data.experience import experience_id, make_experience, to_table
from rftflow.components.explore.rewards import RewardFn
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.data.tasksets import Task


def explore(engine: HFRolloutEngine, tasks: list[Task], *, campaign: str, round_no: int, repeat_times: int,
            temperature: float, max_new_tokens: int, model_version: int, first_slot: int = 0) -> pa.Table:
    """``repeat_times`` sampled responses per task (one group per task, ids numbered from
    ``first_slot``), unscored (reward null)."""
    groups = engine.generate([t.prompt for t in tasks], n=repeat_times, max_new_tokens=max_new_tokens,
                             temperature=temperature)
    rows = []
    for slot, (task, group) in enumerate(zip(tasks, groups), start=first_slot):
        group_id = f"r{round_no}-g{slot}-{task.task_id}"
        for k, r in enumerate(group):
            rows.append(make_experience(
                experience_id=experience_id(campaign, round_no, group_id, k), campaign=campaign, round=round_no,
                task_id=task.task_id, group_id=group_id, source="explorer", prompt=task.prompt, response=r.text,
                prompt_ids=r.prompt_ids, response_ids=r.response_ids, response_logprobs=r.logprobs,
                response_mask=[1] * len(r.response_ids), model_version=model_version,
                info={"finished": r.finished},
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
        rows.append(make_experience(
            experience_id=experience_id(campaign, "expert", task.task_id), campaign=campaign, round=0,
            task_id=task.task_id, group_id=f"expert-{task.task_id}", source="expert", prompt=task.prompt,
            response=task.answer, prompt_ids=engine.encode(task.prompt), response_ids=response_ids,
            response_mask=[1] * len(response_ids), reward=1.0, rewards={"gold": 1.0}, model_version=0,
            info={"origin": "taskset gold answer"},
        ))
    return to_table(rows)


def score(table: pa.Table, tasks_by_id: dict[str, Task], reward_fn: RewardFn, reward_name: str) -> pa.Table:
    """Fill ``reward`` and ``rewards`` by scoring each response against its task."""
    rewards = [reward_fn(resp, tasks_by_id[tid]) for resp, tid in
               zip(table.column("response").to_pylist(), table.column("task_id").to_pylist())]
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(rewards, pa.float64()))
    per_fn = pa.array([[(reward_name, r)] for r in rewards], table.schema.field("rewards").type)
    return table.set_column(table.schema.get_field_index("rewards"), "rewards", per_fn)


def greedy_scores(engine: HFRolloutEngine, tasks: list[Task], reward_fn: RewardFn, max_new_tokens: int,
                  finished: list[bool] | None = None) -> list[float]:
    """The reward of each task's greedy response, in task order (and, into ``finished``, whether
    each response ended with EOS within ``max_new_tokens``)."""
    groups = engine.generate([t.prompt for t in tasks], n=1, max_new_tokens=max_new_tokens, greedy=True)
    if finished is not None:
        finished.extend(g[0].finished for g in groups)
    return [reward_fn(g[0].text, t) for g, t in zip(groups, tasks)]


def evaluate(engine: HFRolloutEngine, tasks: list[Task], reward_fn: RewardFn, max_new_tokens: int) -> dict[str, float]:
    """Greedy decoding on held-out tasks: accuracy = share of responses with reward 1, the mean
    reward, the share of responses that ended within ``max_new_tokens`` (``eval/finished``) and
    the accuracy of those (``eval/accuracy_of_finished``, 0 when none did) — a chatty model's
    answer cut off by the budget fails whatever its arithmetic, so the two split format from skill."""
    finished: list[bool] = []
    scores = greedy_scores(engine, tasks, reward_fn, max_new_tokens, finished)
    correct_finished = sum(s >= 1.0 and f for s, f in zip(scores, finished))
    return {"eval/accuracy": sum(s >= 1.0 for s in scores) / len(scores), "eval/reward_mean": sum(scores) / len(scores),
            "eval/finished": sum(finished) / len(finished),
            "eval/accuracy_of_finished": correct_finished / max(1, sum(finished))}
