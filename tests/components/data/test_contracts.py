"""Malformed inputs, row by row: each lands in quarantine with the right reason, and rows in =
accepted + quarantined, for experiences, task files and ingested feedback."""

import json
import math

import pyarrow as pa
import pytest

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.sampling import expert_pool
from rftflow.components.buffer.store import open_store
from rftflow.components.config import ContractsConfig, TasksetConfig
from rftflow.components.data.contracts import ContractBounds, ContractError, check, enforce
from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.buffer.experiences import store_ingested
from rftflow.components.data.ingest import validate_file
from rftflow.components.data.report import ValidationEntry, validation_report
from rftflow.components.data.tasksets import TasksetError, validated_tasks


def _row(i, **overrides):
    fields = dict(experience_id=f"e{i}", campaign="c", round=1, task_id="t", group_id=f"g{i}", source="explorer",
                  prompt="1+1=", response="2", prompt_ids=[1, 2, 3], response_ids=[4, 5],
                  response_logprobs=[-0.1, -0.2], response_mask=[1, 1], reward=1.0, model_version=0)
    return make_experience(**{**fields, **overrides})


def _reasons(verdict, key="experience_id"):
    return dict(zip(verdict.quarantined.column(key).to_pylist(), verdict.quarantined.column("reason").to_pylist()))


def test_explorer_contract_corpus():
    bounds = ContractBounds(max_model_version=1, group_size=1, max_prompt_tokens=8)
    rows = [_row(0), _row(1, reward=math.nan), _row(2, reward=math.inf), _row(3, reward=7.0),
            _row(4, response_logprobs=[-0.1]), _row(5, response_mask=[1]), _row(6, source="robot"),
            _row(7, task_id=None), _row(8, task_id=""), _row(9, prompt=""), _row(10, model_version=5),
            _row(11, response_ids=[], response_logprobs=[], response_mask=[]), _row(12, prompt_ids=list(range(9))),
            _row(13, response_logprobs=None), _row(14, group_id="pair"), _row(0, group_id="dup"),
            _row(16, response=None), _row(17, reward=None), _row(18, source=None), _row(19, campaign=None),
            _row(20, round=None), _row(21, prompt_ids=[1, None, 3]), _row(22, response_ids=[4, None]),
            _row(23, response_logprobs=[-0.1, math.nan]), _row(24, response_mask=[1, None]),
            _row(25, group_id="pair"), _row(26, response=""), _row(27, prompt_ids=[1, -2, 3]),
            _row(28, response_mask=[1, 2])]
    verdict = check(to_table(rows), "explorer", bounds)
    assert verdict.counts["rows"] == len(rows) == verdict.counts["accepted"] + verdict.counts["quarantined"]
    assert verdict.accepted.column("experience_id").to_pylist() == ["e0", "e26"]  # an empty response may be fine
    by_id = {}
    for eid, reason in zip(verdict.quarantined.column("experience_id").to_pylist(),
                           verdict.quarantined.column("reason").to_pylist()):
        by_id.setdefault(eid, []).append(reason)
    expect = {"e1": "within_bounds(reward_is_finite)", "e2": "within_bounds(reward_is_finite)", "e3": "within_bounds(reward)",
              "e4": "within_bounds(token_lengths_consistent)", "e5": "within_bounds(token_lengths_consistent)",
              "e6": "within_bounds(source_matches)", "e7": "within_bounds(task_id_present)", "e8": "within_bounds(task_id_present)",
              "e9": "within_bounds(prompt_length)", "e10": "within_bounds(model_version)",
              "e11": "within_bounds(response_tokens)", "e12": "within_bounds(prompt_tokens)", "e13": "within_bounds(has_logprobs)",
              "e14": "within_bounds(group_size)", "e16": "within_bounds(response_length)", "e17": "within_bounds(reward_is_finite)",
              "e18": "within_bounds(source_matches)", "e19": "within_bounds(campaign_present)", "e20": "within_bounds(round_valid)",
              "e21": "within_bounds(tokens_complete)", "e22": "within_bounds(tokens_complete)",
              "e23": "within_bounds(tokens_complete)", "e24": "within_bounds(tokens_complete)",
              "e25": "within_bounds(group_size)", "e27": "within_bounds(token_values_valid)",
              "e28": "within_bounds(token_values_valid)"}
    for eid, label in expect.items():
        assert any(label in r for r in by_id[eid]), (eid, by_id[eid])
    assert any("within_bounds(experience_id_is_first)" in r for r in by_id["e0"])  # the second e0 is the duplicate
    assert by_id["e1"] == ["expect_multicolumn_values_within_bounds(reward_is_finite)"]  # only the false flag is named


