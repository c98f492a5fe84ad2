"""Scoring: a table of rollouts scored against its tasks, and greedy evaluation on held-out tasks
(the same reward, the explorer's engine decoding greedily)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.data.images import images_argument
from rftflow.components.data.tasksets import Task
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.verify.rewards import Graded, RewardFn, is_correct
from rftflow.components.verify.scores import RewardUnavailable, Score
from rftflow.components.verify.shaping import shaping_terms


def reward_name_of(task: Task, reward_fn: RewardFn, reward_name: str) -> str:
    """The name of the reward that scores ``task``: its domain's or mixture part's (``Rewards.reward_of``),
    else ``reward_name``."""
    return reward_fn.reward_of(task)[0] if hasattr(reward_fn, "reward_of") else reward_name


def reward_of(response: str, step_rewards, task: Task, reward_fn: RewardFn, reward_name: str) -> float:
    """A response's (or an episode's) reward: with ``env_return`` the episode's return in its
    environment (the sum of its step rewards), else ``reward_fn`` on the (final) response."""
    if reward_name_of(task, reward_fn, reward_name) == "env_return":
        return float(sum(step_rewards or ()))
    return reward_fn(response, task)


def score_all(responses: list[str], tasks: list[Task], reward_fn) -> list[Score]:
    """Each response's ``Score`` against its task: in one batch where the reward takes one
    (``Rewards.score_many``: code runs on the sandbox pool), else one call each."""
    if hasattr(reward_fn, "score_many"):
        return reward_fn.score_many(responses, tasks)
    return [Score(float(reward_fn(r, t))) for r, t in zip(responses, tasks)]


def score(table: pa.Table, tasks_by_id: dict[str, Task], reward_fn: RewardFn, reward_name: str) -> pa.Table:
    """Fill ``reward`` and ``rewards`` by scoring each row against its task (``reward_of``); a
    score's reason goes into the row's ``info`` (``reward_reason``). ``rewards`` holds each term's
    value (the task's own reward by its name, ``reward.combine``'s terms, the length shaping's),
    ``reward`` their total. A row whose reward could not be computed gets a null reward and
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


def greedy_scores(engine: HFRolloutEngine, tasks: list[Task], reward_fn: RewardFn, max_new_tokens: int,
                  finished: list[bool] | None = None) -> list[float]:
    """The reward of each task's greedy response, in task order (and, into ``finished``, whether
    each response ended with EOS within ``max_new_tokens``). A reward that could not be computed
    raises ``RewardUnavailable``: an evaluation is never scored on a failed sandbox or judge."""
    groups = engine.generate([t.prompt for t in tasks], **images_argument(tasks), n=1,
                             max_new_tokens=max_new_tokens, greedy=True)
    if finished is not None:
        finished.extend(g[0].finished for g in groups)
    scores = score_all([g[0].text for g in groups], tasks, reward_fn)
    failed = next((s for s in scores if s.value is None), None)
    if failed is not None:
        raise RewardUnavailable(f"evaluation: a reward could not be computed ({failed.reason})")
    return [s.value for s in scores]


def evaluate(engine: HFRolloutEngine, tasks: list[Task], reward_fn: RewardFn, max_new_tokens: int) -> dict[str, float]:
    """Greedy decoding on held-out tasks: accuracy = share of correct responses (``is_correct``: the
    task's own reward at least its threshold, never the combined total), the mean reward (total),
    the share of responses that ended within ``max_new_tokens`` (``accuracy/finished``) and
    the accuracy of those (``accuracy/of_finished``, 0 when none did) — a chatty model's
    answer cut off by the budget fails whatever its arithmetic, so the two split format from skill."""
    finished: list[bool] = []
    scores = greedy_scores(engine, tasks, reward_fn, max_new_tokens, finished)
    correct = [is_correct(s) for s in scores]
    correct_finished = sum(c and f for c, f in zip(correct, finished))
    return {"accuracy/held_out": sum(correct) / len(scores), "accuracy/reward_mean": sum(scores) / len(scores),
            "accuracy/finished": sum(finished) / len(finished),
            "accuracy/of_finished": correct_finished / max(1, sum(finished))}


def mixture_metrics(results: dict[str, tuple[int, dict[str, float]]]) -> dict[str, float]:
    """A mixture's evaluation from each part's (held-out tasks, ``evaluate`` metrics): each part's
    as ``accuracy/<part>/<metric>``, and every metric over all parts' tasks (task-weighted means)."""
    total = sum(n for n, _ in results.values())
    out: dict[str, float] = {}
    for name, (n, metrics) in results.items():
        for key, value in metrics.items():
            out[f"accuracy/{name}/{key.removeprefix('accuracy/')}"] = value
            out[key] = out.get(key, 0.0) + value * n / total
    return out
