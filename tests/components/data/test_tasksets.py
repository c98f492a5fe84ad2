import json

import pytest

from rftflow.components.config import TasksetConfig
from rftflow.components.config import RewardConfig, TasksetConfig
from rftflow.components.verify.rewards import make_rewards
from rftflow.components.buffer.selectors import select_tasks
from rftflow.components.data.tasksets import TasksetError, check_taskset, load_tasks

ARITH = dict(source="reasoning_gym:chain_sum", params={"min_terms": 2, "max_terms": 2, "max_digits": 2},
             size=3000, eval_size=100, prompt_template="{expression} =")


def test_reasoning_gym_splits_are_disjoint_and_templated():
    split = load_tasks(TasksetConfig(**ARITH), seed=0)
    train, held_out = split.train, split.held_out
    assert len(held_out) == 100 and len(train) > 1000
    assert not {t.question for t in train} & {t.question for t in held_out}
    task = train[0]
    assert task.prompt == task.metadata["expression"] + " ="
    reward = make_rewards(RewardConfig(function="score_answer"), TasksetConfig(source=ARITH["source"]))
    assert reward(f" {task.answer} ", task) == 1.0 and reward("nonsense", task) < 1.0


def test_round_selection_is_deterministic_and_covers_the_taskset():
    train = load_tasks(TasksetConfig(**ARITH), seed=0).train
    first = select_tasks(train, 1, 32, seed=0)
    assert [t.task_id for t in first] == [t.task_id for t in select_tasks(train, 1, 32, seed=0)]
    seen = {id(t) for r in range(1, len(train) // 32 + 1) for t in select_tasks(train, r, 32, seed=0)}
    assert len(seen) >= len(train) - 32  # one pass over the shuffled taskset


def _write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_jsonl_taskset_loads_with_disjoint_eval(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(50)])
    split = load_tasks(TasksetConfig(source=str(path), eval_size=10), seed=1)
    assert len(split.held_out) == 10 and len(split.train) == 40 and split.quarantined.num_rows == 0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", r"t\.jsonl:3: expect_column_values_to_be_null\(parse_error\): not valid JSON"),
        ({"question": "1+1="}, r"t\.jsonl:3: expect_column_values_to_not_be_null\(answer\)"),
        ({"question": "", "answer": "2"}, r"t\.jsonl:3: expect_column_value_lengths_to_be_between\(question\)"),
        ([1, 2], r"t\.jsonl:3: .*expected an object"),
    ],
)
def test_malformed_task_row_is_named_by_file_and_line(tmp_path, row, message):  # 1 bad of 3 > 10%: stop
    path = _write_jsonl(tmp_path / "t.jsonl", [{"question": "1+1=", "answer": "2"}] * 2 + [row])
    with pytest.raises(TasksetError, match=message):
        check_taskset(TasksetConfig(source=str(path)))


def test_missing_file_unknown_dataset_and_template_field(tmp_path):
    with pytest.raises(TasksetError, match="taskset file not found"):
        check_taskset(TasksetConfig(source=str(tmp_path / "absent.jsonl")))
    with pytest.raises(TasksetError, match="not registered"):
        check_taskset(TasksetConfig(source="reasoning_gym:no_such_dataset"))
    with pytest.raises(TasksetError, match="unknown field 'nope'; available: .*expression"):
        check_taskset(TasksetConfig(source="reasoning_gym:chain_sum", prompt_template="{nope}"))


def test_invalid_utf8_is_named_by_its_line_even_after_blank_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"question": "1+1=", "answer": "2"}\n\n\n{"question": "\xff", "answer": "2"}\n')
    with pytest.raises(TasksetError, match=r"t\.jsonl:4: .*not valid UTF-8"):
        check_taskset(TasksetConfig(source=str(path)))


