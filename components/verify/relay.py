"""The trusted parent of a code execution: the program in one sandbox, the tests in another, values between.

- ``Candidate``: the program's sandbox (``harness.serve``) and its private pipes. ``call`` sends
  one call and returns the reply read as a literal (``protocol.literal``); the program's death,
  a timeout or a reply that is not a literal of built-in types ends the execution
  (``ProgramFailed``: the program scores 0 with the reason).
- ``run_tests``: a `tests` task. The tests run in their own sandbox (``harness.run_tests``) that
  never holds the program; each call they make arrives here on their private pipe, its arguments
  read as literals, goes to the ``Candidate``, and its checked result goes back. The program
  passes when the tests' sandbox said ``("done",)`` on that pipe and exited 0, in the limits —
  nothing the program prints or does in its own sandbox is read.
- ``run_calls``: a `calls` task (each case an entry point's arguments and the expected result):
  no tests' sandbox; this process compares each result with ``protocol.same_value``.

Each returns a ``Score``: 1, 0 with the reason, or None-valued (the sandbox failed to set up, or
the tests did what two sandboxes cannot carry: the row is quarantined, never scored).
"""

from __future__ import annotations

import inspect
import os
import time

from rftflow.components.verify import harness
from rftflow.components.verify.protocol import (Closed, NotALiteral, TimedOut, check_literal, literal, nonblocking,
                                                read_frame, same_value, write_frame)
from rftflow.components.verify.sandbox import Sandbox, SandboxUnavailable
from rftflow.components.verify.scores import Score
from rftflow.components.verify.tests_split import Split

HARNESS = inspect.getsource(harness)


class ProgramFailed(Exception):
    """The program failed (the message says how): it scores 0."""


