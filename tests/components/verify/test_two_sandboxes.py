"""The code reward's two sandboxes: what crosses between them (literals of exact built-in types,
in frames on private pipes), the tests refused before anything runs and when they run, the task's
own helpers, the `calls` format, and the limits on a call."""

import json
import os
import re
import time
from textwrap import dedent

import pytest

from rftflow.components.config import CodeRewardConfig
from rftflow.components.data.tasksets import Task
from rftflow.components.verify.code import CodeReward, check_code_tasks
from rftflow.components.verify.protocol import (FRAME_BYTES, Closed, NotALiteral, check_literal, literal, read_frame,
                                                same_value, write_frame)
from rftflow.components.verify.tests_split import Refusal, split

SETTINGS = CodeRewardConfig(timeout_seconds=10, cpu_seconds=3, memory_mb=256)


def _task(tests: str, prompt: str = "def add(a, b):\n", entry: str | None = "add", **meta) -> Task:
    return Task("t", "q", prompt, "", {"code_prompt": prompt, "entry_point": entry, "tests": dedent(tests), **meta})


@pytest.fixture(scope="module")
def reward():
    reward = CodeReward(SETTINGS)
    yield reward
    reward.close()


def test_only_literals_of_exact_built_in_types_are_read():
    value = literal("{'a': [1, 2.5, (True, None)], 'b': {3}, 'c': set(), 'd': -0.0}")
    assert value == {"a": [1, 2.5, (True, None)], "b": {3}, "c": set(), "d": -0.0}
    for text, says in [("nan", "not finite (nan)"), ("[1, inf]", "not finite (inf)"), ("1e999", "not finite (inf)"),
                       ("-1e999", "not finite (-inf)"), ("1j", "a complex"), ("b'x'", "a bytes"), ("...", "a ellipsis"),
                       ("<Equal object at 0x1>", "not a literal"), ("__import__('os')", "not a literal"),
                       ("[" * 300 + "]" * 300, "not a literal"), ("1" * 5000, "not a literal")]:
        with pytest.raises(NotALiteral, match=re.escape(says)):
            literal(text)

    class Int(int):
        pass

    for made in (Int(3), [1, Int(3)], {"k": (Int(3),)}, True.__class__.__mro__[1]):
        with pytest.raises(NotALiteral):
            check_literal(made)


def test_results_are_compared_with_their_types():
    assert same_value((1, [2.0, "x"]), [1, [2.0 + 1e-12, "x"]])  # a tuple for a list expected (JSON has none)
    for got, expected in [(True, 1), (1, True), (2, 2.0), (2.0, 2), ("1", 1), ([1], (1,)), (None, 0), (0.3, 0.31),
                          ({"a": 1}, {"a": 1, "b": 2})]:
        assert not same_value(got, expected), (got, expected)


def test_frames_have_a_deadline_and_a_size_limit():
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    try:
        write_frame(write, "('done',)", time.monotonic() + 1)
        assert read_frame(read, time.monotonic() + 1) == "('done',)"
        os.write(write, (FRAME_BYTES + 1).to_bytes(4, "big"))
        with pytest.raises(NotALiteral, match=f"a message of {FRAME_BYTES + 1} bytes"):
            read_frame(read, time.monotonic() + 1)
        with pytest.raises(TimeoutError):
            read_frame(read, time.monotonic() + 0.05)
    finally:
        os.close(write)
    with pytest.raises(Closed):
        read_frame(read, time.monotonic() + 1)
    os.close(read)


