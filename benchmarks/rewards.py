"""The code reward's throughput: solutions/s on the sandbox pool against one worker, and the
sandbox's cost per execution over a bare subprocess.

The same executions both ways: HumanEval's 164 canonical solutions (they pass) and wrong variants
of the first ones (a stub body: they fail), each the program plus its problem's tests, scored by
the ``code`` reward (``components.verify.code``) with a pool of ``--workers`` sandboxes and with
one. Then the per-execution overhead: a trivial program in the bubblewrap sandbox against the same
program in a bare ``python -I -S`` subprocess (no limits, no namespaces), median of ``--trivial``.

    python benchmarks/rewards.py                  # ~200 executions, a pool of one worker per core
    python benchmarks/rewards.py --wrong 80 --workers 4
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time

from rftflow.components.config import CodeRewardConfig, TasksetConfig
from rftflow.components.data.tasksets import validated_tasks
from rftflow.components.verify.code import CodeReward


def _scored(workers: int, responses: list[str], tasks) -> tuple[float, list[float]]:
    reward = CodeReward(CodeRewardConfig(workers=workers))
    try:
        reward.score_many(responses[:4], tasks[:4])  # the pool's threads up
        began = time.perf_counter()
        scores = reward.score_many(responses, tasks)
        return time.perf_counter() - began, [s.value for s in scores]
    finally:
        reward.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrong", type=int, default=36, help="wrong variants added to the 164 canonical solutions")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--trivial", type=int, default=30, help="trivial executions timed each way")
    args = parser.parse_args()
    tasks, _ = validated_tasks(TasksetConfig(source="human_eval"), 0)
    responses = [t.answer for t in tasks] + ["    pass\n"] * args.wrong
    tasks = tasks + tasks[:args.wrong]
    one_s, one = _scored(1, responses, tasks)
    pool_s, pooled = _scored(args.workers, responses, tasks)
    assert one == pooled, "the pool and one worker scored differently"
    n = len(responses)
    print(f"executions: {n} ({sum(v == 1.0 for v in one)} pass, {sum(v == 0.0 for v in one)} fail, "
          f"{sum(v is None for v in one)} unavailable); cores: {os.cpu_count()}")
    print(f"{'':<22}{'solutions/s':>12}{'wall s':>9}")
    print(f"{'one worker':<22}{n / one_s:>12.1f}{one_s:>9.2f}")
    print(f"{f'pool of {args.workers}':<22}{n / pool_s:>12.1f}{pool_s:>9.2f}")
    print(f"pool / one worker: {one_s / pool_s:.2f}x")

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
