"""The workflow interface: tasks + engine → groups of episodes → experience rows.

A workflow's ``run(tasks, engine, n=, …)`` returns, per task, ``n`` episodes (a GRPO group: the
episodes of one task). ``explore`` turns them into experience rows, ``experts`` gives the expert
episodes it can make (demonstrations), ``evaluate`` scores greedy episodes on held-out tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import pyarrow as pa

from rftflow.components.config import WorkflowConfig
from rftflow.components.data.experience import experience_id, make_experience, to_table
from rftflow.components.data.tasksets import Task
from rftflow.components.evaluation.greedy import episode_scores, evaluate_episodes
from rftflow.components.explore.engines import Rollout
from rftflow.components.explore.workflows.episodes import ChatFormat, Episode, run_episodes


@dataclass
class Sampling:
    max_new_tokens: int
    temperature: float = 1.0
    greedy: bool = False


class Workflow(ABC):
    """Base of the built-in workflows; subclasses implement ``run`` (and ``experts`` when they can)."""

    name = "workflow"

    def __init__(self, cfg: WorkflowConfig, tokenizer, *, chat_template: bool = False,
                 domain: str | None = None, context_limit: int | None = None):
        self.cfg, self.tokenizer, self.chat_template = cfg, tokenizer, chat_template
        self.domain, self.context_limit = domain, context_limit
        self.env_wall_seconds = 0.0  # of the last ``run``: wall-clock time in the environments' steps
        self.format = ChatFormat(tokenizer, chat_template)  # how the environment's turns become ids

    @abstractmethod
    def run(self, tasks: list[Task], engine, *, n: int, sampling: Sampling) -> list[list[Episode]]:
        """``n`` episodes per task (a group each), in task order."""

    def experts(self, tasks: list[Task], engine) -> list[Episode]:
        """One expert episode per task this workflow can demonstrate (none by default)."""
        return []

    def step_episodes(self, groups: list[list[Episode]], engine, sampling: Sampling, act) -> list[list[Episode]]:
        """``run_episodes`` over every episode of ``groups`` with this workflow's limits; the groups."""
        self.env_wall_seconds = run_episodes(
            engine, [e for g in groups for e in g], act, max_turns=self.cfg.max_turns, max_tokens=self.cfg.max_tokens,
            max_new_tokens=sampling.max_new_tokens, temperature=sampling.temperature, greedy=sampling.greedy,
            context_limit=self.context_limit, episode_seconds=self.cfg.episode_seconds)
        return groups

    def expert_turn(self, episode: Episode, text: str) -> None:
        """A demonstrated model turn: ``text`` and EOS (tokenised: an expert is not the engine)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        episode.add_model_turn(Rollout(episode.context, ids, [0.0] * len(ids), text, True))

    # rows ------------------------------------------------------------------------------------
    def explore(self, engine, tasks: list[Task], *, campaign: str, round_no: int, repeat_times: int,
                temperature: float, max_new_tokens: int, model_version: int, first_slot: int = 0) -> pa.Table:
        """``repeat_times`` episodes per task (one group per task, ids numbered from ``first_slot``),
        unscored (reward null)."""
        groups = self.run(tasks, engine, n=repeat_times, sampling=Sampling(max_new_tokens, temperature))
        rows = []
        for slot, (task, group) in enumerate(zip(tasks, groups), start=first_slot):
            group_id = f"r{round_no}-g{slot}-{task.task_id}"
            for k, episode in enumerate(group):
                rows.append(self.row(episode, experience_id(campaign, round_no, group_id, k), campaign=campaign,
                                     round=round_no, group_id=group_id, source="explorer",
                                     model_version=model_version))
        return to_table(rows)

    def expert_table(self, engine, tasks: list[Task], *, campaign: str, limit: int | None = None) -> pa.Table:
        """The expert episodes of the first ``limit`` distinct tasks, as ``expert`` rows (reward 1)."""
        distinct = list({t.task_id: t for t in tasks}.values())[:limit]
        rows = [self.row(e, experience_id(campaign, "expert", e.task.task_id), campaign=campaign, round=0,
                         group_id=f"expert-{e.task.task_id}", source="expert", model_version=0, reward=1.0,
                         rewards={"expert": 1.0}, logprobs=False)
                for e in self.experts(distinct, engine) if not e.error]
        return to_table(rows)

    def row(self, episode: Episode, exp_id: str, *, logprobs: bool = True, **fields) -> dict:
        task = episode.task
        return make_experience(
            experience_id=exp_id, task_id=task.task_id, prompt=task.prompt, response=episode.text,
            prompt_ids=episode.prompt_ids, response_ids=episode.ids,
            response_logprobs=episode.logprobs if logprobs else None, response_mask=episode.mask,
            info=episode.info(), turns=episode.turns, step_rewards=episode.step_rewards if episode.turns else None,
            domain=self.domain, **fields)

    # evaluation ------------------------------------------------------------------------------
    def greedy_episodes(self, engine, tasks: list[Task], max_new_tokens: int) -> list[Episode]:
        return [g[0] for g in self.run(tasks, engine, n=1, sampling=Sampling(max_new_tokens, greedy=True))]

    def greedy_scores(self, engine, tasks: list[Task], reward_fn, reward_name: str, max_new_tokens: int) -> list[float]:
        """The reward of each task's greedy episode, in task order (promotion compares these)."""
        return episode_scores(self.greedy_episodes(engine, tasks, max_new_tokens), reward_fn, reward_name)

    def evaluate(self, engine, tasks: list[Task], reward_fn, reward_name: str, max_new_tokens: int,
                 answers: list | None = None) -> dict[str, float]:
        """Greedy episodes on ``tasks`` (``evaluation.greedy.evaluate_episodes``): the share correct, the
        mean reward, the share that finished, the model turns and tool calls per episode; each
        episode's ``Answer`` into ``answers``."""
        return evaluate_episodes(self.greedy_episodes(engine, tasks, max_new_tokens), reward_fn, reward_name, answers)


def episode_metrics(infos: list[dict]) -> dict[str, float]:
    """Over multi-turn episodes (their ``info``): ``episode/turns_mean``, ``episode/success`` (share),
    ``episode/timeouts`` and ``episode/errors`` (counts), ``tool/calls`` and ``tool/errors`` (per
    episode), ``episode/env_seconds`` (total time in the environment); {} for single answers."""
    multi = [i for i in infos if "turns" in i]
    if not multi:
        return {}
    n = len(multi)
    return {f"episode/turns_mean": sum(i["turns"] for i in multi) / n,
            f"episode/success": sum(bool(i["success"]) for i in multi) / n,
            f"episode/timeouts": float(sum(bool(i["timed_out"]) for i in multi)),
            f"episode/errors": float(sum("error" in i for i in multi)),
            f"tool/calls": sum(i["tool_calls"] for i in multi) / n,
            f"tool/errors": sum(i["tool_errors"] for i in multi) / n,
            f"episode/env_seconds": sum(i["env_seconds"] for i in multi)}


def table_episode_metrics(table: pa.Table) -> dict[str, float]:
    """``episode_metrics`` of an experience table's rows (their ``info`` JSON)."""
    import json

    return episode_metrics([json.loads(i or "{}") for i in table.column("info").to_pylist()])