REFUSED = {
    "candidate.__name__": ("def check(candidate):\n    assert candidate.__name__ == 'add'\ncheck(add)\n",
                           "its tests read candidate.__name__"),
    "inspect.getsource": ("import inspect\ndef check(fn):\n    assert 'for' not in inspect.getsource(fn)\ncheck(add)\n",
                          "its tests pass fn to inspect.getsource()"),
    "a function passed in": ("assert add(lambda x: x, 1) == 1\n", "its tests pass a function to add"),
    # a test that checks only a builtin passes whatever the program is: refused
    "nothing called": ("assert sum([1, 2]) == 3\n", "its tests call no function of the program"),
    "not Python": ("assert add(1, 2) ==\n", "its tests are not Python"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_tests_that_need_the_programs_objects_are_refused_before_anything_runs(case, reward):
    tests, reason = REFUSED[case]
    task = _task(tests)
    with pytest.raises(Refusal, match=reason):
        split(task.metadata["tests"], task.prompt, "add")
    with pytest.raises(ValueError, match=rf"^taskset tasks.jsonl: task t cannot be scored by the code reward: "
                                         rf"{re.escape(reason)}"):
        check_code_tasks([task, _task("assert add(1, 2) == 3\n")], "tasks.jsonl")
    score = reward.score_many(["    return a + b\n"], [task])[0]
    assert score.value is None and score.reason.startswith(f"task t: {reason}")  # quarantined, never 0 or 1


def test_what_the_source_does_not_show_is_refused_when_it_runs(reward):
    tasks = [_task("assert add(1, 2) == 3\nfunction = add  # an alias the source check lets by\n"
                   "assert function.__name__ == 'add'\n"),
             _task("class Box:\n    pass\nassert add(Box(), 1) == 1\n"),
             _task("import math\nassert add(math.inf, 1) == math.inf\n")]
    scores = reward.score_many(["    return a + b\n"] * 3, tasks)
    assert [s.value for s in scores] == [None, None, None]
    assert scores[0].reason == ("the task's tests cannot run in two sandboxes: the tests read add.__name__: the "
                                "program's objects stay in its sandbox")
    assert scores[1].reason.startswith("the task's tests cannot run in two sandboxes: they pass the program something "
                                       "that is not a literal of built-in types: \"('call', 'add', (<__main__.Box")
    assert scores[2].reason.endswith("they pass the program a float that is not finite (inf)")


def test_the_helpers_the_tests_call_are_the_tasks_and_the_program_stays_out_of_the_tests_sandbox(reward):
    """A one-sandbox harness lets a program redefine the helper its tests call (an identity
    ``encode`` makes an identity ``decode`` pass) and lets the tests read the program; here the
    tests get the task's ``encode`` and a sandbox without the program's text."""
    prompt = "def encode(s):\n    return s[::-1]\n\n\ndef decode(s):\n"
    task = _task("import os\nassert decode(encode('abc')) == 'abc'\n"
                 "assert not any('SECRET-' + '7f3a' in open(f).read() for f in os.listdir('.'))\n",
                 prompt=prompt, entry="decode")
    cheat = "```python\ndef encode(s):\n    return s\ndef decode(s):\n    return s  # SECRET-7f3a\n```"
    honest = "    return s[::-1]  # SECRET-7f3a\n"
    scores = reward.score_many([cheat, honest], [task, task])
    assert scores[0].value == 0.0 and scores[0].reason == "exit 1: AssertionError"
    assert scores[1].value == 1.0


def test_names_the_tests_call_without_defining_them_are_the_programs_and_exceptions_cross(reward):
    """MBPP's form (no entry point, no ``candidate``); an exception the tests expect is raised in
    their sandbox as the built-in it was (by name: the name is all that crosses); one of the
    program's own classes is not a built-in there."""
    task = _task("""
        assert double(2) == 4
        try:
            double(-1)
        except ValueError as e:
            assert str(e) == 'negative'
        else:
            raise AssertionError('no ValueError')
    """, prompt="", entry=None)
    raises = "def double(n):\n    if n < 0:\n        raise ValueError('negative')\n    return 2 * n\n"
    own = raises.replace("ValueError", "NegativeError", 1) + "class NegativeError(Exception):\n    pass\n"
    scores = reward.score_many([raises, own], [task, task])
    assert scores[0].value == 1.0
    assert scores[1].value == 0.0 and scores[1].reason == "exit 1: CandidateError: NegativeError: negative"


def test_a_call_past_the_wall_limit_or_a_reply_past_the_frame_limit_scores_0():
    short = CodeReward(SETTINGS.model_copy(update={"timeout_seconds": 2}))
    try:
        scores = short.score_many(["    import time\n    time.sleep(60)\n", "    return 'x' * (2 << 20)\n"],
                                  [_task("assert add(1, 2) == 3\n")] * 2)
    finally:
        short.close()
    assert scores[0].value == 0.0 and scores[0].reason == "timed out after 2 s"
    assert scores[1].value == 0.0 and scores[1].reason.startswith("add(1, 2) answered a message of ")


def test_the_program_passes_only_when_the_tests_ran_to_their_end_and_it_loaded(reward):
    """Tests that stop early with exit status 0 pass nothing; a program that does not load fails
    even when the tests, as it turns out, never call it."""
    early = _task("import sys\nsys.exit(0)\nassert add(2, 3) == 5\n")
    never = _task("if 1 == 2:\n    add(1, 2)\n")
    scores = reward.score_many(["    return 0\n", "    return (\n"], [early, never])
    assert (scores[0].value, scores[0].reason) == (0.0, "the tests did not run to their end")
    assert scores[1].value == 0.0 and scores[1].reason.startswith(
        "the program ended before its functions could be called: exit 1: SyntaxError")


CALLS = [{"args": [2, 3], "expected": 5}, {"args": [[1, 2], [3]], "expected": [1, 2, 3]},
         {"args": [], "kwargs": {"a": 0.5, "b": 0.25}, "expected": 0.75}]


def test_the_calls_format_compares_results_in_the_parent_with_their_types(reward):
    task = Task("t-calls", "add", "", "", {"entry_point": "add", "calls": CALLS})
    programs = {"def add(a, b):\n    return a + b\n": (1.0, None),
                "def add(a, b):\n    return tuple(a + b) if isinstance(a, list) else a + b\n": (1.0, None),
                "def add(a, b):\n    return a * b if a == 2 else a + b\n": (0.0, "add(2, 3) returned 6, expected 5"),
                "def add(a, b):\n    return a + b == 5 or a + b\n": (0.0, "add(2, 3) returned True, expected 5"),
                "def add(a, b):\n    raise ValueError('no')\n": (0.0, "add(2, 3) raised ValueError: no"),
                "def add(a, b):\n    return float('nan')\n": (0.0, "add(2, 3) answered a float that is not finite "
                                                                   "(nan)")}
    scores = reward.score_many(list(programs), [task] * len(programs))
    assert [(s.value, s.reason) for s in scores] == list(programs.values())
    for cases, reason in [([], "its calls are not a non-empty list of cases"),
                          ([{"args": [1]}], "its call 1 is not {args: [...], kwargs: {...}, expected: ...}"),
                          ([{"args": [1], "kwargs": {"b": {1, 2}}, "expected": float("nan")}],
                           "its call 1 holds a float that is not finite (nan)")]:
        with pytest.raises(ValueError, match=re.escape(reason)):
            check_code_tasks([Task("t-bad", "add", "", "", {"entry_point": "add", "calls": cases})], "tasks.jsonl")


def test_a_campaign_whose_tasks_tests_inspect_the_program_is_refused_at_preflight(tmp_path, default_config, small):
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.config import ConfigError

    rows = [{"question": "add two numbers", "answer": "    return a + b\n", "code_prompt": "def add(a, b):\n",
             "entry_point": "add", "domain": "code", "tests": tests} for tests in (
        "assert add(2, 3) == 5\n", "import inspect\nassert 'return' in inspect.getsource(add)\n")]
    rows[1]["question"] = "add two numbers, in source"
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    overrides = [*small, f"taskset.source={path}", "taskset.eval_size=1", "taskset.prompt_template='{question}'",
                 "reward.function=code"]
    with pytest.raises(ConfigError, match=re.escape(f"taskset {path}: task ") + r"\w+ cannot be scored by the code "
                       r"reward: its tests pass add to inspect\.getsource\(\): only calls cross between sandboxes$"):
        preflight(default_config, tmp_path / "run", overrides)
