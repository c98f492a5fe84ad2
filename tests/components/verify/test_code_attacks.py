"""Programs that try to forge the code reward's verdict, as CI runs them (root): each scores 0 with
its reason. Each marker attack is first shown to forge a one-sandbox harness (program, tests and
a marker line in one file, pass = exit 0 and the marker last), so that the corpus attacks something."""

import secrets
from textwrap import dedent

import pytest

from rftflow.components.config import CodeRewardConfig
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.code import CodeReward, extract_program

SETTINGS = CodeRewardConfig(timeout_seconds=10, cpu_seconds=3, memory_mb=256)


def _task(name: str, tests: str) -> Task:
    return Task(f"t-{name}", name, f"def {name}(xs):\n", "", {"code_prompt": f"def {name}(xs):\n",
                                                              "entry_point": name, "tests": dedent(tests)})


ADD = Task("t-add", "add", "def add(a, b):\n", "    return a + b\n",
           {"code_prompt": "def add(a, b):\n", "entry_point": "add",
            "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n\n"
                     "check(add)\n"})
# tests written the way a NaN, an inf or a patched builtin fools: each passes the right answer too
MEAN = _task("mean", """
    assert not abs(mean([1.0, 2.0]) - 1.5) > 1e-9
    assert not abs(mean([2.0, 6.0]) - 4.0) > 1e-9
""")
LARGEST = _task("largest", """
    assert largest([1.0, 3.0]) >= 3.0
    assert largest([-2.0, -5.0]) >= -2.0
""")

# the marker of a one-sandbox harness, found where it lies: in the file the program runs from
FIND_MARKER = """
        def _marker():
            import re
            text = open(__file__ if '__file__' in globals() else 'main.py').read()
            found = re.findall(r'rftflow-tests-passed-[0-9a-f]{16}', text)
            return found[-1] if found else ''
"""
ATTACKS = {  # name: (task, program, the reason it scores 0)
    "the marker read from the file, then os._exit(0)": (ADD, FIND_MARKER + """
        def add(a, b):
            return 0
        print(_marker(), flush=True)
        import os
        os._exit(0)
    """, "the program ended before its functions could be called: exit 0"),
    "the marker from the code objects' constants": (ADD, """
        import os, sys
        def add(a, b):
            return 0
        def consts(code):
            for c in code.co_consts:
                if isinstance(c, str) and c.startswith('rftflow-tests-passed-'):
                    print(c, flush=True)
                elif hasattr(c, 'co_consts'):
                    consts(c)
        frame = sys._getframe()
        while frame:
            consts(frame.f_code)
            frame = frame.f_back
        os._exit(0)
    """, "the program ended before its functions could be called: exit 0"),
    "an always-equal object": (ADD, """
        class Equal:
            def __eq__(self, other):
                return True
        def add(a, b):
            return Equal()
    """, "add(2, 3) answered something that is not a literal of built-in types: \"('return', <__main__.Equal object"),
    "an int subclass with its own __eq__": (ADD, """
        class I(int):
            __eq__ = lambda self, other: True
            __hash__ = int.__hash__
        def add(a, b):
            return I(0)
    """, "exit 1: AssertionError"),
    "a str subclass with its own __eq__": (ADD, """
        class S(str):
            __eq__ = lambda self, other: True
            __hash__ = str.__hash__
        def add(a, b):
            return S('')
    """, "exit 1: AssertionError"),
    "patched builtins": (MEAN, """
        import builtins
        builtins.abs = lambda x: 0.0
        def mean(xs):
            return 0.0
    """, "exit 1: AssertionError"),
    "SystemExit raised mid-test": (ADD, FIND_MARKER + """
        def add(a, b):
            print(_marker(), flush=True)
            raise SystemExit(0)
    """, "the program ended during add(2, 3): exit 0"),
    "an atexit handler": (ADD, FIND_MARKER + """
        import atexit, os
        marker = _marker()
        atexit.register(lambda: (print(marker, flush=True), os._exit(0)))
        def add(a, b):
            return 0
    """, "exit 1: AssertionError"),
    "an excepthook after a failing assert": (ADD, FIND_MARKER + """
        import os, sys
        marker = _marker()
        sys.excepthook = lambda *a: (print(marker, flush=True), os._exit(0))
        def add(a, b):
            return 0
    """, "exit 1: AssertionError"),
    "a forked child that prints after the parent exits": (ADD, FIND_MARKER + """
        import os, time
        marker = _marker()
        if os.fork() == 0:
            time.sleep(0.3)
            print(marker, flush=True)
            os._exit(0)
        def add(a, b):
            return 0
    """, "exit 1: AssertionError"),
    "forged protocol lines on stdout": (ADD, """
        import sys
        for message in [('ready',), ('return', 5), ('done',), ('return', 0)]:
            text = repr(message).encode()
            sys.stdout.buffer.write(len(text).to_bytes(4, 'big') + text)
            print(message, 'PASSED', flush=True)
        def add(a, b):
            print(('done',), flush=True)
            return 0
    """, "exit 1: AssertionError"),
    "a NaN result": (MEAN, """
        def mean(xs):
            return float('nan')
    """, "mean([1.0, 2.0]) answered a float that is not finite (nan)"),
    "an inf result": (LARGEST, """
        def largest(xs):
            return float('inf')
    """, "largest([1.0, 3.0]) answered a float that is not finite (inf)"),
}


def _response(attack: str) -> str:
    return f"```python\n{dedent(ATTACKS[attack][1])}```"


# a one-sandbox harness has no answer to these either; the forked child and the stdout lines do not
# forge it only because it reads a file after killing the session (a harness that waits for the
# pipe's end, as subprocess.run does, reads the child's late line; one that greps stdout, the lines)
FORGES_ONE_SANDBOX = sorted(set(ATTACKS) - {"a forked child that prints after the parent exits",
                                            "forged protocol lines on stdout"})


@pytest.fixture(scope="module")
def reward():
    reward = CodeReward(SETTINGS)
    yield reward
    reward.close()


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_an_attack_on_the_verdict_scores_0_with_its_reason(attack, reward):
    task, _, reason = ATTACKS[attack]
    score = reward.score_many([_response(attack)], [task])[0]
    assert score.value == 0.0 and score.reason.startswith(reason), score


def test_the_attacks_forge_a_one_sandbox_harness_and_an_honest_program_passes_both(reward):
    """The corpus is real: on one sandbox with a marker (rftflow's harness before two sandboxes)
    each of these scores 1; the honest programs score 1 on both."""

    def one_sandbox(task: Task, program: str) -> bool:
        marker = f"rftflow-tests-passed-{secrets.token_hex(8)}"
        run = reward.sandbox.run(f"{program}\n\n{task.metadata['tests']}\n\nprint({marker!r})\n")
        return run.ok and run.stdout.rstrip().rsplit("\n", 1)[-1] == marker

    forged = [attack for attack in FORGES_ONE_SANDBOX
              if one_sandbox(ATTACKS[attack][0], extract_program(_response(attack), ATTACKS[attack][0]))]
    assert forged == FORGES_ONE_SANDBOX
    honest = [(ADD, "def add(a, b):\n    return a + b\n"), (MEAN, "def mean(xs):\n    return sum(xs) / len(xs)\n"),
              (LARGEST, "def largest(xs):\n    return max(xs)\n")]
    assert all(one_sandbox(task, program) for task, program in honest)
    scores = reward.score_many([f"```python\n{p}```" for _, p in honest], [task for task, _ in honest])
    assert [s.value for s in scores] == [1.0, 1.0, 1.0]