def test_values_hidden_under_a_null_list_are_not_read():
    # Arrow lets a null list cover values; only the rows' own elements count
    table = to_table([_row(0), _row(1), _row(2)])
    ids = table.column("prompt_ids").combine_chunks()
    hidden = pa.ListArray.from_arrays(pa.array([0, 3, 6, 9], pa.int32()), pa.array([1, 2, 3, None, -1, None, 1, 2, 3],
                                                                                   ids.type.value_type),
                                      mask=pa.array([False, True, False]))
    verdict = check(table.set_column(table.schema.get_field_index("prompt_ids"), "prompt_ids", hidden), "explorer")
    assert verdict.accepted.column("experience_id").to_pylist() == ["e0", "e2"]
    assert verdict.quarantined.column("reason").to_pylist() == ["expect_multicolumn_values_within_bounds(prompt_tokens)"]


def test_an_expectation_that_cannot_run_fails_the_check_instead_of_passing_rows(monkeypatch):
    import rftflow.components.data.contracts as contracts

    real = contracts._experience_frame
    monkeypatch.setattr(contracts, "_experience_frame", lambda *args: real(*args).drop(columns=["reward"]))
    with pytest.raises(RuntimeError, match=r"explorer contract: expect_multicolumn_values_within_bounds\(\[.*\'reward\'.*\]\) did not run"):
        check(to_table([_row(0)]), "explorer")


def test_expert_and_human_contracts_differ_from_the_explorer_one():
    demo = _row(0, source="expert", response_logprobs=None, group_id="a")
    assert check(to_table([demo]), "expert").counts["accepted"] == 1  # no log-probs needed
    verdict = check(to_table([demo]), "human")
    assert "within_bounds(source_matches)" in verdict.quarantined.column("reason")[0].as_py()
    empty = check(to_table([_row(1, source="expert", response="", group_id="b"),
                            _row(2, source="expert", response=" \n", group_id="c")]), "expert")
    assert empty.quarantined.column("reason").to_pylist() == ["expect_multicolumn_values_within_bounds(response_length)"] * 2
    blank = check(to_table([_row(3, source="human", prompt="   ", group_id="d")]), "human")
    assert blank.quarantined.column("reason").to_pylist() == ["expect_multicolumn_values_within_bounds(prompt_length)"]


def test_threshold_fails_the_batch_naming_the_first_bad_rows():
    verdict = check(to_table([_row(0), _row(1, reward=9.0), _row(2, reward=9.0)]), "explorer")
    enforce(verdict, 0.7, "round 3")  # 2 of 3 ≤ 0.7: passes
    with pytest.raises(ContractError, match=r"round 3: 2 of 3 rows \(67%\) break the contract, above "
                                            r"contracts.max_bad_fraction=0.5; first: e1: .*within_bounds\(reward\)"):
        enforce(verdict, 0.5, "round 3")


