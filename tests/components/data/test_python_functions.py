"""The generated Python-function taskset (`builtin:python_functions`): each family's reference body
passes its own tests in the code reward's sandboxes, and bodies that are wrong, that copy the
docstring's example or that do nothing score 0; what four cases let through, 200 more catch; the tasks
load as a taskset like any other."""

import ast
import dataclasses

import pytest

from rftflow.components.config import CodeRewardConfig, TasksetConfig
from rftflow.components.data.python_functions import FAMILIES, more_cases, python_function_entries
from rftflow.components.data.tasksets import Task, TasksetError, load_tasks, task_id
from rftflow.components.verify.code import CodeReward, check_code_tasks


def _tasks(size: int = len(FAMILIES), seed: int = 0, **params) -> list[Task]:
    return [Task(task_id(e["question"]), e["question"], e["question"], e["answer"], e["metadata"])
            for e in python_function_entries(params, size, seed)]


@pytest.fixture(scope="module")
def reward():
    reward = CodeReward(CodeRewardConfig(timeout_seconds=10, cpu_seconds=3, memory_mb=256))
    yield reward
    reward.close()


def _example_output(task: Task) -> str:
    """The value the docstring's ``>>>`` example shows, as written there."""
    lines = task.metadata["code_prompt"].splitlines()
    return next(lines[i + 1].strip() for i, line in enumerate(lines) if ">>>" in line)


def test_each_familys_reference_body_passes_and_wrong_bodies_fail_in_the_sandbox(reward):
    tasks = _tasks()
    assert sorted(t.metadata["family"] for t in tasks) == sorted(FAMILIES)
    check_code_tasks(tasks, "builtin:python_functions")  # the tests split into the two sandboxes
    wrong = {  # the shortcuts a policy could learn: each task's cases tell them from the function
        "nothing": "    pass\n",
        "the example copied": None,  # filled per task: return what the docstring shows
        "the first argument back": "    return locals()[next(iter(locals()))]\n",
    }
    responses, rows = [], []
    for task in tasks:
        responses.append(task.answer)
        rows.append(task)
        for name, body in wrong.items():
            responses.append(body if body is not None else f"    return {_example_output(task)}\n")
            rows.append(task)
    scores = reward.score_many(responses, rows)
    per_task = len(wrong) + 1
    for i, task in enumerate(tasks):
        mine = scores[i * per_task:(i + 1) * per_task]
        assert mine[0].value == 1.0, (task.metadata["family"], mine[0].reason)
        assert [s.value for s in mine[1:]] == [0.0] * len(wrong), (task.metadata["family"], [s.reason for s in mine])


def test_a_whole_function_in_a_fence_is_scored_as_the_program(reward):
    task = next(t for t in _tasks() if t.metadata["family"] == "reverse")
    name = task.metadata["entry_point"]
    right = f"```python\ndef {name}(s):\n    return ''.join(reversed(s))\n```\nIt walks the string backwards."
    wrong = f"```python\ndef {name}(s):\n    return s\n```"
    assert [s.value for s in reward.score_many([right, wrong], [task, task])] == [1.0, 0.0]


def test_the_tasks_are_drawn_from_the_seed_and_families_can_be_picked():
    assert python_function_entries({}, 40, 3) == python_function_entries({}, 40, 3)
    assert python_function_entries({}, 40, 3) != python_function_entries({}, 40, 4)
    picked = python_function_entries({"families": ["add", "reverse"]}, 10, 0)
    assert {e["metadata"]["family"] for e in picked} == {"add", "reverse"}
    for entry in picked:  # the prompt is the function to complete; the gold answer its body
        assert entry["question"].startswith(f"def {entry['metadata']['entry_point']}(")
        assert entry["answer"].startswith(f"```python\ndef {entry['metadata']['entry_point']}(")
        assert entry["metadata"]["domain"] == "code"


def test_a_taskset_of_them_holds_out_distinct_functions_and_names_an_unknown_family():
    cfg = TasksetConfig(source="builtin:python_functions", size=600, eval_size=100, domain="code")
    taskset = load_tasks(cfg, seed=0)
    assert len(taskset.held_out) == 100 and len({t.task_id for t in taskset.held_out}) == 100
    assert not {t.question for t in taskset.train} & {t.question for t in taskset.held_out}
    assert {t.metadata["family"] for t in taskset.held_out} == set(FAMILIES)
    with pytest.raises(TasksetError, match="unknown 'sort'.*known: add, times"):
        load_tasks(cfg.model_copy(update={"params": {"families": ["add", "sort"]}}), seed=0)


def test_no_task_is_passed_by_a_constant_or_by_its_first_argument_returned():
    import ast

    for entry in python_function_entries({}, 1000, 1):
        calls = [node.test for node in ast.walk(ast.parse(entry["metadata"]["tests"])) if isinstance(node, ast.Assert)]
        cases = [([ast.literal_eval(a) for a in c.left.args], ast.literal_eval(c.comparators[0])) for c in calls]
        assert len(cases) == 4, entry["metadata"]["tests"]
        assert len({repr(out) for _, out in cases}) > 1, entry["metadata"]["tests"]
        assert any(repr(out) != repr(args[0]) for args, out in cases), entry["metadata"]["tests"]


def test_more_cases_catch_what_four_cases_let_through(reward):
    """An answer off by one at a bound none of a task's four cases touches passes them; the 200 more
    cases of ``more_cases`` (drawn by the family's input maker, expected values from the gold answer)
    catch it, and the reference body passes them."""
    def never_at_the_bound(task: Task) -> bool:  # none of its four cases' lists holds its lower bound
        low = int(task.metadata["entry_point"].split("_")[1])
        lists = [ast.literal_eval(line.split("candidate(", 1)[1].rsplit(") ==", 1)[0])
                 for line in task.metadata["tests"].splitlines() if "assert" in line]
        return all(low not in xs for xs in lists)

    task = next((t for t in _tasks(400, seed=3, families=["between"]) if never_at_the_bound(t)), None)
    assert task is not None, "every generated `between` task's cases hold its lower bound"
    low = task.metadata["entry_point"].split("_")[1]
    off_by_one = task.answer.replace(f"sum({low} <= x", f"sum({low} < x")
    assert off_by_one != task.answer
    stricter = dataclasses.replace(task, metadata={**task.metadata, "tests": more_cases(task.answer, task.metadata)})
    scores = reward.score_many([task.answer, off_by_one, task.answer, off_by_one], [task, task, stricter, stricter])
    assert [s.value for s in scores] == [1.0, 1.0, 1.0, 0.0], (task.metadata["entry_point"], scores)
