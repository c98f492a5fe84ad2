"""The code reward's throughput: solutions/s on the sandbox pool against one worker, what two
sandboxes cost per execution against one, and the sandbox's cost over a bare subprocess.

The same executions each way: HumanEval's 164 canonical solutions (they pass) and wrong variants
of the first ones (a stub body: they fail), each scored by the ``code`` reward
(``components.verify.code``: the tests in one sandbox, the program in another, the calls relayed
between them) with a pool of ``--workers`` and with one worker. Then each solution, one at a time,
both by the reward and the way it was run before two sandboxes — program, tests and a marker line
in one file in one sandbox (pass: exit 0 and the marker last), a harness a program can forge, kept
here only as the cost baseline — back to back, so that a load that comes and goes weighs on both.
Last, a trivial program in the sandbox against the same program in a bare ``python -I -S``
subprocess (no limits, no namespaces), median of ``--trivial``.

    python benchmarks/rewards.py                  # ~200 executions, a pool of one worker per core
    python benchmarks/rewards.py --wrong 80 --workers 4
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import time

from rftflow.components.config import CodeRewardConfig, TasksetConfig
from rftflow.components.data.tasksets import validated_tasks
from rftflow.components.verify.code import CodeReward, extract_program


def _scored(workers: int, responses: list[str], tasks) -> tuple[float, list[float]]:
    reward = CodeReward(CodeRewardConfig(workers=workers))
    try:
        reward.score_many(responses[:4], tasks[:4])  # the pool's threads up
        began = time.perf_counter()
        scores = reward.score_many(responses, tasks)
        return time.perf_counter() - began, [s.value for s in scores]
    finally:
        reward.close()


def _paired(responses: list[str], tasks) -> tuple[float, float, list[float]]:
    """Seconds of two sandboxes and of one sandboxed file (program, tests, marker) over the same
    solutions, one at a time, each solution both ways back to back (the order alternating), so that
    both see the same load; and the one-file verdicts."""
    reward = CodeReward(CodeRewardConfig(workers=1))
    two = one = 0.0
    values = []
    try:
        for i, (response, task) in enumerate(zip(responses, tasks)):
            marker = f"rftflow-tests-passed-{secrets.token_hex(8)}"
            program = f"{extract_program(response, task)}\n\n{task.metadata['tests']}\n\nprint({marker!r})\n"
            for way in ("two", "one") if i % 2 else ("one", "two"):
                began = time.perf_counter()
                if way == "two":
                    reward.score_many([response], [task])
                    two += time.perf_counter() - began
                else:
                    run = reward.sandbox.run(program)
                    one += time.perf_counter() - began
                    values.append(float(run.ok and run.stdout.rstrip().rsplit("\n", 1)[-1] == marker))
    finally:
        reward.close()
    return two, one, values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrong", type=int, default=36, help="wrong variants added to the 164 canonical solutions")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trivial", type=int, default=30, help="trivial executions timed each way")
    parser.add_argument("--problems", type=int, default=164, help="HumanEval problems whose solutions run (all 164)")
    args = parser.parse_args()
    tasks, _ = validated_tasks(TasksetConfig(source="human_eval"), 0)
    tasks = tasks[:args.problems]
    responses = [t.answer for t in tasks] + ["    pass\n"] * args.wrong
    tasks = tasks + tasks[:args.wrong]
    one_s, one = _scored(1, responses, tasks)
    pool_s, pooled = _scored(args.workers, responses, tasks)
    assert one == pooled, "the pool and one worker scored differently"
    two_s, single_s, single = _paired(responses, tasks)
    assert single == one, "one sandbox and two scored the honest solutions differently"
    n = len(responses)
    print(f"executions: {n} ({sum(v == 1.0 for v in one)} pass, {sum(v == 0.0 for v in one)} fail, "
          f"{sum(v is None for v in one)} unavailable); cores: {os.cpu_count()}")
    print(f"{'':<30}{'solutions/s':>12}{'wall s':>9}")
    print(f"{'one worker':<30}{n / one_s:>12.1f}{one_s:>9.2f}")
    print(f"{f'pool of {args.workers}':<30}{n / pool_s:>12.1f}{pool_s:>9.2f}")
    print(f"pool / one worker: {one_s / pool_s:.2f}x")
    print(f"per execution, each solution both ways in turn: two sandboxes {two_s / n * 1000:.1f} ms, one sandboxed "
          f"file {single_s / n * 1000:.1f} ms: {two_s / single_s:.2f}x")

    reward = CodeReward(CodeRewardConfig(workers=1))
    sandboxed, bare = [], []
    for _ in range(args.trivial):
        began = time.perf_counter()
        assert reward.sandbox.run("print(1)").ok
        sandboxed.append(time.perf_counter() - began)
        began = time.perf_counter()
        subprocess.run([reward.sandbox.python, "-I", "-S", "-c", "print(1)"], check=True, capture_output=True)
        bare.append(time.perf_counter() - began)
    reward.close()
    s, b = statistics.median(sandboxed) * 1000, statistics.median(bare) * 1000
    print(f"a trivial program: sandbox {s:.1f} ms, bare subprocess {b:.1f} ms, overhead {s - b:.1f} ms "
          f"({s / b:.2f}x)")


if __name__ == "__main__":
    main()
