"""Rewards by import path: ``package.module:name`` in ``reward.function``, ``reward.domains``, a
mixture part's ``reward`` or a ``reward.combine`` term.

The name is one of:

- a function ``(response, task) -> float | Score``, called once per response;
- a batched function ``(responses, tasks) -> list[float | Score]`` (its first parameter is named
  ``responses``, or it has ``batched = True``), called once per batch;
- a class with ``score_many(responses, tasks) -> list[float | Score]`` and optionally ``close()``,
  made with ``reward.options`` as keyword arguments.

Its values lie in its declared range, the attribute ``reward_range = (low, high)`` (default
``(0, 1)``). A call that raises, a value that is not a number, NaN or infinite, or outside that range
is a failure of the reward, never a 0 or a 1: the row's ``Score`` has no value and the reason (the
exception's last line), and the round quarantines it. A ``Score`` without a value from a class is the
same. With ``reward.timeout_seconds`` (or ``reward.workers``) the reward runs in worker processes
(``spawn``: nothing of the campaign's threads is copied), one call at a time each; a call past the
timeout has its process killed and replaced, its rows quarantined. Processes, not threads: a
function stuck in C code (a regular expression backtracking on a hostile response) holds the GIL,
and only killing its process ends it. ``concurrent.futures`` cannot kill one call's process, hence
the small pool here.
"""

from __future__ import annotations

import importlib
import inspect
import math
import multiprocessing
import numbers
import queue
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rftflow.components.verify.scores import Score

DEFAULT_RANGE = (0.0, 1.0)


class RewardLoadError(ValueError):
    """A reward by import path that cannot be used: the message is one line naming the path."""


def last_line(error: BaseException) -> str:
    """An exception as the last line of its traceback: ``ZeroDivisionError: division by zero``."""
    return traceback.format_exception_only(type(error), error)[-1].strip()


def _declared_range(obj: Any, path: str, what: str) -> tuple[float, float]:
    declared = getattr(obj, "reward_range", DEFAULT_RANGE)
    try:
        low, high = (float(v) for v in declared)
    except (TypeError, ValueError):
        raise RewardLoadError(f"{what} {path!r}: reward_range must be (low, high), got {declared!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise RewardLoadError(f"{what} {path!r}: reward_range must be finite with low < high, got {declared!r}")
    return low, high


def resolve(path: str, options: dict[str, Any], what: str = "reward") -> tuple[Any, str, tuple[float, float]]:
    """(the object at ``path``, its kind — ``row``, ``batch`` or ``class`` —, its declared range),
    its signature checked against its kind and ``options`` (a class's keyword arguments); else
    ``RewardLoadError`` naming the path. Nothing is called or made."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RewardLoadError(f"{what} {path!r}: cannot import {module_name!r} ({last_line(e)}; is its folder on "
                              "PYTHONPATH?)") from None
    except Exception as e:  # noqa: BLE001 — the module's own code failed on import
        raise RewardLoadError(f"{what} {path!r}: importing {module_name!r} raised {last_line(e)}") from None
    if not hasattr(module, attribute):
        raise RewardLoadError(f"{what} {path!r}: module {module_name!r} has no {attribute!r}")
    obj = getattr(module, attribute)
    declared = _declared_range(obj, path, what)
    if isinstance(obj, type):
        if not callable(getattr(obj, "score_many", None)):
            raise RewardLoadError(f"{what} {path!r}: a class reward needs a method score_many(responses, tasks)")
        try:
            inspect.signature(obj).bind(**options)
        except TypeError as e:
            raise RewardLoadError(f"{what} {path!r}: cannot be made with reward options {options} ({e})") from None
        return obj, "class", declared
    if not callable(obj):
        raise RewardLoadError(f"{what} {path!r}: not a function or a class but {type(obj).__name__}")
    if options:
        raise RewardLoadError(f"{what} {path!r}: a function takes no reward options (got {', '.join(options)}); "
                              "options are a class reward's constructor arguments")
    params = list(inspect.signature(obj).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(positional) < 2 and not any(p.kind == p.VAR_POSITIONAL for p in params) or len(required) > 2:
        shown = ", ".join(p.name for p in params)
        raise RewardLoadError(f"{what} {path!r}: takes ({shown}); a reward takes (response, task), "
                              "(responses, tasks) or is a class with score_many")
    batched = getattr(obj, "batched", False) or (bool(positional) and positional[0].name == "responses")
    return obj, "batch" if batched else "row", declared


def checked(value: Any, path: str, declared: tuple[float, float]) -> Score:
    """A returned value as a ``Score``: a number (or ``Score``) within ``declared``, else a ``Score``
    without a value saying what came back."""
    reason = None
    if isinstance(value, Score):
        if value.value is None:
            return Score(None, f"{path}: {value.reason or 'no value'}")
        value, reason = value.value, value.reason
    if not isinstance(value, numbers.Real):
        return Score(None, f"{path} returned {type(value).__name__} {str(value)[:40]!r}, not a number")
    number = float(value)
    if not math.isfinite(number):
        return Score(None, f"{path} returned {number}")
    low, high = declared
    if not low <= number <= high:
        return Score(None, f"{path} returned {number:g}, outside its reward_range [{low:g}, {high:g}]")
    return Score(number, reason)


def score_rows(reward: Any, kind: str, path: str, declared: tuple[float, float], responses: list[str],
               tasks: list) -> list[Score]:
    """``responses`` scored by ``reward`` (a function of ``kind`` or a made class), each checked."""
    if kind == "row":
        out = []
        for response, task in zip(responses, tasks):
            try:
                out.append(checked(reward(response, task), path, declared))
            except Exception as e:  # noqa: BLE001 — the reward's own failure: the row is quarantined with it
                out.append(Score(None, f"{path} raised {last_line(e)}"))
        return out
    try:
        values = list(reward.score_many(responses, tasks) if kind == "class" else reward(responses, tasks))
    except Exception as e:  # noqa: BLE001
        return [Score(None, f"{path} raised {last_line(e)}")] * len(responses)
    if len(values) != len(responses):
        return [Score(None, f"{path} returned {len(values)} values for {len(responses)} responses")] * len(responses)
    return [checked(v, path, declared) for v in values]


def _serve(conn, path: str, options: dict[str, Any]) -> None:
    """A worker process: load the reward (and what unpickles a task) once, say it is ready, then
    score each batch sent until the pipe closes."""
    import rftflow.components.data.tasksets  # noqa: F401 — tasks arrive pickled: not read within a call's time

    try:
        obj, kind, declared = resolve(path, options)
        reward = obj(**options) if kind == "class" else obj
        failure = None
    except Exception as e:  # noqa: BLE001 — every batch answered with it
        failure = f"{path}: {last_line(e)}"
    conn.send("ready")
    while True:
        try:
            responses, tasks = conn.recv()
        except (EOFError, OSError):
            break
        conn.send([Score(None, failure)] * len(responses) if failure
                  else score_rows(reward, kind, path, declared, responses, tasks))
    if failure is None and kind == "class" and callable(getattr(reward, "close", None)):
        reward.close()


class _Worker:
    """One process that scores what it is sent; killed past the timeout."""

    def __init__(self, path: str, options: dict[str, Any]):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, path, options), daemon=True,
                                       name=f"reward {path}")
        self.process.start()
        child.close()
        self.ready = False

    def score(self, responses: list[str], tasks: list, timeout: float | None, path: str) -> list[Score]:
        """The process's scores of ``responses``; past ``timeout`` seconds (its start not counted)
        the process is killed and each row's ``Score`` says so."""
        try:
            if not self.ready:
                self.ready = self.conn.recv() == "ready"
            self.conn.send((responses, tasks))
        except (EOFError, OSError):
            self.close()
            return [Score(None, self._died(path))] * len(responses)
        if not self.conn.poll(timeout):
            self.close(wait=0)
            return [Score(None, f"{path} timed out after {timeout:g} s (reward.timeout_seconds)")] * len(responses)
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.close()
            return [Score(None, self._died(path))] * len(responses)

    def _died(self, path: str) -> str:
        return f"{path}: its worker process died (exit code {self.process.exitcode})"

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self, wait: float = 5.0) -> None:
        """End the process: its pipe closed, it closes its reward and exits; killed after ``wait`` s."""
        self.conn.close()
        self.process.join(wait)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


