"""Episodes: an agent's turns on one task, token in / token out, and the loop that steps many at once.

An episode's context is its prompt ids followed by its response ids: every turn's ids in order,
the model's exactly as the engine returned them (``response_mask`` 1, with their behaviour
log-probs) and the environment's or tools' as the chat format renders them (mask 0, log-prob 0.0,
never trained on). Nothing is re-tokenised: a turn's ids are appended to the context the next
turn is generated from.

``run_episodes`` steps all live episodes together: each turn is one ``generate_ids`` call over
every live episode's context, then each episode's environment acts on its model turn (in threads,
each call bounded by a timeout). An episode ends when its environment says so, at
``max_turns`` model turns, at its token budget, or when its environment fails (raises, hangs
past the timeout, returns garbage): then ``error`` says why, and the episode is quarantined,
never scored as the policy's failure.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from rftflow.components.data.tasksets import Task
from rftflow.components.explore.engines import Rollout


class EpisodeFailure(RuntimeError):
    """The environment (or the episode's driver) failed; the message is the quarantine reason."""


@dataclass
class Episode:
    """One agent's attempt at ``task``; ``ids``/``mask``/``logprobs`` are the response (all turns)."""

    task: Task
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[dict[str, Any]] | None = None  # role, content, start, end; None: a single answer
    step_rewards: list[float] = field(default_factory=list)
    text: str = ""  # the last model turn's text: what a verifier scores
    done: bool = False
    finished: bool = False  # ended by the environment or with a final answer (not cut by a limit)
    success: bool = False
    error: str | None = None  # why the environment failed: the episode is quarantined
    timed_out: bool = False
    tool_calls: int = 0
    tool_errors: int = 0
    env_seconds: float = 0.0
    state: Any = None  # the workflow's own (an environment instance)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.ids

    @property
    def model_turns(self) -> int:
        return sum(t["role"] == "assistant" for t in self.turns or ())

    def add_model_turn(self, rollout: Rollout) -> None:
        self._add("assistant", rollout.text, rollout.response_ids, 1, rollout.logprobs)
        self.text = rollout.text

    def add_env_turn(self, role: str, content: str, ids: list[int]) -> None:
        self._add(role, content, ids, 0, [0.0] * len(ids))

    def _add(self, role: str, content: str, ids: list[int], mask: int, logprobs: list[float]) -> None:
        start = len(self.ids)
        self.ids += list(ids)
        self.mask += [mask] * len(ids)
        self.logprobs += list(logprobs)
        self.turns = (self.turns or []) + [{"role": role, "content": content, "start": start, "end": len(self.ids)}]

    def fail(self, reason: str, timed_out: bool = False) -> None:
        self.error, self.timed_out, self.done = reason, timed_out, True

    def end(self, finished: bool) -> None:
        self.done, self.finished = True, finished

    def info(self) -> dict[str, Any]:
        info = {"finished": self.finished}
        if self.turns is not None:
            info |= {"turns": self.model_turns, "success": self.success, "tool_calls": self.tool_calls,
                     "tool_errors": self.tool_errors, "timed_out": self.timed_out,
                     "env_seconds": round(self.env_seconds, 4)}
        if self.error:
            info["error"] = self.error
        return info


class ChatFormat:
    """How a turn that is not the model's becomes ids appended after the model's last token.

    With the chat template (instruct models): the ids the template puts between the end of an
    assistant message and the start of the next assistant message, with the new message (role
    ``user`` or ``tool``) in between — found by rendering a conversation with and without it,
    so any template works. Without (raw prompts, builtin:tiny): the content and a newline.
    """

    PROBE = "\x00probe\x00"

    def __init__(self, tokenizer: PreTrainedTokenizerBase, chat_template: bool):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        # the same observation recurs in every episode ("higher"): rendered and tokenised once
        self._rendered = functools.lru_cache(maxsize=4096)(self._render)

    def turn_ids(self, role: str, content: str) -> list[int]:
        return list(self._rendered(role, content))

    def _render(self, role: str, content: str) -> tuple[int, ...]:
        text = self.turn_text(role, content) if self.chat_template else f"{content}\n"
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def turn_text(self, role: str, content: str) -> str:
        tok = self.tokenizer
        before = [{"role": "user", "content": "q"}, {"role": "assistant", "content": self.PROBE}]
        base = tok.apply_chat_template(before, tokenize=False)
        full = tok.apply_chat_template([*before, {"role": role, "content": content}], tokenize=False,
                                       add_generation_prompt=True)
        # after the assistant's text the template writes its end (the model's EOS, which the
        # model already produced) and maybe a newline: keep what follows the EOS
        tail = base[base.rindex(self.PROBE) + len(self.PROBE):]
        eos = tok.eos_token or ""
        after_eos = tail[tail.index(eos) + len(eos):] if eos and eos in tail else tail
        return after_eos + full[len(base):]


def call_with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """``fn()`` in a daemon thread, waited for at most ``timeout`` s: ``TimeoutError`` past it (the
    thread is left behind — Python cannot stop it — and, being a daemon, does not hold the exit)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # noqa: BLE001 — handed to the caller
            result["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="rftflow-env-step")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["value"]


_POOL = ThreadPoolExecutor(max_workers=16, thread_name_prefix="rftflow-episode")


def run_in_parallel(calls: list[Callable[[], None]]) -> None:
    """Run independent calls (each episode's environment step, itself bounded by a timeout) on a
    thread pool, and wait for all: a slow environment's steps overlap."""
    if len(calls) <= 1:
        for call in calls:
            call()
        return
    for future in [_POOL.submit(c) for c in calls]:
        future.result()


def finite_reward(value: Any) -> float:
    """A step reward as a float; ``EpisodeFailure`` for anything else (the environment returned garbage)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise EpisodeFailure(f"the environment returned a reward that is not a finite number: {value!r}")
    return float(value)


def run_episodes(engine, episodes: list[Episode], act: Callable[[Episode], None], *, max_turns: int,
                 max_tokens: int, max_new_tokens: int, temperature: float, greedy: bool,
                 context_limit: int | None = None, episode_seconds: float | None = None) -> float:
    """Turns until every episode is done: each turn one batched generation over the live episodes'
    contexts (``n=1`` each), then ``act(episode)`` on each (in threads), which appends the
    environment's turn or ends the episode. Limits end an episode unfinished (truncated): a model
    turn cut at ``max_new_tokens``, ``max_turns`` model turns, ``max_tokens`` response tokens (checked
    before each turn, so the last turn may pass it), or no room left in the model's
    ``context_limit`` positions (a turn near it is generated with what room is left), or
    ``episode_seconds`` of wall-clock time since the episodes started (counted as a timeout).
    Returns the wall-clock seconds spent in the environments' steps (all episodes' at once)."""
    live, started, in_env = [e for e in episodes if not e.done], time.monotonic(), 0.0
    for _ in range(max_turns):
        budgets = {}
        out_of_time = episode_seconds is not None and time.monotonic() - started > episode_seconds
        for e in live:  # this turn's longest reply: what the model's positions leave, at most max_new_tokens
            room = max_new_tokens if context_limit is None else min(max_new_tokens, context_limit - len(e.context))
            room = room // 16 * 16 if 16 <= room < max_new_tokens else room  # few distinct batch budgets
            if out_of_time:
                e.timed_out = True
                e.end(False)
            elif len(e.ids) >= max_tokens or room <= 0:
                e.end(False)
            else:
                budgets[id(e)] = room
        live = [e for e in live if not e.done]
        if not live:
            return in_env
        outs: dict[int, Rollout] = {}
        for room in sorted(set(budgets.values()), reverse=True):  # one batch, unless some near the end of context
            batch = [e for e in live if budgets[id(e)] == room]
            for e, (rollout,) in zip(batch, engine.generate_ids([e.context for e in batch], n=1, max_new_tokens=room,
                                                                temperature=temperature, greedy=greedy)):
                outs[id(e)] = rollout
        outs = [(outs[id(e)],) for e in live]
        acting = []
        for e, (rollout,) in zip(live, outs):
            e.add_model_turn(rollout)
            if not rollout.finished:
                e.end(False)  # cut mid-turn: nothing for the environment to act on
            else:
                acting.append(e)
        step_start = time.perf_counter()
        run_in_parallel([_timed(act, e) for e in acting])
        in_env += time.perf_counter() - step_start
        live = [e for e in live if not e.done]
    for e in live:
        if not e.done:
            e.end(False)
    return in_env


def _timed(act: Callable[[Episode], None], episode: Episode) -> Callable[[], None]:
    def call() -> None:
        start = time.perf_counter()
        try:
            act(episode)
        except EpisodeFailure as e:
            episode.fail(str(e))
        except Exception as e:  # noqa: BLE001 — a failed step fails its episode, not the round
            episode.fail(f"the episode's step raised {type(e).__name__}: {e}")
        finally:
            episode.env_seconds += time.perf_counter() - start
    return call
