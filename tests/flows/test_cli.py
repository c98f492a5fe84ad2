"""Bad input fails before any work starts, in one line naming the culprit."""

import json

import pytest
from typer.testing import CliRunner

from flows.cli import app


@pytest.fixture
def run(tmp_path):
    def invoke(*args: str):
        result = CliRunner().invoke(app, ["run", *args, "--run-dir", str(tmp_path / "out")])
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code == 2, result.output
        assert len(lines) == 1, lines  # one clear line
        assert not (tmp_path / "out").exists()  # nothing started
        return lines[0]

    return invoke


def test_unknown_key(run):
    assert "unknown config key 'trainer.learning_rate'" in run("--set", "trainer.learning_rate=0.1")


def test_value_of_wrong_type(run):
    assert "config key 'explorer.repeat_times'" in run("--set", "explorer.repeat_times=lots")


def test_missing_task_file(run, tmp_path):
    assert f"taskset file not found: {tmp_path / 'nope.jsonl'}" in run("--set", f"taskset.source={tmp_path / 'nope.jsonl'}")


def test_malformed_task_row_names_file_and_row(run, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n" + json.dumps({"question": "2+2="}) + "\n")
    line = run("--set", f"taskset.source={path}", "--set", "taskset.prompt_template='{question}'")
    assert "1 of 2 rows (50%) break the contract" in line
    assert f"first: {path}:2: expect_column_values_to_not_be_null(answer)" in line


def test_missing_config_file(run, tmp_path):
    assert "config file not found" in run(str(tmp_path / "absent.yaml"))
