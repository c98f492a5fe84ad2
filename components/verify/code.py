"""The `code` reward: the response's program, run against its task's tests in the sandbox.

A task carries its tests in its metadata, in one of two forms:

- ``tests``: Python source that raises when the program is wrong (HumanEval's ``check`` function
  with ``check(<entry_point>)`` after it); the program passes when the whole file — program, then
  tests, then a marker line the harness prints — exits 0 in its limits and printed the marker
  (an ``os._exit(0)`` before the tests does not pass);
- ``io``: a list of ``{"input": ..., "output": ...}`` cases; the program passes when, for every
  case, it exits 0 in its limits and its stripped output equals the stripped expected output (a
  program that crashes with no output does not pass a case whose expected output is empty).

The program is the response's last fenced code block (```python … ```) or, without one, the whole
response. When the task has a ``code_prompt`` (HumanEval's signature and docstring) and the program
does not define the task's ``entry_point`` itself, the program is the prompt followed by the
response (a completion of the function's body) up to HumanEval's stop sequences (``_COMPLETION_STOPS``).

Reward 1 if the program passes, else 0 with the reason (the failing case, the exception, a limit);
a failure of the sandbox itself is ``Score(None, reason)``: the rows are quarantined, never scored.
"""

from __future__ import annotations

import re
import secrets

from rftflow.components.data.tasksets import Task
from rftflow.components.verify.sandbox import Execution, Limits, Sandbox, SandboxPool, SandboxUnavailable
from rftflow.components.verify.scores import Score

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


# Where a completion of a function's body ends: the stop sequences of HumanEval's paper (Chen et al.
# 2021, arXiv:2107.03374: a new top-level def, class, if, print or comment) and a closing fence
_COMPLETION_STOPS = re.compile(r"\n(?:def |class |if |print\(|#|```)")


def extract_program(response: str, task: Task) -> str:
    """The program a response stands for (see the module docstring)."""
    blocks = _FENCE.findall(response)
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


def _outcome(execution: Execution | SandboxUnavailable, limits: Limits, marker: str | None = None,
             expected: str | None = None) -> Score | None:
    """None if this execution passed; else its Score (0 with the reason, or None-valued if the
    sandbox failed)."""
    if isinstance(execution, SandboxUnavailable):
        return Score(None, str(execution))
    if not execution.ok:
        return Score(0.0, execution.reason(limits))
    if marker is not None and execution.stdout.rstrip().rsplit("\n", 1)[-1] != marker:
        return Score(0.0, "the tests did not run to their end")
    if expected is not None and execution.stdout.strip() != expected.strip():
        return Score(0.0, f"wrong output: {execution.stdout.strip()[:80]!r}, expected {expected.strip()[:80]!r}")
    return None


class CodeReward:
    """Scores responses by running them (see the module docstring) on a pool of sandboxes."""

    name = "code"

    def __init__(self, settings) -> None:
        self.limits = Limits(wall_seconds=settings.timeout_seconds, cpu_seconds=settings.cpu_seconds,
                             memory_mb=settings.memory_mb, processes=settings.processes, file_mb=settings.file_mb)
        self.sandbox = Sandbox(self.limits, kind=settings.sandbox, python=settings.python)
        self.pool = SandboxPool(self.sandbox, settings.workers)

    def score_many(self, responses: list[str], tasks: list[Task]) -> list[Score]:
        runs: list[tuple[int, str, str, str | None, str | None]] = []  # (row, program, stdin, marker, expected)
        scores: list[Score | None] = [None] * len(responses)
        for row, (response, task) in enumerate(zip(responses, tasks)):
            program = extract_program(response, task)
            if task.metadata.get("tests"):
                marker = f"rftflow-tests-passed-{secrets.token_hex(8)}"
                runs.append((row, f"{program}\n\n{task.metadata['tests']}\n\nprint({marker!r})\n", "", marker, None))
            elif task.metadata.get("io"):
                runs.extend((row, program, str(case.get("input", "")), None, str(case.get("output", "")))
                            for case in task.metadata["io"])
            else:
                scores[row] = Score(None, f"task {task.task_id} has no tests (metadata `tests` or `io`)")
        executions = self.pool.map([r[1] for r in runs], [r[2] for r in runs])
        for (row, _, _, marker, expected), execution in zip(runs, executions):
            failed = _outcome(execution, self.limits, marker, expected)
            current = scores[row]
            if failed is not None and (current is None or (current.value is not None and failed.value is None)):
                scores[row] = failed  # the first failure; a sandbox failure outranks a failed case
        return [s if s is not None else Score(1.0) for s in scores]

    def close(self) -> None:
        self.pool.close()
