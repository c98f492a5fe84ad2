"""Rewards: response text + task → a score in [0, 1], chosen per task by its domain (``Rewards``).

- ``score_answer``: the reasoning-gym dataset's own verifier (``Dataset.score_answer``); for file
  tasksets, which have no verifier, exact match.
- ``exact_match``: 1.0 if the stripped response equals the stripped gold answer, else 0.0.
- ``env_return``: an episode's return in its environment (``scoring.reward_of`` sums its step rewards).
- ``code``: the response's program against the task's tests in a sandbox (``verify.code``).
- ``judge``: an LLM's grade by a rubric, through an OpenAI-compatible endpoint (``verify.judge``).
- ``reward_model``: a sequence-classification model's score of (prompt, response) (``verify.reward_model``).
- ``format``: 1 if the stripped response matches ``reward.format.pattern``; also mixed into every
  reward by ``reward.format.weight``.
- ``math``: ``math_verify`` on the answer after a GSM8K-style ``####`` when the response has one.
- ``math_verify``: 1.0 if the final answer of a free-form response ("47 + 38 = 85.", "\\boxed{85}")
  equals the gold answer mathematically (the ``math-verify`` package: ``verify(parse(gold),
  parse(response))``), else 0.0. For chatty instruct models. When the gold answer is a number,
  the response's final answer must be a number too: math-verify evaluates expressions, so
  "47 + 38" would equal 85 and restating the question would score 1 (a policy learns that in a
  few rounds).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from rftflow.components.config import RewardConfig, TasksetConfig
from rftflow.components.data.tasksets import REASONING_GYM_PREFIX, Task
from rftflow.components.verify.scores import RewardUnavailable, Score

RewardFn = Callable[[str, Task], float]


def exact_match(response: str, task: Task) -> float:
    return float(response.strip() == task.answer.strip())


# math-verify warns on every call that its timeouts are off; they are, on purpose (below)
logging.getLogger("math_verify").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> list:
    """math-verify's reading of ``text`` (a gold answer is read once for its whole group). No
    timeouts: math-verify's use signal.alarm, which only works in the main thread."""
    from math_verify import parse

    return parse(text, parsing_timeout=None)


def _number(parsed: list) -> bool:
    """math-verify's reading is a number as written: a sympy number ("85", "-7", "3.5",
    "\\frac{1}{2}") or a fraction of integers ("1/2"), not an expression to evaluate ("47 + 38")."""
    return bool(getattr(parsed[0], "is_Number", False)) or re.fullmatch(r"-?\d+\s*/\s*\d+", str(parsed[-1]).strip()) is not None


def math_verify(response: str, task: Task) -> float:
    from math_verify import verify

    answer, gold = _parsed(response), _parsed(task.answer)
    if not answer or (gold and _number(gold) and not _number(answer)):
        return 0.0
    return float(verify(gold, answer, timeout_seconds=None))


def math_answer(response: str, task: Task) -> float:
    """``math_verify`` on the answer after the response's last GSM8K-style ``####`` (the whole
    response without one: math-verify finds a ``\\boxed{}`` or final number itself)."""
    marker = response.rfind("####")
    return math_verify(response[marker + 4:] if marker >= 0 else response, task)


class FunctionReward:
    """A reward computed in this process, one response at a time: ``fn(response, task) -> float``."""

    def __init__(self, name: str, fn: RewardFn):
        self.name, self.fn = name, fn

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        return [Score(float(self.fn(r, t))) for r, t in zip(responses, tasks)]


def format_reward(pattern: str) -> RewardFn:
    compiled = re.compile(pattern, re.DOTALL)
    return lambda response, task: float(compiled.fullmatch(response.strip()) is not None)


def _reward(name: str, cfg: RewardConfig, taskset_source: str):
    """The reward ``name`` (a ``FunctionReward`` or ``CodeReward``) for tasks from ``taskset_source``."""
    if name == "code":
        from rftflow.components.verify.code import CodeReward

        return CodeReward(cfg.code)
    if name == "judge":
        from rftflow.components.verify.judge import JudgeReward

        return JudgeReward(cfg.judge)
    if name == "reward_model":
        from rftflow.components.verify.reward_model import RewardModelReward

        return RewardModelReward(cfg.reward_model)
    if name == "format":
        return FunctionReward(name, format_reward(cfg.format.pattern))
    functions = {"exact_match": exact_match, "math_verify": math_verify, "math": math_answer,
                 # scored from the episode's step rewards (``scoring.reward_of``), not its text
                 "env_return": lambda response, task: 0.0}
    if name in functions:
        return FunctionReward(name, functions[name])
    if name == "score_answer":
        if not taskset_source.startswith(REASONING_GYM_PREFIX):
            return FunctionReward(name, exact_match)
        import reasoning_gym

        dataset = taskset_source[len(REASONING_GYM_PREFIX):]
        if dataset == "composite":  # each task by the verifier of the dataset it came from
            verifier_of = functools.lru_cache(maxsize=None)(reasoning_gym.get_score_answer_fn)
            return FunctionReward(name, lambda response, task: float(verifier_of(task.metadata["source_dataset"])(
                response.strip(), task.entry)))
        verifier = reasoning_gym.get_score_answer_fn(dataset)
        return FunctionReward(name, lambda response, task: float(verifier(response.strip(), task.entry)))
    raise ValueError(f"unknown reward function {name!r}")


