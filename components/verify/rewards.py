"""Rewards: response text + task → a score in [0, 1], chosen per task by its domain (``Rewards``).

- ``score_answer``: the reasoning-gym dataset's own verifier (``Dataset.score_answer``); for file
  tasksets, which have no verifier, exact match.
- ``exact_match``: 1.0 if the stripped response equals the stripped gold answer, else 0.0.
- ``env_return``: an episode's return in its environment (``evaluation.greedy.reward_of`` sums its step rewards).
- ``code``: the response's program against the task's tests in a sandbox (``verify.code``).
- ``judge``: an LLM's grade by a rubric, through an OpenAI-compatible endpoint (``verify.judge``).
- ``reward_model``: a sequence-classification model's score of (prompt, response) (``verify.reward_model``).
- ``format``: 1 if the stripped response matches ``reward.format.pattern``.
- ``math``: ``math_verify`` on the answer after a GSM8K-style ``####`` when the response has one.
- ``math_verify``: 1.0 if the final answer of a free-form response ("47 + 38 = 85.", "\\boxed{85}")
  equals the gold answer mathematically (the ``math-verify`` package: ``verify(parse(gold),
  parse(response))``), else 0.0. For chatty instruct models. When the gold answer is a number,
  the response's final answer must be a number too: math-verify evaluates expressions, so
  "47 + 38" would equal 85 and restating the question would score 1 (a policy learns that in a
  few rounds).
- ``vision``: the whole response is the picture's short answer, a number equal as a number
  (``verify.vision``).
- ``package.module:name``: a team's own reward (``verify.imported``).

A task's own reward (its mixture part's, else its domain's, else ``reward.function``) is its
correctness reward: a response is correct when it reaches ``reward.correct_at`` (accuracy and
promotion read that, never the total). ``reward.combine`` sums weighted terms into the total.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable

from rftflow.components.config import IMPORT_PATH, RewardConfig, TasksetConfig, reward_label
from rftflow.components.data.tasksets import REASONING_GYM_PREFIX, Task
from rftflow.components.evaluation.verdicts import Graded, is_correct  # is_correct: read from here too
from rftflow.components.verify.imported import ImportedReward, RewardLoadError
from rftflow.components.verify.scores import RewardUnavailable, Score
from rftflow.components.verify.shaping import shaping_range

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

    range = (0.0, 1.0)
    correct_at = 1.0

    def __init__(self, name: str, fn: RewardFn):
        self.name, self.fn = name, fn

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        return [Score(float(self.fn(r, t))) for r, t in zip(responses, tasks)]


def format_reward(pattern: str) -> RewardFn:
    compiled = re.compile(pattern, re.DOTALL)
    return lambda response, task: float(compiled.fullmatch(response.strip()) is not None)


def _reward(name: str, cfg: RewardConfig, taskset_source: str, options: dict | None = None):
    """The reward ``name`` (a built-in's or an import path) for tasks from ``taskset_source``; an import
    path's class is made with ``options`` (default ``reward.options``)."""
    if IMPORT_PATH.fullmatch(name):
        return ImportedReward(name, cfg.options if options is None else options, timeout_seconds=cfg.timeout_seconds,
                              workers=cfg.workers)
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
    from rftflow.components.verify.vision import vision_answer

    functions = {"exact_match": exact_match, "math_verify": math_verify, "math": math_answer, "vision": vision_answer,
                 # scored from the episode's step rewards (``evaluation.greedy.reward_of``), not its text
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


# What a built-in's values span (None: unbounded, the contract's bounds apply) and from where it counts as correct.
RANGES = {"env_return": None}
CORRECT_AT = {"reward_model": 0.5}  # a classifier's sigmoid: its decision boundary (logit 0)


def declared_range(name: str, reward) -> tuple[float, float] | None:
    return RANGES.get(name, getattr(reward, "range", (0.0, 1.0)))


class Rewards:
    """The campaign's rewards: each task scored by its own reward — its mixture part's if it has
    one, else its domain's (``reward.domains``; a task's ``domain`` field, else its taskset's), else
    the default (``reward.function``) — and the terms of ``reward.combine`` (or the deprecated
    ``reward.format.weight``), total = Σ weight · value.

    ``score_many`` gives a ``Score`` per response (None-valued where a reward's infrastructure
    failed; else a ``Graded`` total); calling it on one response gives its value and raises
    ``RewardUnavailable`` instead. ``shaping`` and ``max_new_tokens`` are for the round's length
    shaping (``verify.shaping``, applied to explorer rows by ``scoring.score``)."""

    def __init__(self, cfg: RewardConfig, taskset: TasksetConfig,
                 parts: dict[str, tuple[TasksetConfig, str | None]] | None = None, max_new_tokens: int = 16):
        self.name, self.cfg, self.taskset, self.parts = cfg.function, cfg, taskset, parts or {}
        self.shaping, self.max_new_tokens = cfg.shaping, max_new_tokens
        self._rewards: dict[tuple[str, str | None], object] = {}
        self.terms: list[tuple[str, float, object | None]] = []  # (name, weight, reward; None: the task's own)
        try:  # made now: a bad setting fails here
            for part_taskset, name in self.parts.values() or [(taskset, None)]:
                for reward in [name] if name else {cfg.function, *cfg.domains.values()}:
                    self._reward(reward, part_taskset.source)
            for term in cfg.terms():
                own = term.reward == "task"
                made = None if own else _reward(term.reward, cfg, taskset.source, term.options)
                self.terms.append((term.label, term.weight, made))
        except BaseException:
            self.close()
            raise

    def _reward(self, name: str, source: str):
        key = (name, source if name == "score_answer" else None)  # only the verifier depends on the source
        if key not in self._rewards:
            self._rewards[key] = _reward(name, self.cfg, source)
        return self._rewards[key]

    @property
    def by_name(self) -> dict[str, object]:
        """The tasks' own rewards by name (``score_answer``: the campaign taskset's)."""
        return {name: r for (name, source), r in self._rewards.items() if source in (None, self.taskset.source)}

    def reward_of(self, task: Task) -> tuple[str, str]:
        """(reward name, taskset source) that score ``task``."""
        taskset, name = self.parts.get(task.metadata.get("taskset"), (self.taskset, None))
        if name:
            return name, taskset.source
        domain = task.metadata.get("domain") or taskset.domain
        return (self.cfg.domains.get(domain, self.name) if domain else self.name), taskset.source

    def threshold(self, name: str) -> float:
        """From where the task reward ``name`` counts a response as correct: ``reward.correct_at``,
        else the reward's own (1; 0.5 for ``reward_model``; an import path's top value)."""
        if self.cfg.correct_at is not None:
            return self.cfg.correct_at
        return CORRECT_AT.get(name, getattr(self._reward(name, self.taskset.source), "correct_at", 1.0))

    @property
    def accuracy_rule(self) -> str:
        """What held-out accuracy counts, in words: ``share of responses with exact_match ≥ 1``."""
        names = sorted({name for name, _ in self._rewards})
        return "share of responses with " + " or ".join(f"{reward_label(n)} ≥ {self.threshold(n):g}" for n in names)

    @property
    def bounds(self) -> tuple[float, float] | None:
        """The least and most a row's total can be, from the declared ranges of the terms (and the
        shaping); None when a task's own reward is unbounded (``env_return``)."""
        ranges = [declared_range(name, r) for (name, _), r in self._rewards.items()]
        if any(r is None for r in ranges):
            return None
        own = (min(r[0] for r in ranges), max(r[1] for r in ranges))
        low = high = 0.0
        for _, weight, reward in self.terms or [("task", 1.0, None)]:
            span = own if reward is None else reward.range
            low, high = low + min(weight * span[0], weight * span[1]), high + max(weight * span[0], weight * span[1])
        shaped = shaping_range(self.shaping)
        return low + shaped[0], high + shaped[1]

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        own: list[Score | None] = [None] * len(responses)
        names: list[str] = [""] * len(responses)
        by_reward: dict[tuple[str, str], list[int]] = {}
        for i, task in enumerate(tasks):
            by_reward.setdefault(self.reward_of(task), []).append(i)
        for (name, source), rows in by_reward.items():
            scores = self._reward(name, source).score_many([responses[i] for i in rows], [tasks[i] for i in rows])
            for i, score in zip(rows, scores):
                own[i], names[i] = score, name
        extra = {label: reward.score_many(responses, tasks) for label, _, reward in self.terms if reward is not None}
        out = []
        for i, score in enumerate(own):
            failed = score if score.value is None else next(
                (Score(None, f"{label}: {s[i].reason}") for label, s in extra.items() if s[i].value is None), None)
            if failed is not None:
                out.append(failed)
                continue
            values = {reward_label(names[i]): score.value, **{label: s[i].value for label, s in extra.items()}}
            total = (sum(w * (score.value if r is None else extra[label][i].value) for label, w, r in self.terms)
                     if self.terms else score.value)
            out.append(Score(Graded(total, score.value >= self.threshold(names[i]), values), score.reason))
        return out

    def __call__(self, response: str, task: Task) -> float:
        score = self.score_many([response], [task])[0]
        if score.value is None:
            raise RewardUnavailable(score.reason)
        return score.value

    def close(self) -> None:
        for reward in [*self._rewards.values(), *(r for _, _, r in self.terms if r is not None)]:
            if hasattr(reward, "close"):
                reward.close()


def make_rewards(cfg: RewardConfig, taskset: TasksetConfig,
                 parts: dict[str, tuple[TasksetConfig, str | None]] | None = None, max_new_tokens: int = 16) -> Rewards:
    """The rewards of a campaign whose tasks come from ``taskset`` (or the mixture ``parts``: name →
    (its taskset, its reward or None))."""
    return Rewards(cfg, taskset, parts, max_new_tokens)


def campaign_rewards(cfg) -> Rewards:
    """The rewards of campaign config ``cfg`` (its taskset, or its mixture's parts)."""
    tasksets = cfg.part_tasksets()
    return make_rewards(cfg.reward, cfg.taskset, {p.name: (tasksets[p.name], p.reward) for p in cfg.mixture},
                        cfg.explorer.max_new_tokens)


_SAID: set[str] = set()


def check_rewards(cfg, samples: dict[str | None, list[Task]] | None = None) -> None:
    """Fail fast (``ValueError``, one line naming the reward) where a configured reward cannot work
    here: the code reward's sandbox is set up and runs a trivial program (``reward.code.sandbox:
    none`` opts out); a reward by import path imports, has a reward's signature and scores a
    sample task (``samples``: tasks by mixture part, None outside one) without failing. ``cfg`` is
    the campaign's config (or its ``reward`` section alone, outside a mixture)."""
    rc: RewardConfig = cfg if isinstance(cfg, RewardConfig) else cfg.reward
    if rc.format.weight > 0 and "format.weight" not in _SAID:
        _SAID.add("format.weight")
        logging.getLogger("rftflow").warning(
            "reward.format.weight is deprecated: it reads as reward.combine [{reward: task, weight: %g}, "
            "{reward: format, weight: %g}]", 1 - rc.format.weight, rc.format.weight)
    parts = {} if isinstance(cfg, RewardConfig) else {p.name: p.reward for p in cfg.mixture}
    used = rc.used(tuple(r for r in parts.values() if r))
    if "code" in used:
        _check_sandbox(rc)
        from rftflow.components.verify.code import check_code_tasks

        for part, part_tasks in (samples or {}).items():  # tests two sandboxes cannot run: refused, with why
            where = f"of mixture part {part}" if part else getattr(getattr(cfg, "taskset", None), "source", "")
            check_code_tasks(part_tasks, where)
    tasksets = {} if isinstance(cfg, RewardConfig) else {None: cfg.taskset, **cfg.part_tasksets()}

    def own(part: str | None, task: Task) -> str:  # as ``Rewards.reward_of`` picks a task's own reward
        if parts.get(part):
            return parts[part]
        domain = task.metadata.get("domain") or getattr(tasksets.get(part), "domain", None)
        return rc.domains.get(domain, rc.function) if domain else rc.function

    everyone = [ts[0] for ts in (samples or {}).values() if ts]
    imported = [(t.reward, t.options, everyone) for t in rc.terms() if IMPORT_PATH.fullmatch(t.reward)]
    for name in sorted(used - {t.reward for t in rc.terms()}):
        if IMPORT_PATH.fullmatch(name):  # a sample task it scores, if the samples hold one
            scored = next(([t] for part, ts in (samples or {}).items() for t in ts if own(part, t) == name), [])
            imported.append((name, rc.options, scored))
    for name, options, tasks in imported:
        try:
            reward = ImportedReward(name, options, timeout_seconds=rc.timeout_seconds, workers=rc.workers)
        except RewardLoadError as e:
            raise ValueError(str(e)) from None
        try:
            failed = next((s for s in reward.score_many([t.answer for t in tasks], tasks) if s.value is None), None)
        finally:
            reward.close()
        if failed is not None:
            raise ValueError(f"reward {name!r} on a sample task (its gold answer as the response): {failed.reason}")


def _check_sandbox(cfg: RewardConfig) -> None:
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
