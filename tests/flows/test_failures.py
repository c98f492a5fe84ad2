"""What goes wrong for users, through the CLI as they run it: two starts on one run dir at once, a
corrupt newest checkpoint (and none usable), a store endpoint that hangs, a failed run's exit code,
and the current directory a campaign is started from (left as it was)."""

from __future__ import annotations

import hashlib
import json
import re
import time
from urllib.parse import urlsplit

import pytest

from tests.flows.user import UserRun, clean, lines_with, run_to_end, sets

pytestmark = pytest.mark.slow  # real CLI runs, two at a time for the races

SMALL = ["taskset.size=300", "taskset.eval_size=10", "trainer.micro_batch_size=16", "explorer.tasks_per_round=4",
         "explorer.repeat_times=4", "buffer.expert_per_round=8"]


def _run_args(run_dir, *extra: str) -> list[str]:
    return ["run", "--run-dir", str(run_dir), "--no-progress", *sets(*SMALL, *extra)]


def _mlflow_runs(run_dir) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rftflow")
    return client.search_runs([experiment.experiment_id]) if experiment else []


def _state(run_dir, name: str):
    from rftflow.components.buffer.layout import recorded_store
    from rftflow.components.campaign.state import StateStore
    from rftflow.components.buffer.store import open_store

    url, options = recorded_store(run_dir)
    return StateStore(open_store(url, **options), name).read()


def _weights(run_dir) -> str:
    return hashlib.sha256((run_dir / "model" / "model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize("apart", [0.0, 0.6, 1.2])  # the second start this much later (s)
def test_two_starts_on_one_run_dir_leave_one_campaign_and_refuse_the_other_in_one_line(cli_env, tmp_path, apart):
    run_dir = tmp_path / "run"
    args = _run_args(run_dir, "name=race", "rounds=2", "trainer.warmup_steps=50")  # a few seconds of work
    first = UserRun(args, env=cli_env)
    time.sleep(apart)
    second = UserRun(args, env=cli_env)
    outcomes = [first.finish(), second.finish()]
    for _, out in outcomes:
        assert "Traceback" not in out, out[-3000:]
    codes = sorted(code for code, _ in outcomes)
    assert codes in ([0, 2], [0, 0]), outcomes
    for code, out in outcomes:
        if code == 2:  # it lost to the live one: refused in one line
            errors = lines_with(out, "error:")
            assert len(errors) == 1 and re.search(
                r"campaign 'race' (is running now \(pid \d+|was started by another process)", errors[0]), out[-2000:]
    if codes == [0, 0]:  # the second came after the first had finished (its start-up outlasted the campaign)
        assert sum("finished at" in out and "nothing to do" in out for _, out in outcomes) == 1, outcomes
    assert len(_mlflow_runs(run_dir)) == 1
    assert len(_state(run_dir, "race").attempts) == 1


CORRUPT = ["name=corrupt", "rounds=4", "trainer.warmup_steps=20", "checkpoint.every=2", "eval.every=2",
           "orchestration.task_runs=stage", "checkpoint.keep_last=3"]


@pytest.fixture(scope="module")
def uninterrupted(cli_env, tmp_path_factory) -> str:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    code, out = run_to_end(_run_args(run_dir, *CORRUPT), env=cli_env)
    assert code == 0, out[-3000:]
    return _weights(run_dir)


def _stop_after(run_dir, step: str, env: dict) -> None:
    """Run the campaign and stop it (SIGTERM) once ``step`` finished (it stops after the step running then)."""
    run = UserRun(_run_args(run_dir, *CORRUPT), env=env)
    run.wait_for(f"Task run '{step}' - Finished")
    run.interrupt(15)
    code, out = run.finish()
    assert code == 130 and "stopped (SIGTERM) after round" in out, out[-3000:]


def _truncate(run_dir, version: int) -> None:
    weights = run_dir / "store" / "corrupt" / "checkpoints" / f"v{version:06d}" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])