def test_datasets_sources_csv_save_to_disk_with_splits_and_the_hub_only_when_allowed(tmp_path):
    import datasets

    from rftflow.components.data.tasksets import TasksetError, load_tasks

    rows = [{"problem": f"what is {i} + {i}?", "solution": f"{i} + {i} = {2 * i}\n#### {2 * i:,}",
             "subject": "math" if i % 2 else "arithmetic"} for i in range(600, 640)]
    csv = tmp_path / "tasks.csv"
    datasets.Dataset.from_list(rows).to_csv(csv)
    keys = {"question_key": "problem", "answer_key": "solution", "domain_key": "subject", "answer_format": "gsm8k"}
    from_csv = load_tasks(TasksetConfig(source=str(csv), eval_size=10, **keys), seed=0)
    assert len(from_csv.train) == 30 and len(from_csv.held_out) == 10
    task = next(t for t in from_csv.train + from_csv.held_out if t.question == "what is 601 + 601?")
    assert task.answer == "1202" and task.metadata["domain"] == "math"  # "1,202" after ####: commas dropped

    disk = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:30]),
                          "test": datasets.Dataset.from_list(rows[30:])}).save_to_disk(disk)
    split = load_tasks(TasksetConfig(source=str(disk), eval_split="test", eval_size=5, **keys), seed=0)
    assert len(split.train) == 30 and len(split.held_out) == 5
    assert {t.question for t in split.held_out} <= {r["problem"] for r in rows[30:]}
    with pytest.raises(TasksetError, match=r"no split 'validation'; it has train, test"):
        load_tasks(TasksetConfig(source=str(disk), split="validation", **keys), seed=0)
    with pytest.raises(TasksetError, match=r"^taskset hf:openai/gsm8k:main: a hub dataset is downloaded only with "
                                           r"taskset.allow_download: true"):
        load_tasks(TasksetConfig(source="hf:openai/gsm8k:main"), seed=0)


def test_answers_are_extracted_from_gsm8k_and_boxed_formats():
    from rftflow.components.data.tasksets import extract_answer

    assert extract_answer("3 + 4 = 7\n#### 1,007", "gsm8k") == "1007"
    assert extract_answer("so \\boxed{\\frac{1}{2}} and then \\boxed{x^{2}}", "boxed") == "x^{2}"
    assert extract_answer("no marker 42", "gsm8k") == "no marker 42"
    assert extract_answer("#### 5", "raw") == "#### 5"


def test_the_shipped_gsm8k_sample_scores_with_the_math_reward():
    from rftflow.components.data.tasksets import load_tasks

    cfg = TasksetConfig(source="data:gsm8k-sample", answer_format="gsm8k", eval_size=200,
                        prompt_template="Question: {question}\nAnswer:")
    taskset = load_tasks(cfg, seed=0)
    assert len(taskset.held_out) == 200 and len(taskset.train) == 200
    task = taskset.held_out[0]
    assert task.answer.lstrip("-").replace(".", "").isdigit() and task.prompt.startswith("Question: ")
    reward = make_rewards(RewardConfig(function="math"), cfg)
    assert reward(f"It is {task.answer}.\n#### {task.answer}", task) == 1.0
    assert reward(f"#### {task.answer}1", task) == 0.0


def test_reasoning_gym_composite_mixtures_load_from_yaml_specs_and_score_by_their_member():
    from rftflow.components.data.tasksets import load_tasks

    cfg = TasksetConfig(source="reasoning_gym:composite", size=60, eval_size=10, params={"datasets": [
        {"name": "chain_sum", "weight": 1, "config": {"min_terms": 2, "max_terms": 2}},
        {"name": "gsm_symbolic", "weight": 1}]})
    taskset = load_tasks(cfg, seed=0)
    members = {t.metadata["source_dataset"] for t in taskset.train}
    assert members == {"chain_sum", "gsm_symbolic"}
    reward = make_rewards(RewardConfig(), cfg)
    for t in taskset.train[:6]:
        assert reward(t.answer, t) == 1.0 and reward(t.answer + "9", t) < 1.0
