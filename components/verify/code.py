"""The `code` reward: the response's program, run against its task's tests in sandboxes.

A task carries its tests in its metadata, in one of three forms:

- ``tests``: Python source that raises when the program is wrong (HumanEval's ``check`` function
  with ``check(<entry_point>)`` after it). The tests and the program run in two sandboxes
  (``relay.run_tests``): the tests', with the task's own helpers and each of the program's functions
  a proxy, and the program's; this process relays each call between them and lets only literals
  of built-in types cross. The program passes when the tests' sandbox reports it reached the end
  of the tests, on a pipe only it holds, and exits 0 in its limits. Tests that need the program's
  objects (``candidate.__name__``, ``inspect.getsource``) are refused (``tests_split``);
- ``calls``: a list of ``{"args": [...], "kwargs": {...}, "expected": ...}`` cases for the task's
  ``entry_point``; the program's sandbox answers each call and this process compares the result
  with ``expected`` (``protocol.same_value``: the same types, floats within 1e-9 relative);
- ``io``: a list of ``{"input": ..., "output": ...}`` cases; the program passes when, for every
  case, it exits 0 in its limits and its stripped output equals the stripped expected output (a
  program that crashes with no output does not pass a case whose expected output is empty).

The program is the response's last fenced code block (```python … ```) or, without one, the whole
response. When the task has a ``code_prompt`` (HumanEval's signature and docstring) and the program
does not define the task's ``entry_point`` itself, the program is the prompt followed by the
response (a completion of the function's body) up to HumanEval's stop sequences (``_COMPLETION_STOPS``).

Reward 1 if the program passes, else 0 with the reason (the failing case, the exception, a limit);
a failure of the sandbox itself, or tests that cannot run in two sandboxes, is ``Score(None,
reason)``: the rows are quarantined, never scored. ``check_code_tasks`` refuses such tasks before
a campaign starts.
"""

from __future__ import annotations

import functools
import re

from rftflow.components.data.tasksets import Task
from rftflow.components.verify import relay
from rftflow.components.verify.sandbox import Execution, Limits, Sandbox, SandboxPool, SandboxUnavailable
from rftflow.components.verify.scores import Score
from rftflow.components.verify.tests_split import Refusal, Split, split

# A fenced block of Python: the program a response stands for, when it writes one
FENCED_BLOCK = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


# Where a completion of a function's body ends: the stop sequences of HumanEval's paper (Chen et al.
# 2021, arXiv:2107.03374: a new top-level def, class, if, print or comment) and a closing fence
_COMPLETION_STOPS = re.compile(r"\n(?:def |class |if |print\(|#|```)")


def extract_program(response: str, task: Task) -> str:
    """The program a response stands for (see the module docstring)."""
    blocks = FENCED_BLOCK.findall(response)
    opened = re.match(r"\s*```[ \t]*(?:python|py|python3)?[ \t]*\n", response)
    code = blocks[-1] if blocks else response[opened.end():] if opened else response  # an unclosed block: its rest
    prompt, entry = task.metadata.get("code_prompt"), task.metadata.get("entry_point")
    if prompt and not (entry and re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE)):
        stop = _COMPLETION_STOPS.search(code)  # the body's completion, without what the model wrote after it
        return prompt + (code[:stop.start()] if stop else code)
    if prompt:  # the response wrote the whole function: keep the prompt's imports (``from typing import List``)
        imports = [line for line in prompt.splitlines() if line.startswith(("import ", "from "))]
        return "\n".join(imports + [code])
    return code


def _outcome(execution: Execution | SandboxUnavailable, limits: Limits, expected: str) -> Score | None:
    """None if this `io` case passed; else its Score (0 with the reason, or None-valued if the
    sandbox failed)."""
    if isinstance(execution, SandboxUnavailable):
        return Score(None, str(execution))
    if not execution.ok:
        return Score(0.0, execution.reason(limits))
    if execution.stdout.strip() != expected.strip():
        return Score(0.0, f"wrong output: {execution.stdout.strip()[:80]!r}, expected {expected.strip()[:80]!r}")
    return None