def test_a_truncated_newest_checkpoint_is_set_aside_and_the_one_before_resumes_to_the_same_result(
        cli_env, tmp_path, uninterrupted):
    run_dir = tmp_path / "run"
    _stop_after(run_dir, "checkpoint[r=4]", cli_env)  # checkpoints v1 (round 0), v3 (round 2), v5 (round 4)
    _truncate(run_dir, 5)
    code, out = run_to_end(_run_args(run_dir, *CORRUPT), env=cli_env)
    assert code == 0, out[-3000:]
    assert "Traceback" not in out
    warned = lines_with(out, "is corrupt")
    assert len(warned) == 1 and "corrupt/checkpoints/v000005 (round 4) is corrupt: model.safetensors has 1000 bytes" \
        in warned[0] and "set aside; resuming from the checkpoint before it" in warned[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from_round"] == 2 and _weights(run_dir) == uninterrupted
    runs = _mlflow_runs(run_dir)
    assert [r.info.status for r in runs] == ["FINISHED"]


def test_with_no_whole_checkpoint_the_campaign_ends_failed_and_status_says_why(cli_env, tmp_path):
    from typer.testing import CliRunner

    from rftflow.flows.cli import app

    run_dir = tmp_path / "run"
    _stop_after(run_dir, "checkpoint[r=2]", cli_env)
    _truncate(run_dir, 1)
    _truncate(run_dir, 3)
    code, out = run_to_end(_run_args(run_dir, *CORRUPT), env=cli_env)
    assert code == 1 and "Traceback" not in out, out[-3000:]
    errors = lines_with(out, "error:")
    reason = "campaign corrupt: none of its 2 checkpoints in"
    assert len(errors) == 1 and reason in errors[0] and "--restart starts it over" in errors[0]
    assert [r.info.status for r in _mlflow_runs(run_dir)] == ["FAILED"]
    state = _state(run_dir, "corrupt")
    assert state.status == "failed" and reason in state.error
    status = CliRunner().invoke(app, ["status", str(run_dir)], terminal_width=400)
    cells = dict(tuple(c.strip() for c in line.split("│")[1:3]) for line in status.output.splitlines()
                 if line.count("│") == 3)
    assert status.exit_code == 0 and cells["status"] == "failed" and reason in cells["last error"]


def test_a_store_that_hangs_fails_after_its_outage_budget_and_the_same_command_resumes(cli_env, tmp_path, s3_server,
                                                                                     s3_bucket):
    from rftflow.components.buffer.store import open_store
    from tests.faultproxy import FaultProxy

    direct = open_store(f"s3://{s3_bucket}/c", endpoint_url=s3_server.endpoint_url)
    budget = 20
    with FaultProxy(urlsplit(s3_server.endpoint_url).port) as proxy:
        env = {**cli_env, **s3_server.env}
        args = _run_args(tmp_path / "run", "name=hang", "rounds=4", "trainer.warmup_steps=10",
                         f"storage.url=s3://{s3_bucket}/c", "storage.addressing_style=path",
                         f"storage.endpoint_url={proxy.endpoint_url}", f"storage.outage_seconds={budget}")
        run = UserRun(args, env=env)
        while not direct.exists("hang/experiences/usual/round=2/_commit/part-00000.json"):
            assert run.proc.poll() is None, run.output[-3000:]
            time.sleep(0.05)
        proxy.hang()  # accepts connections, never answers: a frozen server
        code, out = run.finish()
        assert code == 1 and "Traceback" not in out and "NoneType: None" not in out, out[-3000:]
        warnings = lines_with(out, "retrying for up to 20 s")
        assert len(warnings) == 1 and "ReadTimeoutError" in warnings[0]
        failed = lines_with(out, "error:")
        assert len(failed) == 1, out[-3000:]
        waited = int(re.search(r"unavailable for (\d+) s", failed[0]).group(1))
        assert budget / 2 <= waited <= 2 * budget, failed[0]  # the figure itself: the closing note
        assert failed[0].endswith("run the same command again once it is back")
        proxy.forward()
        code, out = run_to_end(args, env=env)
    assert code == 0, out[-3000:]
    clean(out)
    usual = sorted(k.split("/")[3] for k in direct.list("hang/experiences/usual/") if k.endswith(".parquet"))
    assert usual == [f"round={r}" for r in range(1, 5)]


def test_a_failed_run_exits_1_in_one_line_and_nothing_lands_in_the_current_directory(cli_env, tmp_path):
    embedded = {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"}  # the default: its own Prefect server
    embedded |= {"HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "home" / ".prefect")}
    (tmp_path / "home").mkdir()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    code, out = run_to_end(_run_args(tmp_path / "run", "name=fine", "rounds=2", "trainer.warmup_steps=2",
                                     "promotion.min_accuracy=0"), env=embedded, cwd=cwd)
    assert code == 0, out[-3000:]
    clean(out)
    code, out = run_to_end(["promote", "--run-dir", str(tmp_path / "run"), *sets(*SMALL, "name=fine", "rounds=2",
                                                                                  "trainer.warmup_steps=2")],
                           env=embedded, cwd=cwd)
    assert code == 0 and "arith-tiny v1: not promoted (v1 is already the champion)" in out, out[-3000:]
    # data that breaks its contract (every demonstration's reward below contracts.reward_min) fails the run: exit 1
    code, out = run_to_end(_run_args(tmp_path / "bad", "name=bad", "rounds=2", "trainer.warmup_steps=2",
                                     "contracts.reward_min=2", "contracts.reward_max=3"), env=embedded, cwd=cwd)
    assert code == 1 and "Traceback" not in out, out[-3000:]
    errors = lines_with(out, "error:")
    assert len(errors) == 1 and "expert demonstrations: 246 of 246 rows (100%) break the contract" in errors[0]
    assert sorted(p.name for p in cwd.iterdir()) == []


def test_an_embedded_prefect_api_that_does_not_answer_in_time_fails_in_one_line_naming_the_setting(cli_env, tmp_path):
    """A machine too busy for the embedded Prefect API to come up within its startup budget: one line
    naming the setting, exit 1, no traceback; nothing ran, so the same command starts the campaign."""
    embedded = {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"}  # the default: its own Prefect server
    embedded |= {"HOME": str(tmp_path / "home"), "PREFECT_HOME": str(tmp_path / "home" / ".prefect"),
                 "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "0"}  # a HOME not made yet: rftflow makes it
    code, out = run_to_end(_run_args(tmp_path / "run", "name=busy"), env=embedded)
    assert code == 1 and "Traceback" not in out, out[-3000:]
    errors = lines_with(out, "error:")
    assert len(errors) == 1 and "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in errors[0], out[-3000:]
    assert "did not answer within 0 s" in errors[0]