class Rewards:
    """The campaign's rewards: each task scored by its mixture part's reward if it has one, else its
    domain's (``reward.domains``; a task's ``domain`` field, else its taskset's), else the default
    (``reward.function``), with the format reward mixed in by ``reward.format.weight``.

    ``score_many`` gives a ``Score`` per response (None-valued where the reward's infrastructure
    failed); calling it on one response gives its value and raises ``RewardUnavailable`` instead."""

    def __init__(self, cfg: RewardConfig, taskset: TasksetConfig,
                 parts: dict[str, tuple[TasksetConfig, str | None]] | None = None):
        self.name, self.cfg, self.taskset, self.parts = cfg.function, cfg, taskset, parts or {}
        self._rewards: dict[tuple[str, str | None], object] = {}
        for part_taskset, name in self.parts.values() or [(taskset, None)]:  # made now: a bad setting fails here
            for reward in [name] if name else {cfg.function, *cfg.domains.values()}:
                self._reward(reward, part_taskset.source)
        self.format = format_reward(cfg.format.pattern) if cfg.format.weight > 0 else None

    def _reward(self, name: str, source: str):
        key = (name, source if name == "score_answer" else None)  # only the verifier depends on the source
        if key not in self._rewards:
            self._rewards[key] = _reward(name, self.cfg, source)
        return self._rewards[key]

    @property
    def by_name(self) -> dict[str, object]:
        """The rewards by name (``score_answer``: the campaign taskset's)."""
        return {name: r for (name, source), r in self._rewards.items() if source in (None, self.taskset.source)}

    def reward_of(self, task: Task) -> tuple[str, str]:
        """(reward name, taskset source) that score ``task``."""
        taskset, name = self.parts.get(task.metadata.get("taskset"), (self.taskset, None))
        if name:
            return name, taskset.source
        domain = task.metadata.get("domain") or taskset.domain
        return (self.cfg.domains.get(domain, self.name) if domain else self.name), taskset.source

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        out: list[Score | None] = [None] * len(responses)
        by_reward: dict[tuple[str, str], list[int]] = {}
        for i, task in enumerate(tasks):
            by_reward.setdefault(self.reward_of(task), []).append(i)
        for (name, source), rows in by_reward.items():
            scores = self._reward(name, source).score_many([responses[i] for i in rows], [tasks[i] for i in rows])
            for i, score in zip(rows, scores):
                out[i] = score
        if self.format is not None:
            w = self.cfg.format.weight
            out = [s if s.value is None else Score((1 - w) * s.value + w * self.format(r, t), s.reason)
                   for s, r, t in zip(out, responses, tasks)]
        return out

    def __call__(self, response: str, task: Task) -> float:
        score = self.score_many([response], [task])[0]
        if score.value is None:
            raise RewardUnavailable(score.reason)
        return score.value

    def close(self) -> None:
        for reward in self._rewards.values():
            if hasattr(reward, "close"):
                reward.close()


def make_rewards(cfg: RewardConfig, taskset: TasksetConfig,
                 parts: dict[str, tuple[TasksetConfig, str | None]] | None = None) -> Rewards:
    """The rewards of a campaign whose tasks come from ``taskset`` (or the mixture ``parts``: name →
    (its taskset, its reward or None))."""
    return Rewards(cfg, taskset, parts)


def campaign_rewards(cfg) -> Rewards:
    """The rewards of campaign config ``cfg`` (its taskset, or its mixture's parts)."""
    tasksets = cfg.part_tasksets()
    return make_rewards(cfg.reward, cfg.taskset, {p.name: (tasksets[p.name], p.reward) for p in cfg.mixture})


def check_rewards(cfg: RewardConfig, extra: tuple[str, ...] = ()) -> None:
    """Fail fast (``ValueError``, one line) where a configured reward cannot work here: the code
    reward's sandbox is set up and runs a trivial program (``reward.code.sandbox: none`` opts out).
    ``extra``: rewards named elsewhere (a mixture part's)."""
    if "code" not in {cfg.function, *cfg.domains.values(), *extra}:
        return
    from rftflow.components.verify.code import CodeReward
    from rftflow.components.verify.sandbox import SandboxUnavailable

    try:
        reward = CodeReward(cfg.code)
        try:
            reward.sandbox.check()
        finally:
            reward.close()
    except SandboxUnavailable as e:
        raise ValueError(f"reward.code: {e}") from None
    if cfg.code.sandbox == "none":
        logging.getLogger("rftflow").warning("reward.code.sandbox is none: programs run without a sandbox")
