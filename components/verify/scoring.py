"""Scoring: a table of rollouts scored against its tasks, and greedy evaluation on held-out tasks
(the same reward, the explorer's engine decoding greedily)."""

from __future__ import annotations

import pyarrow as pa

from rftflow.components.data.tasksets import Task
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.verify.rewards import RewardFn


def reward_of(response: str, step_rewards, task: Task, reward_fn: RewardFn, reward_name: str) -> float:
    """A response's (or an episode's) reward: with ``env_return`` the episode's return in its
    environment (the sum of its step rewards), else ``reward_fn`` on the (final) response."""
    if reward_name == "env_return":
        return float(sum(step_rewards or ()))
    return reward_fn(response, task)


def score(table: pa.Table, tasks_by_id: dict[str, Task], reward_fn: RewardFn, reward_name: str) -> pa.Table:
    """Fill ``reward`` and ``rewards`` by scoring each row against its task (``reward_of``)."""
    steps = table.column("step_rewards").to_pylist() if reward_name == "env_return" else [None] * table.num_rows
    rewards = [reward_of(resp, s, tasks_by_id[tid], reward_fn, reward_name) for resp, s, tid in
               zip(table.column("response").to_pylist(), steps, table.column("task_id").to_pylist())]
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
    reward, the share of responses that ended within ``max_new_tokens`` (``accuracy/finished``) and
    the accuracy of those (``accuracy/of_finished``, 0 when none did) — a chatty model's
    answer cut off by the budget fails whatever its arithmetic, so the two split format from skill."""
    finished: list[bool] = []
    scores = greedy_scores(engine, tasks, reward_fn, max_new_tokens, finished)
    correct_finished = sum(s >= 1.0 and f for s, f in zip(scores, finished))
    return {"accuracy/held_out": sum(s >= 1.0 for s in scores) / len(scores), "accuracy/reward_mean": sum(scores) / len(scores),
            "accuracy/finished": sum(finished) / len(finished),
            "accuracy/of_finished": correct_finished / max(1, sum(finished))}
