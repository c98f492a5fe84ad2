"""Greedy evaluation on held-out tasks: each task answered greedily (one response, or one episode of
a workflow) and scored by its own reward; accuracy (``is_correct``: the task's own reward at its
threshold, never the combined total), the mean reward, the share that finished; a mixture's metrics.

Written against protocols, not classes: an engine's ``generate(prompts, n=, max_new_tokens=,
greedy=)`` giving per prompt rollouts with ``text`` and ``finished``; a reward called as
``reward_fn(response, task)``, or with ``score_many(responses, tasks)`` giving ``Score``s, and
optionally ``reward_of(task)`` naming the reward that scores a task; an episode with ``text``,
``step_rewards``, ``task``, ``finished``, ``model_turns`` and ``tool_calls``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rftflow.components.data.images import images_argument
from rftflow.components.data.tasksets import Task, by_part
from rftflow.components.evaluation.verdicts import RewardUnavailable, Score, is_correct


@dataclass(frozen=True)
class Answer:
    """One held-out task's greedy answer (an episode's final text) and its reward: what an evaluation
    shows of itself (``shown_answers``)."""

    task: Task
    text: str
    reward: float


def reward_name_of(task: Task, reward_fn, reward_name: str) -> str:
    """The name of the reward that scores ``task``: its domain's or mixture part's (``Rewards.reward_of``),
    else ``reward_name``."""
    return reward_fn.reward_of(task)[0] if hasattr(reward_fn, "reward_of") else reward_name


def reward_of(response: str, step_rewards, task: Task, reward_fn, reward_name: str) -> float:
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


def greedy_scores(engine, tasks: list[Task], reward_fn, max_new_tokens: int,
                  finished: list[bool] | None = None, texts: list[str] | None = None) -> list[float]:
    """The reward of each task's greedy response, in task order (and, into ``finished``, whether
    each response ended with EOS within ``max_new_tokens``; into ``texts``, the responses). A
    reward that could not be computed raises ``RewardUnavailable``: an evaluation is never scored
    on a failed sandbox or judge."""
    groups = engine.generate([t.prompt for t in tasks], **images_argument(tasks), n=1,
                             max_new_tokens=max_new_tokens, greedy=True)
    if finished is not None:
        finished.extend(g[0].finished for g in groups)
    if texts is not None:
        texts.extend(g[0].text for g in groups)
    return scored_values([g[0].text for g in groups], tasks, reward_fn)


def scored_values(responses: list[str], tasks: list[Task], reward_fn) -> list[float]:
    """Each response's reward against its task (``score_all``); ``RewardUnavailable`` when one could
    not be computed: an evaluation is never scored on a failed sandbox or judge."""
    scores = score_all(responses, tasks, reward_fn)
    failed = next((s for s in scores if s.value is None), None)
    if failed is not None:
        raise RewardUnavailable(f"evaluation: a reward could not be computed ({failed.reason})")
    return [s.value for s in scores]


def accuracy(scores: Sequence[float], finished: Sequence[bool]) -> dict[str, float]:
    """``accuracy/held_out`` = share of correct responses, ``accuracy/reward_mean`` (the total), the
    share of responses that ended within the token budget (``accuracy/finished``) and the accuracy
    of those (``accuracy/of_finished``, 0 when none did) — a chatty model's answer cut off by the
    budget fails whatever its arithmetic, so the two split format from skill."""
    n = max(1, len(scores))
    correct = [is_correct(s) for s in scores]
    return {"accuracy/held_out": sum(correct) / n, "accuracy/reward_mean": sum(scores) / n,
            "accuracy/finished": sum(finished) / n,
            "accuracy/of_finished": sum(c and f for c, f in zip(correct, finished)) / max(1, sum(finished))}


def evaluate(engine, tasks: list[Task], reward_fn, max_new_tokens: int,
             answers: list[Answer] | None = None) -> dict[str, float]:
    """``accuracy`` of one greedy response per held-out task (``greedy_scores``); each task's
    ``Answer`` into ``answers``."""
    finished: list[bool] = []
    texts: list[str] = []
    scores = greedy_scores(engine, tasks, reward_fn, max_new_tokens, finished, texts)
    if answers is not None:
        answers.extend(map(Answer, tasks, texts, scores))
    return accuracy(scores, finished)


def episode_scores(episodes: Sequence[Any], reward_fn, reward_name: str) -> list[float]:
    """Each episode's reward (``reward_of``: its return, or the reward on its final answer)."""
    return [reward_of(e.text, e.step_rewards, e.task, reward_fn, reward_name) for e in episodes]


def evaluate_episodes(episodes: Sequence[Any], reward_fn, reward_name: str,
                      answers: list[Answer] | None = None) -> dict[str, float]:
    """``accuracy`` of greedy episodes, with the model turns and tool calls per episode; each
    episode's ``Answer`` (its final text) into ``answers``."""
    n = max(1, len(episodes))
    scores = episode_scores(episodes, reward_fn, reward_name)
    if answers is not None:
        answers.extend(Answer(e.task, e.text, s) for e, s in zip(episodes, scores))
    return {**accuracy(scores, [e.finished for e in episodes]),
            "accuracy/turns_mean": sum(e.model_turns for e in episodes) / n,
            "accuracy/tool_calls": sum(e.tool_calls for e in episodes) / n}


def mixture_metrics(results: dict[str, tuple[int, dict[str, float]]]) -> dict[str, float]:
    """A mixture's evaluation from each part's (held-out tasks, metrics): each part's as
    ``accuracy/<part>/<metric>``, and every metric over all parts' tasks (task-weighted means)."""
    total = sum(n for n, _ in results.values())
    out: dict[str, float] = {}
    for name, (n, metrics) in results.items():
        for key, value in metrics.items():
            out[f"accuracy/{name}/{key.removeprefix('accuracy/')}"] = value
            out[key] = out.get(key, 0.0) + value * n / total
    return out


def held_out(tasks: list[Task], evaluate, *, mixture: bool) -> dict[str, float]:
    """The held-out evaluation of ``tasks``: ``evaluate(part, tasks) -> metrics`` (``part``: a
    mixture part's name, None without a mixture) on all of them, or, in a ``mixture``, on each
    part's tasks and combined by ``mixture_metrics``."""
    if not mixture:
        return evaluate(None, tasks)
    return mixture_metrics({name: (len(rows), evaluate(name, [tasks[i] for i in rows]))
                            for name, rows in by_part(tasks).items()})