TASK_LINES = [
    json.dumps({"question": "1+1", "answer": "2"}).encode(),
    b"\xff\xfe not utf-8",
    b"{not json",
    json.dumps(["a", "list"]).encode(),
    json.dumps({"question": "2+2"}).encode(),
    json.dumps({"question": "", "answer": "0"}).encode(),
    json.dumps({"question": ["x"], "answer": "1"}).encode(),
    json.dumps({"question": "x" * 200, "answer": "1"}).encode(),
    json.dumps({"question": 12, "answer": 3}).encode(),  # numbers are fine: formatted as text
    b'{"question": "\\ud800", "answer": "1"}',  # valid JSON, a lone surrogate: not encodable text
    b'{"question": "2+2", "answer": "4", "id": ' + b"9" * 5000 + b"}",  # an integer Python will not parse
    b'{"question": "2+2", "answer": "4", "m": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",  # nested too deep
    json.dumps({"question": "   ", "answer": "1"}).encode(),  # only whitespace: empty
]


def test_task_file_corpus(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b"\n".join(TASK_LINES) + b"\n")
    cfg = TasksetConfig(source=str(path))
    with pytest.raises(TasksetError, match=rf"taskset {path}: 10 of 13 rows .* first: {path}:2: expect_column_values_to_be_null\(parse_error\): not valid UTF-8 \| {path}:3: "):
        validated_tasks(cfg, 0, ContractsConfig(max_bad_fraction=0.5))
    tasks, quarantined = validated_tasks(cfg, 0, ContractsConfig(max_bad_fraction=1.0))
    assert [t.question for t in tasks] == ["1+1", "x" * 200, "12"] and len(tasks) + quarantined.num_rows == len(TASK_LINES)
    reasons = dict(zip(quarantined.column("row").to_pylist(), quarantined.column("reason").to_pylist()))
    assert "not valid UTF-8" in reasons[2] and "not valid JSON" in reasons[3]
    assert "expected an object, got list" in reasons[4] and "not_be_null(answer)" in reasons[5]
    assert "value_lengths_to_be_between(question)" in reasons[6]
    assert "'question' must be a string, got list" in reasons[7]
    assert "lone surrogate" in reasons[10]
    assert "not readable JSON (ValueError: Exceeds the limit" in reasons[11]
    assert "not readable JSON (RecursionError" in reasons[12]
    assert "value_lengths_to_be_between(question)" in reasons[13]
    # 200 characters are within the default bound, not within max_text_chars=100
    _, short = validated_tasks(cfg, 0, ContractsConfig(max_bad_fraction=1.0, max_text_chars=100))
    assert "value_lengths_to_be_between(question)" in dict(zip(short.column("row").to_pylist(),
                                                                short.column("reason").to_pylist()))[8]


FEEDBACK = [
    {"prompt": "3 + 4 =", "response": "7", "rating": 1.0},
    {"prompt": "3 + 5 =", "response": "9", "correction": "8"},
    {"prompt": "1 + 1 =", "response": "3", "rating": 0.0},
    {"prompt": "1 + 2 =", "response": "3"},  # neither rating nor correction
    {"prompt": "1 + 3 =", "response": "4", "rating": "good"},
    {"prompt": "", "response": "4", "rating": 1.0},
    {"prompt": "x" * 5000, "response": "4", "rating": 1.0},
    {"response": "4", "rating": 1.0},
    {"prompt": "2 + 2 =", "response": "4", "rating": 7},
]


def _feedback_file(tmp_path, extra: bytes = b""):
    path = tmp_path / "feedback.jsonl"
    path.write_bytes(b"\n".join(json.dumps(r).encode() for r in FEEDBACK) + b"\n{\"prompt\": \"5 + 5 =\", "
                     b"\"response\": \"10\", \"rating\": NaN}\n\xff bad bytes\n"
                     b'{"prompt": "\\ud800", "response": "1", "rating": 1}\n'  # a lone surrogate
                     b'{"prompt": "1 + 1 =", "response": "2", "rating": 1' + b"0" * 400 + b'}\n'  # no float
                     b'{"prompt": "1 + 1 =", "response": "3", "correction": ""}\n' + extra)  # empty correction
    return path