def _shown(value: object, size: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= size else text[:size - 3] + "..."


def _call_text(function: str, args: tuple, kwargs: dict) -> str:
    shown = [_shown(a, 30) for a in args] + [f"{k}={_shown(v, 30)}" for k, v in kwargs.items()]
    return f"{function}({', '.join(shown)})"


class _Sandboxed:
    """A harness started in a sandbox with two private pipes: one it reads, one it writes."""

    def __init__(self, sandbox: Sandbox, main: str):
        self.sandbox, self.running = sandbox, None
        to_child, self._to_child = os.pipe()
        self._from_child, from_child = os.pipe()
        try:
            self.running = sandbox.start(main, fds=(to_child, from_child))
        except BaseException:
            os.close(self._to_child)
            os.close(self._from_child)
            raise
        finally:
            os.close(to_child)
            os.close(from_child)
        nonblocking(self._to_child)
        nonblocking(self._from_child)

    def send(self, message: tuple, deadline: float) -> None:
        write_frame(self._to_child, repr(message), deadline)

    def receive(self, deadline: float) -> str:
        return read_frame(self._from_child, deadline)

    def close(self) -> None:
        """Kill it (if it still runs) and close the pipes."""
        for fd in (self._to_child, self._from_child):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.running.finish(time.monotonic())
        except SandboxUnavailable:
            pass


class Candidate(_Sandboxed):
    """The program, run by ``harness.serve`` in its own sandbox (see the module docstring)."""

    def __init__(self, sandbox: Sandbox, program: str, deadline: float):
        super().__init__(sandbox, f"{HARNESS}\nserve({program!r})\n")
        self.deadline, self.ready = deadline, False

    def _ended(self, during: str) -> ProgramFailed:
        """The program's end, waited for (``SandboxUnavailable`` if its sandbox never set up)."""
        execution = self.running.finish(self.deadline)
        if execution.timed_out:
            return ProgramFailed(f"timed out after {self.sandbox.limits.wall_seconds:g} s")
        return ProgramFailed(f"the program ended {during}: {execution.reason(self.sandbox.limits) or 'exit 0'}")

    def _reply(self, during: str, who: str) -> tuple:
        try:
            reply = literal(self.receive(self.deadline))
        except Closed:
            raise self._ended(during) from None
        except TimedOut:
            raise ProgramFailed(f"timed out after {self.sandbox.limits.wall_seconds:g} s") from None
        except NotALiteral as e:
            raise ProgramFailed(f"{who} answered {e}") from None
        if type(reply) is not tuple or not reply:
            raise ProgramFailed(f"{who} answered {_shown(reply)}, not a reply")
        return reply

    def wait_ready(self) -> None:
        """Until the program has run its top level (``ProgramFailed`` if it did not)."""
        if not self.ready:
            reply = self._reply("before its functions could be called", "the program")
            if reply != ("ready",):
                raise ProgramFailed(f"the program answered {_shown(reply)} before its functions could be called")
            self.ready = True

    def call(self, function: str, args: tuple, kwargs: dict) -> tuple:
        """``("return", value)`` or ``("raise", type name, message)`` of one call, values checked."""
        self.wait_ready()
        call = _call_text(function, args, kwargs)
        during = f"during {call}"
        try:
            self.send(("call", function, args, kwargs), self.deadline)
        except Closed:
            raise self._ended(during) from None
        except TimedOut:
            raise ProgramFailed(f"timed out after {self.sandbox.limits.wall_seconds:g} s") from None
        reply = self._reply(during, call)
        if len(reply) == 2 and reply[0] == "return":
            return reply
        if (len(reply) == 3 and reply[0] == "raise" and type(reply[1]) is str and reply[1].isidentifier()
                and type(reply[2]) is str):
            return reply
        raise ProgramFailed(f"{call} answered {_shown(reply)}, not a result")


def _sandboxes(sandbox: Sandbox, program: str, deadline: float, tests_main: str | None):
    """The candidate's sandbox (and the tests' when ``tests_main``), started together."""
    candidate = Candidate(sandbox, program, deadline)
    try:
        return candidate, (_Sandboxed(sandbox, tests_main) if tests_main else None)
    except BaseException:
        candidate.close()
        raise


def run_tests(sandbox: Sandbox, program: str, split: Split) -> Score:
    """Score ``program`` against a `tests` task split by ``tests_split.split`` (see the module docstring)."""
    limits = sandbox.limits
    deadline = time.monotonic() + limits.wall_seconds
    main = f"{HARNESS}\nrun_tests({split.helpers!r}, {split.tests!r}, {split.names!r})\n"
    try:
        candidate, tests = _sandboxes(sandbox, program, deadline, main)
    except SandboxUnavailable as e:
        return Score(None, str(e))
    try:
        return _relay(candidate, tests, split, deadline)
    except SandboxUnavailable as e:
        return Score(None, str(e))
    except ProgramFailed as e:
        return Score(0.0, str(e))
    except TimedOut:
        return Score(0.0, f"timed out after {limits.wall_seconds:g} s")
    finally:
        candidate.close()
        tests.close()


def _relay(candidate: Candidate, tests: _Sandboxed, split: Split, deadline: float) -> Score:
    """Relay the tests' calls until they end; their verdict (see ``run_tests``)."""
    done = False
    while True:
        try:
            text = tests.receive(deadline)
        except Closed:  # the tests' sandbox ended
            break
        try:
            message = literal(text)
        except NotALiteral as e:  # only a call's arguments can be anything: the tests built them
            return Score(None, f"the task's tests cannot run in two sandboxes: they pass the program {e}")
        if message == ("done",):
            done = True
        elif type(message) is tuple and len(message) == 2 and message[0] == "refused":
            return Score(None, f"the task's tests cannot run in two sandboxes: {message[1]}")
        elif (type(message) is tuple and len(message) == 4 and message[0] == "call" and type(message[2]) is tuple
              and type(message[3]) is dict and all(type(k) is str for k in message[3])):
            _, function, args, kwargs = message
            if function not in split.names.values():
                return Score(None, f"the task's tests called {function}, which is not the program's")
            try:
                tests.send(candidate.call(function, args, kwargs), deadline)
            except Closed:
                break
        else:
            return Score(None, f"the task's tests broke the harness's protocol: {_shown(message)}")
    execution = tests.running.finish(deadline)
    candidate.wait_ready()  # a program that does not load fails, called or not
    if execution.timed_out:
        return Score(0.0, f"timed out after {candidate.sandbox.limits.wall_seconds:g} s")
    if not execution.ok:
        return Score(0.0, execution.reason(candidate.sandbox.limits))
    if not done:
        return Score(0.0, "the tests did not run to their end")
    return Score(1.0)


def run_calls(sandbox: Sandbox, program: str, entry_point: str, cases: list[dict]) -> Score:
    """Score ``program``: each case's ``entry_point(*args, **kwargs)`` must return its ``expected``."""
    deadline = time.monotonic() + sandbox.limits.wall_seconds
    try:
        candidate, _ = _sandboxes(sandbox, program, deadline, None)
    except SandboxUnavailable as e:
        return Score(None, str(e))
    try:
        for case in cases:
            args, kwargs, expected = tuple(case.get("args", ())), dict(case.get("kwargs", {})), case.get("expected")
            reply = candidate.call(entry_point, args, kwargs)
            call = _call_text(entry_point, args, kwargs)
            if reply[0] == "raise":
                return Score(0.0, f"{call} raised {reply[1]}: {reply[2][:120]}")
            if not same_value(reply[1], expected):
                return Score(0.0, f"{call} returned {_shown(reply[1])}, expected {_shown(expected)}")
        return Score(1.0)
    except SandboxUnavailable as e:
        return Score(None, str(e))
    except ProgramFailed as e:
        return Score(0.0, str(e))
    finally:
        candidate.close()


def check_cases(cases: object) -> str | None:
    """Why a `calls` task's cases cannot be run (None if they can): each a mapping of ``args`` (a
    list), optional ``kwargs`` (a mapping by name) and ``expected``, all literals."""
    if type(cases) is not list or not cases:
        return "its calls are not a non-empty list of cases"
    for number, case in enumerate(cases, start=1):
        if type(case) is not dict or "expected" not in case or type(case.get("args", [])) is not list:
            return f"its call {number} is not {{args: [...], kwargs: {{...}}, expected: ...}}"
        if type(case.get("kwargs", {})) is not dict or not all(type(k) is str for k in case.get("kwargs", {})):
            return f"its call {number}'s kwargs are not a mapping by name"
        try:
            check_literal([case.get("args", []), case.get("kwargs", {}), case["expected"]])
        except NotALiteral as e:
            return f"its call {number} holds {e}"
    return None
