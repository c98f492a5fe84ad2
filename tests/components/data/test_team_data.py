"""A team's own task file, checked before any work as a new user meets it: a held-out split sized to
a small file, missing columns, unreadable answers, questions with two answers, relative paths in a
config file, a missing file that says where it was looked for; such errors are never retried."""

import json
import logging
import os

import pytest

from rftflow.components.config import TasksetConfig, load_config
from rftflow.components.data.tasksets import TasksetError, check_taskset, load_tasks

PROBLEMS = [{"question": f"Ann has {i} pens and buys 3 more. How many pens?", "answer": str(i + 3)} for i in range(40)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_small_file_gets_a_held_out_split_sized_to_it_and_says_so(tmp_path, caplog):
    path = _jsonl(tmp_path / "problems.jsonl", PROBLEMS)
    with caplog.at_level(logging.WARNING, logger="rftflow"):
        check_taskset(TasksetConfig(source=str(path)))  # the default eval_size, 200, would leave nothing to train on
    assert f"taskset {path}: 40 distinct tasks, too few for taskset.eval_size 200: 8 held out (20%), 32 to train on" \
        in caplog.messages
    split = load_tasks(TasksetConfig(source=str(path)), seed=0)
    assert len(split.held_out) == 8 and len(split.train) == 32
    assert len(load_tasks(TasksetConfig(source=str(path), eval_size=20), seed=0).held_out) == 20  # half: as asked
    with pytest.raises(TasksetError, match=r"1 distinct task; a campaign needs at least 2"):
        load_tasks(TasksetConfig(source=str(_jsonl(tmp_path / "one.jsonl", PROBLEMS[:1] * 3))), seed=0)


def test_a_missing_column_is_named_with_the_columns_there_are(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [{"q": r["question"], "answer": r["answer"]} for r in PROBLEMS])
    with pytest.raises(TasksetError, match=r"p\.jsonl: no column 'question' \(taskset.question_key\); its columns: "
                                           r"q, answer$"):
        check_taskset(TasksetConfig(source=str(path)))
    csv = tmp_path / "p.csv"
    csv.write_text("problem,solution\n" + "".join(f"\"{r['question']}\",{r['answer']}\n" for r in PROBLEMS))
    with pytest.raises(TasksetError, match=r"no column 'answer' \(taskset.answer_key\); its columns: problem, "
                                           r"solution"):
        check_taskset(TasksetConfig(source=str(csv), question_key="problem"))


def test_an_answer_without_its_marker_is_a_bad_row_named_by_its_line(tmp_path):
    rows = [{"question": r["question"], "answer": f"so {r['answer']}\n#### {r['answer']}"} for r in PROBLEMS]
    rows[4]["answer"] = "about seven"
    cfg = TasksetConfig(source=str(_jsonl(tmp_path / "p.jsonl", rows)), answer_format="gsm8k")
    tasks = check_taskset(cfg)  # 1 bad row of 40: quarantined, the rest is used
    assert len(tasks) == 39 and tasks[0].answer == "3"
    assert "has no `####`" in load_tasks(cfg, seed=0).quarantined.column("reason")[0].as_py()
    for row in rows[:10]:
        row["answer"] = "about seven"
    _jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(TasksetError, match=r"p\.jsonl:1: .*'answer' has no `####` to read the answer from"):
        check_taskset(cfg)  # 10 of 40 > contracts.max_bad_fraction: refused, the rows named


def test_a_question_with_two_answers_is_refused_and_repeats_are_said(tmp_path, caplog):
    with pytest.raises(TasksetError, match=r"the question 'Ann has 2 pens.*' has two answers, '5' and '6'"):
        two = _jsonl(tmp_path / "a.jsonl", PROBLEMS + [{**PROBLEMS[2], "answer": "6"}])
        check_taskset(TasksetConfig(source=str(two)))
    path = _jsonl(tmp_path / "b.jsonl", PROBLEMS + PROBLEMS[:3])
    with caplog.at_level(logging.WARNING, logger="rftflow"):
        check_taskset(TasksetConfig(source=str(path), eval_size=5))
    assert f"taskset {path}: 3 repeated questions (train keeps each repeat)" in caplog.messages


def test_a_relative_source_is_read_from_the_config_files_folder_and_a_missing_one_says_where(tmp_path, monkeypatch):
    team = tmp_path / "team"
    team.mkdir()
    _jsonl(team / "problems.jsonl", PROBLEMS)
    (team / "campaign.yaml").write_text("taskset: {source: problems.jsonl}\n"
                                        "mixture: [{name: a, weight: 1, taskset: {source: data/more.jsonl}}]\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_config(team / "campaign.yaml")
    assert cfg.taskset.source == str(team / "problems.jsonl")
    assert cfg.mixture[0].taskset["source"] == str(team / "data" / "more.jsonl")
    assert len(check_taskset(cfg.taskset)) == 40
    with pytest.raises(TasksetError, match=rf"taskset file not found: {team}/data/more.jsonl \(looked for "):
        check_taskset(cfg.part_tasksets()["a"])
    with pytest.raises(TasksetError, match=rf"not found: problems.csv \(looked for {elsewhere}/problems.csv; a "
                                           r"relative "
                                           r"path in a config file is read from the file's folder, one given with "
                                           r"--set from the current directory\)"):
        check_taskset(load_config(team / "campaign.yaml", ["taskset.source=problems.csv", "mixture=[]"]).taskset)
    assert os.getcwd() == str(elsewhere)


def test_a_taskset_error_is_not_retried():
    from prefect.states import Failed

    from rftflow.tasks.stages import worth_retrying

    assert worth_retrying(None, None, Failed(data=TasksetError("taskset p.jsonl: no column 'question'"))) is False
    assert worth_retrying(None, None, Failed(data=ConnectionResetError("reset"))) is True


def test_lora_on_a_randomly_initialised_base_warns_in_one_line(tmp_path, caplog, monkeypatch):
    from rftflow.components.campaign import preflight as module
    from rftflow.components.campaign.preflight import preflight

    monkeypatch.setattr(module, "_WARNED", set())  # said once per process
    with caplog.at_level(logging.WARNING, logger="rftflow"):
        preflight({"model": {"lora": {"rank": 8}}, "taskset": {"size": 50, "eval_size": 5}}, tmp_path / "run")
    [line] = [m for m in caplog.messages if "model.lora" in m]
    assert line.startswith("model.lora on builtin:tiny, a randomly initialised model") and "\n" not in line
    assert "train its full weights first" in line and "pretrained" in line