def test_a_prompt_template_that_does_not_fit_a_row_quarantines_that_row(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [{"question": "1+1", "answer": "2", "meta": {"level": "easy"}},
            {"question": "2+2", "answer": "4", "meta": "easy"},  # text, not a mapping
            {"question": "3+3", "answer": "6", "meta": []}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = TasksetConfig(source=str(path), prompt_template="{question} ({meta[level]})")
    tasks, quarantined = validated_tasks(cfg, 0, ContractsConfig(max_bad_fraction=1.0))
    assert [t.prompt for t in tasks] == ["1+1 (easy)"]
    assert [r.count("does not fit this row") for r in quarantined.column("reason").to_pylist()] == [1, 1]


def test_feedback_corpus_is_quarantined_with_reasons_and_stored_once(tiny, tmp_path):
    _, tokenizer = tiny
    contracts = ContractsConfig(max_prompt_tokens=1000, max_bad_fraction=0.8)
    result = validate_file(_feedback_file(tmp_path), "feedback", "c", tokenizer, contracts)
    report = result.report()
    assert report["rows"] == 14 == report["accepted"] + report["quarantined"]
    assert report["by_source"] == {"human": 2, "expert": 1}  # two ratings (1.0 and 0.0), one correction
    reasons = {json.loads(i)["row"]: r for i, r in zip(result.quarantined.column("info").to_pylist(),
                                                        result.quarantined.column("reason").to_pylist())}
    assert reasons[4] == "parse: feedback needs a 'rating' or a 'correction'"
    assert reasons[5] == "parse: 'rating' must be a number, got str"
    assert "within_bounds(prompt_length)" in reasons[6]
    assert "within_bounds(prompt_tokens)" in reasons[7]
    assert reasons[8] == "parse: missing 'prompt'"
    assert "within_bounds(reward)" in reasons[9]
    assert "within_bounds(reward_is_finite)" in reasons[10]
    assert reasons[11] == "parse: not valid UTF-8"
    assert reasons[12] == "parse: not valid UTF-8 (an escaped lone surrogate)"
    assert reasons[13].startswith("parse: 'rating' 1000") and reasons[13].endswith("is out of range")
    assert reasons[14] == "expect_multicolumn_values_within_bounds(response_length)"
    correction = result.accepted.filter(pa.compute.equal(result.accepted.column("source"), "expert")).to_pylist()[0]
    assert correction["response"] == "8" and json.loads(correction["info"])["original_response"] == "9"

    store = ExperienceStore(open_store((tmp_path / "store").as_uri()), "c")
    assert store_ingested(result, store, contracts.max_bad_fraction) == {"new": 3, "already_present": 0}
    # the same file again: no duplicates
    assert store_ingested(result, store, contracts.max_bad_fraction) == {"new": 0, "already_present": 3}
    assert store.read_kind("human").num_rows == 2 and store.read_kind("quarantine").num_rows == 11
    # demonstrations the trainer samples: the correction, plus the human row rated ≥ 1.0
    assert sorted(expert_pool(store, 1.0).column("response").to_pylist()) == ["7", "8"]
    with pytest.raises(ContractError, match=r"file .*feedback.jsonl: 11 of 14 rows .* first: .*feedback.jsonl:4: parse"):
        store_ingested(result, ExperienceStore(store.objects, "other"), 0.5)
    assert store.read_kind("human").num_rows == 2  # nothing stored for the failed batch


def test_validation_report_lists_stages_and_reasons():
    verdict = check(to_table([_row(0), _row(1, reward=9.0)]), "explorer")
    entries = [ValidationEntry("experience contract", 1, 2, verdict.counts["accepted"], verdict.counts["quarantined"],
                               verdict.reasons), ValidationEntry("expert contract", 0, 5, 5, 0, {})]
    text = validation_report(entries, "demo")
    assert "| experience contract | 1 | 2 | 1 | 1 |" in text and "| expert contract | 1 | 5 | 5 | 0 |" in text
    assert "| experience contract | 1 | 2 | 1 | expect_multicolumn_values_within_bounds(reward) ×1 |" in text
    assert "expert contract | 0" not in text  # only batches that quarantined rows are listed