@functools.lru_cache(maxsize=1024)
def _split(tests: str, prompt: str, entry_point: str | None) -> Split | str:
    """``tests_split.split``, remembered (a group's responses share their task), or the refusal's reason."""
    try:
        return split(tests, prompt, entry_point)
    except Refusal as e:
        return str(e)


def refusal(task: Task) -> str | None:
    """Why the code reward cannot score ``task`` (None if it can)."""
    meta = task.metadata
    if meta.get("tests"):
        if not isinstance(meta["tests"], str):
            return "its tests are not Python source"
        planned = _split(meta["tests"], meta.get("code_prompt") or "", meta.get("entry_point"))
        return planned if isinstance(planned, str) else None
    if meta.get("calls") is not None:
        if not meta.get("entry_point"):
            return "its calls need an entry_point"
        return relay.check_cases(meta["calls"])
    if meta.get("io"):
        return None
    return "it has no tests (metadata `tests`, `calls` or `io`)"


def check_code_tasks(tasks: list[Task], where: str) -> None:
    """``ValueError`` (one line) naming the tasks of ``where`` that carry tests the code reward
    cannot run, with the first one's reason; tasks without tests are not the code reward's."""
    refused = [(task, reason) for task in tasks
               if any(task.metadata.get(k) is not None for k in ("tests", "calls", "io")) and (reason := refusal(task))]
    if refused:
        task, reason = refused[0]
        name = task.metadata.get("problem") or task.task_id
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise ValueError(f"taskset {where}: task {name}{more} cannot be scored by the code reward: {reason}")


class CodeReward:
    """Scores responses by running them (see the module docstring) on a pool of sandboxes."""

    name = "code"

    def __init__(self, settings) -> None:
        self.limits = Limits(wall_seconds=settings.timeout_seconds, cpu_seconds=settings.cpu_seconds,
                             memory_mb=settings.memory_mb, processes=settings.processes, file_mb=settings.file_mb)
        self.sandbox = Sandbox(self.limits, kind=settings.sandbox, python=settings.python)
        self.pool = SandboxPool(self.sandbox, settings.workers)

    def _run(self, job: tuple) -> Score | None:
        kind, program, detail = job
        if kind == "tests":
            return relay.run_tests(self.sandbox, program, detail)
        if kind == "calls":
            return relay.run_calls(self.sandbox, program, *detail)
        stdin, expected = detail
        return _outcome(self.sandbox.run(program, stdin), self.limits, expected)

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        jobs: list[tuple[int, tuple]] = []  # (row, (kind, program, what the kind needs))
        scores: list[Score | None] = [None] * len(responses)
        for row, (response, task) in enumerate(zip(responses, tasks)):
            if reason := refusal(task):
                scores[row] = Score(None, f"task {task.task_id}: {reason}")
                continue
            program, meta = extract_program(response, task), task.metadata
            if meta.get("tests"):
                jobs.append((row, ("tests", program, _split(meta["tests"], meta.get("code_prompt") or "",
                                                            meta.get("entry_point")))))
            elif meta.get("calls") is not None:
                jobs.append((row, ("calls", program, (meta["entry_point"], meta["calls"]))))
            else:
                jobs.extend((row, ("io", program, (str(case.get("input", "")), str(case.get("output", "")))))
                            for case in meta["io"])
        outcomes = self.pool.each(self._run, [job for _, job in jobs])
        for (row, _), outcome in zip(jobs, outcomes):
            failed = Score(None, str(outcome)) if isinstance(outcome, SandboxUnavailable) else outcome
            if failed is None or failed.value == 1.0:
                continue
            current = scores[row]
            if current is None or (current.value is not None and failed.value is None):
                scores[row] = failed  # the first failure; a sandbox failure outranks a failed case
        return [s if s is not None else Score(1.0) for s in scores]

    def close(self) -> None:
        self.pool.close()
