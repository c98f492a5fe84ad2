"""Bad input on the command line fails before any work starts, in one line naming the culprit,
and leaves nothing behind (no run dir, no MLflow database, no store)."""

import json

import pytest
from typer.testing import CliRunner

from rftflow.flows.cli import app
from tests.components.campaign.test_preflight import BAD


@pytest.fixture
def run(tmp_path):
    def invoke(*args: str, run_dir=None):
        run_dir = run_dir or tmp_path / "out"
        result = CliRunner().invoke(app, ["run", *args, "--run-dir", str(run_dir)])
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.exit_code == 2, result.output
        assert len(lines) == 1, lines  # one clear line
        assert not (tmp_path / "out").exists()  # nothing started
        return lines[0]

    return invoke


@pytest.mark.parametrize("case", sorted(BAD))
def test_every_kind_of_bad_input_is_one_line(case, run, tmp_path):
    (tmp_path / "tasks.parquet").write_text("not parquet")
    overrides, line = (value.replace("{tmp}", str(tmp_path)) if isinstance(value, str) else
                       [o.replace("{tmp}", str(tmp_path)) for o in value] for value in BAD[case])
    assert line in run(*(arg for o in overrides for arg in ("--set", o)))


def test_run_dir_naming_an_existing_file(run, tmp_path):
    (tmp_path / "taken").write_text("a file")
    assert f"run dir {tmp_path / 'taken'}: exists and is not a directory" in run(run_dir=tmp_path / "taken")


def test_malformed_task_row_names_file_and_row(run, tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n" + json.dumps({"question": "2+2="}) + "\n")
    line = run("--set", f"taskset.source={path}", "--set", "taskset.prompt_template='{question}'")
    assert "1 of 2 rows (50%) break the contract" in line
    assert f"first: {path}:2: expect_column_values_to_not_be_null(answer)" in line


def test_missing_config_file(run, tmp_path):
    assert "config file not found" in run(str(tmp_path / "absent.yaml"))
