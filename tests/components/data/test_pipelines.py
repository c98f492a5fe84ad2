"""Pipeline operators on hand-built tables; rows in = kept + dropped over a whole pipeline."""

import pyarrow as pa
import pytest

from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.data.pipelines import check_pipeline, register_operator, run_pipeline
from rftflow.components.buffer.selectors import PassRates
from rftflow.components.data.tasksets import Task, tasks_to_table


def _tasks(*qa):
    return tasks_to_table([Task(f"t{i}", q, q + " =", a, {}) for i, (q, a) in enumerate(qa)])


def _exp(i, group, reward, response=None, n_tokens=2, eid=None):
    return make_experience(experience_id=eid or f"e{i}", campaign="c", round=1, task_id=f"t{group}",
                           group_id=f"g{group}", source="explorer", prompt="p", response=response or str(i), prompt_ids=[1],
                           response_ids=list(range(n_tokens)), reward=reward, model_version=0)


def test_task_pipeline_normalizes_filters_dedupes_and_accounts_for_every_row():
    table = _tasks(("1 +\u00a0 1", "2"), ("1 + 1", "2"), ("x" * 50, "1"), ("3+4", "7"))
    result = run_pipeline("tasks", table, [{"op": "normalize"}, {"op": "length_filter", "max_chars": 20},
                                           {"op": "dedupe"}])
    assert result.kept.column("question").to_pylist() == ["1 + 1", "3+4"]
    assert result.kept.num_rows + result.dropped.num_rows == 4
    assert result.counts == {"0:normalize": 0, "1:length_filter": 1, "2:dedupe": 1}
    assert sorted(result.dropped.column("reason").to_pylist()) == ["pipeline:dedupe()",
                                                                   "pipeline:length_filter(max_chars=20)"]


def test_prioritize_orders_by_distance_to_target_and_synthesize_adds_generated_tasks():
    rates = PassRates()
    rates.add_round(1, [("t0", 1.0)] * 6 + [("t1", 0.0)] * 6 + [("t2", 1.0), ("t2", 0.0)])
    table = _tasks(("a", "1"), ("b", "2"), ("c", "3"))
    ordered = run_pipeline("tasks", table, [{"op": "prioritize", "target": 0.5}], pass_rates=rates).kept
    assert ordered.column("task_id").to_pylist()[0] == "t2"
    steps = [{"op": "synthesize", "dataset": "chain_sum", "n": 20, "params": {"min_terms": 2, "max_terms": 2,
                                                                                "max_digits": 1}}]
    grown = run_pipeline("tasks", table, steps, seed=3).kept
    new = grown.slice(3).to_pylist()
    assert len(new) == 20 and all(all(abs(int(x)) < 10 for x in r["question"].split("=")[0].replace("+", " ")
                                      .replace("-", " ").split() if x.strip().lstrip("-").isdigit()) for r in new)
    assert run_pipeline("tasks", table, steps, seed=3).kept.equals(grown)  # deterministic by seed


def test_experience_pipeline_shapes_filters_and_dedupes():
    rows = [_exp(0, 0, 1.0), _exp(1, 0, 0.0), _exp(2, 1, 1.0), _exp(3, 1, 1.0), _exp(4, 0, 0.0, response="1"),
            _exp(5, 2, 1.0, n_tokens=30), _exp(6, 2, 0.0), _exp(0, 3, 0.5, eid="e0", response="z")]
    steps = [{"op": "shape_reward", "scale": 2.0, "add": -1.0, "clip": [-1, 0.5]}, {"op": "dedupe"},
             {"op": "length_filter", "max_tokens": 16}, {"op": "drop_zero_variance"}]
    result = run_pipeline("experiences", to_table(rows), steps)
    assert result.kept.num_rows + result.dropped.num_rows == len(rows)
    assert result.kept.column("experience_id").to_pylist() == ["e0", "e1"]
    assert result.kept.column("reward").to_pylist() == [0.5, -1.0]  # 2·1 − 1 = 1 clipped to 0.5; 2·0 − 1
    assert dict(result.kept.column("rewards")[0].as_py())["unshaped"] == 1.0
    twice = run_pipeline("experiences", result.kept, [{"op": "shape_reward", "scale": 2.0}])
    assert [k for k, _ in twice.kept.column("rewards")[0].as_py()].count("unshaped") == 1
    assert dict(twice.kept.column("rewards")[0].as_py())["unshaped"] == 1.0  # still the verifier's reward
    assert result.counts == {"0:shape_reward": 0, "1:dedupe": 2, "2:length_filter": 1, "3:drop_zero_variance": 3}


def test_check_pipeline_names_the_step_and_user_operators_register():
    with pytest.raises(ValueError, match=r"pipelines.experiences\[1\]: unknown operator 'nope'; known: dedupe, "):
        check_pipeline("experiences", [{"op": "dedupe"}, {"op": "nope"}])
    with pytest.raises(ValueError, match=r"pipelines.tasks\[0\] \(length_filter\): unknown option\(s\) max_len"):
        check_pipeline("tasks", [{"op": "length_filter", "max_len": 3}])
    # option values are checked against the operator's annotations before any round runs
    with pytest.raises(ValueError, match=r"\(shape_reward\): option clip=\[1\]: Field required at \[1\]"):
        check_pipeline("experiences", [{"op": "shape_reward", "clip": [1]}])
    with pytest.raises(ValueError, match=r"\(length_filter\): option max_tokens='many': Input should be a valid integer"):
        check_pipeline("experiences", [{"op": "length_filter", "max_tokens": "many"}])
    shaped = run_pipeline("experiences", to_table([_exp(0, 0, 1.0)]), [{"op": "shape_reward", "scale": "2"}]).kept
    assert shaped.column("reward").to_pylist() == [2.0]  # "2" read as the number the annotation asks for

    @register_operator("experiences", "only_correct")
    def only_correct(table):
        keep = pa.compute.greater_equal(table.column("reward"), 1.0)
        return table.filter(keep), table.filter(pa.compute.invert(keep))

    result = run_pipeline("experiences", to_table([_exp(0, 0, 1.0), _exp(1, 0, 0.0)]), [{"op": "only_correct"}])
    assert result.kept.num_rows == 1 and result.dropped.column("reason").to_pylist() == ["pipeline:only_correct()"]
