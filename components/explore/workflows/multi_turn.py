"""``multi_turn``: turns in a gymnasium text environment (``workflow.environment``).

Each episode has its own environment instance: ``reset(seed=, options={"task": entry})``, whose
observation (when not empty) follows the task's prompt; then each model turn's text is the action
of ``step``, whose observation is appended as a ``user`` turn (mask 0) until the environment
terminates or truncates the episode, or a limit ends it. The step rewards are stored; the episode
succeeds when the environment's ``info["success"]`` says so (else: terminated with a positive reward).
"""

from __future__ import annotations

import hashlib

from rftflow.components.data.tasksets import Task
from rftflow.components.explore.environments import environment_factory
from rftflow.components.explore.workflows.base import Sampling, Workflow
from rftflow.components.explore.workflows.episodes import (Episode, EpisodeFailure, call_with_timeout,
                                                           finite_reward)


class MultiTurn(Workflow):
    name = "multi_turn"

    def __init__(self, cfg, tokenizer, **kwargs):
        super().__init__(cfg, tokenizer, **kwargs)
        self.make_env = environment_factory(cfg.environment, cfg.env_args)

    def _env_call(self, fn, what: str):
        try:
            return call_with_timeout(fn, self.cfg.timeout_seconds)
        except TimeoutError:
            raise _Timeout(f"the environment's {what} did not return within {self.cfg.timeout_seconds:g} s") from None
        except Exception as e:  # noqa: BLE001 — the environment's fault, the episode's reason
            raise EpisodeFailure(f"the environment's {what} raised {type(e).__name__}: {e}") from None

    def start(self, task: Task, k: int, engine) -> Episode:
        episode = Episode(task, engine.encode(task.prompt), turns=[])
        try:
            env = self.make_env()
            seed = int(hashlib.sha256(f"{task.task_id}/{k}".encode()).hexdigest()[:8], 16)
            result = self._env_call(lambda: env.reset(seed=seed, options={"task": task.entry}), "reset")
            if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str)):
                raise EpisodeFailure(f"the environment's reset returned {result!r:.200}, not (text, info)")
            if result[0]:
                episode.prompt_ids = engine.encode(f"{task.prompt}\n{result[0]}")
            episode.state = env
        except _Timeout as e:
            episode.fail(str(e), timed_out=True)
        except EpisodeFailure as e:
            episode.fail(str(e))
        return episode

    def act(self, episode: Episode) -> None:
        env = episode.state
        try:
            result = self._env_call(lambda: env.step(episode.text), "step")
        except _Timeout as e:
            episode.fail(str(e), timed_out=True)
            return
        if not (isinstance(result, tuple) and len(result) == 5 and isinstance(result[0], str)
                and isinstance(result[4], dict)):
            raise EpisodeFailure(f"the environment's step returned {result!r:.200}, not "
                                    "(text, reward, terminated, truncated, info)")
        observation, reward, terminated, truncated, info = result
        episode.step_rewards.append(finite_reward(reward))
        if terminated or truncated:
            episode.success = bool(info.get("success", bool(terminated) and reward > 0))
            episode.end(finished=bool(terminated))
            return
        episode.add_env_turn("user", observation, self.format.turn_ids("user", observation))

    def run(self, tasks: list[Task], engine, *, n: int, sampling: Sampling) -> list[list[Episode]]:
        return self.step_episodes([[self.start(task, k, engine) for k in range(n)] for task in tasks], engine,
                                  sampling, self.act)

    def experts(self, tasks: list[Task], engine) -> list[Episode]:
        """Winning episodes played by the environment's ``expert_action`` (none if it has none)."""
        if not hasattr(self.make_env(), "expert_action"):
            return []
        episodes = []
        for task in tasks:
            episode = self.start(task, 0, engine)
            while not episode.done and episode.model_turns < self.cfg.max_turns:
                self.expert_turn(episode, episode.state.expert_action())
                try:
                    self.act(episode)
                except EpisodeFailure as e:
                    episode.fail(str(e))
            if episode.success:
                episodes.append(episode)
        return episodes


class _Timeout(Exception):
    pass