class ImportedReward:
    """The reward at import path ``path`` (see the module docstring), with ``score_many`` and
    ``close``; ``name`` is the path's last part, ``range`` its declared range, ``correct_at`` its top."""

    def __init__(self, path: str, options: dict[str, Any] | None = None, *, timeout_seconds: float | None = None,
                 workers: int | None = None, what: str = "reward"):
        self.path, self.options, self.timeout = path, dict(options or {}), timeout_seconds
        self.name = path.rpartition(":")[2]
        obj, self.kind, self.range = resolve(path, self.options, what)
        self.correct_at = self.range[1]
        self.workers = workers or (1 if timeout_seconds is not None else 0)
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._lock = threading.Lock()
        self._made: list[_Worker] = []
        self.reward: Callable | Any = None
        if not self.workers:
            try:
                self.reward = obj(**self.options) if self.kind == "class" else obj
            except Exception as e:  # noqa: BLE001 — the class's constructor failed
                raise RewardLoadError(f"{what} {path!r}: making it raised {last_line(e)}") from None
        else:
            for _ in range(self.workers):
                self._idle.put(self._new_worker())

    def _new_worker(self) -> _Worker:
        worker = _Worker(self.path, self.options)
        with self._lock:
            self._made.append(worker)
        return worker

    def _on_worker(self, responses: list[str], tasks: list) -> list[Score]:
        worker = self._idle.get()
        try:
            return worker.score(responses, tasks, self.timeout, self.path)
        finally:
            self._idle.put(worker if worker.alive else self._new_worker())

    def score_many(self, responses: list[str], tasks: list) -> list[Score]:
        if not responses:
            return []
        if not self.workers:
            return score_rows(self.reward, self.kind, self.path, self.range, responses, tasks)
        # a row function: a call per response (each timed); a batch: one call per worker's share
        step = 1 if self.kind == "row" else -(-len(responses) // self.workers)
        chunks = [(responses[i:i + step], tasks[i:i + step]) for i in range(0, len(responses), step)]
        with ThreadPoolExecutor(self.workers) as pool:
            return [s for part in pool.map(lambda c: self._on_worker(*c), chunks) for s in part]

    def close(self) -> None:
        with self._lock:
            made, self._made = self._made, []
        for worker in made:
            worker.close()
        if self.reward is not None and self.kind == "class" and callable(getattr(self.reward, "close", None)):
            self.reward.close()
