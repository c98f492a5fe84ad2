"""A campaign whose trainer runs in 2 processes (``accelerate launch``, or ``rftflow run`` launching
them itself; DDP over gloo, one thread each): it runs to its end with rank 0 alone writing, resumes
after rank 0 is SIGKILLed to the weights of a run never killed (also with the model sharded,
``trainer.fsdp``), refuses in one line a resume in another number of processes, and stops on a
Ctrl-C to the terminal's process group with one line."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient
from safetensors.torch import load_file

from tests.conftest import SMALL
from tests.flows.processes import family, outliving

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGN = (*SMALL, "rounds=5", "checkpoint.every=1", "trainer.processes=2", "orchestration.task_runs=stage")


def command(run_dir: Path, *extra: str, accelerate: bool = True, processes: int = 2) -> list[str]:
    """``rftflow run`` of the campaign under ``accelerate launch`` (``processes``), or alone (it then
    launches its ``trainer.processes`` itself)."""
    run = ["-m", "rftflow", "run", "--run-dir", str(run_dir), "--no-progress",
           *[a for s in (*CAMPAIGN, *extra) for a in ("--set", s)]]
    if not accelerate:
        return [sys.executable, *run]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "infra" / "accelerate" / "ddp.yaml"), "--num_processes", str(processes), *run]


@pytest.fixture(scope="module")
def env(cli_env):
    return {**cli_env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def finish(run_dir: Path, env: dict, *extra: str, accelerate: bool = True) -> str:
    done = subprocess.run(command(run_dir, *extra, accelerate=accelerate), env=env, cwd=run_dir.parent,
                          capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out[-3000:]
    return out


def final_weights(run_dir: Path) -> dict:
    newest = sorted((run_dir / "store" / "arith-mix" / "checkpoints").glob("v*"))[-1]
    return load_file(newest / "model.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(env, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("whole") / "run"
    out = finish(run_dir, env)
    assert "rounds" in out and "mlflow_run_id" in out
    return run_dir


def test_a_two_process_campaign_runs_to_its_end_with_one_writer(uninterrupted):
    summary = json.loads((uninterrupted / "summary.json").read_text())
    client = MlflowClient(summary["mlflow_tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("rftflow").experiment_id])
    assert [r.info.run_id for r in runs] == [summary["mlflow_run_id"]] and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["trainer.processes"] == "2"
    steps = sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], "loss/total"))
    assert steps == [1, 2, 3, 4, 5]  # each round's update logged once, by rank 0


def kill_rank0_in_round_3(run_dir: Path, env: dict, *extra: str) -> None:
    """Launch the campaign and SIGKILL its rank 0 in round 3, after the checkpoint of round 2; the
    launcher ends the other process and fails."""
    launcher = subprocess.Popen(command(run_dir, *extra), env=env, cwd=run_dir.parent, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    checkpoints = run_dir / "store" / "arith-mix" / "checkpoints"
    lines = []
    for line in launcher.stdout:
        lines.append(line)
        if "Task run 'explore[r=3]' - Finished" in line:
            break
    else:
        raise AssertionError("the campaign ended before round 3: " + "".join(lines[-30:]))
    assert len(list(checkpoints.glob("v*"))) >= 3
    workers = [p for p in psutil.Process(launcher.pid).children() if p.environ().get("RANK") is not None]
    assert sorted(p.environ()["RANK"] for p in workers) == ["0", "1"]
    rank0 = next(p for p in workers if p.environ()["RANK"] == "0")
    group = family(launcher.pid)
    rank0.kill()
    launcher.stdout.read()
    assert launcher.wait(timeout=120) != 0
    assert {p.pid for p in workers} <= group and not outliving(group)  # the other rank ended with the launcher


def test_a_sigkilled_two_process_campaign_resumes_to_the_weights_of_one_never_killed(uninterrupted, env, tmp_path):
    run_dir = tmp_path / "run"
    kill_rank0_in_round_3(run_dir, env)

    refused = subprocess.run(command(run_dir, "trainer.processes=1", accelerate=False), env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    line = (refused.stdout + refused.stderr).strip()
    assert len(line.splitlines()) == 1 and "trainer.processes (2 → 1)" in line, line
    launched_as_one = subprocess.run(command(run_dir, processes=1), env=env, cwd=tmp_path, capture_output=True,
                                     text=True, timeout=300)  # (the launcher adds its own report of the exit)
    out = launched_as_one.stdout + launched_as_one.stderr
    assert launched_as_one.returncode != 0 and "trainer.processes is 2 but the trainer was launched in 1 process" in out

    out = finish(run_dir, env, accelerate=False)  # the same 2 processes, launched by rftflow itself
    assert "resumed_from_round" in out
    resumed, whole = final_weights(run_dir), final_weights(uninterrupted)
    assert resumed.keys() == whole.keys()
    assert all((resumed[k] == whole[k]).all() for k in whole)


def test_a_sigkilled_campaign_that_shards_its_model_resumes_to_the_weights_of_one_never_killed(env, tmp_path):
    sharded = ("trainer.fsdp=true", "rounds=4")
    (tmp_path / "whole").mkdir()
    finish(tmp_path / "whole" / "run", env, *sharded, accelerate=False)
    run_dir = tmp_path / "run"
    kill_rank0_in_round_3(run_dir, env, *sharded)
    out = finish(run_dir, env, *sharded, accelerate=False)
    assert "resumed_from_round" in out
    resumed, whole = final_weights(run_dir), final_weights(tmp_path / "whole" / "run")
    assert resumed.keys() == whole.keys() and "model.embed_tokens.weight" in whole
    assert all((resumed[k] == whole[k]).all() for k in whole)


def test_ctrl_c_to_the_process_group_stops_both_processes_with_one_line(env, tmp_path):
    proc = subprocess.Popen(command(tmp_path / "run", "rounds=300", accelerate=False), env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    workers, lines = [], []
    for line in proc.stdout:
        lines.append(line)
        if "Task run 'explore[r=3]' - Finished" in line:
            workers = [p for p in psutil.Process(proc.pid).children(recursive=True) if "RANK" in p.environ()]
            group = family(proc.pid)
            os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole foreground group
            break
    rest = proc.stdout.read()
    assert proc.wait(timeout=120) == 130, rest
    assert len(workers) == 2 and "Traceback" not in rest and "death signal" not in rest, rest
    assert rest.strip().splitlines()[-1].startswith("stopped: campaign arith-mix stopped (SIGINT)"), rest
    assert {p.pid for p in workers} <= group and not outliving(group)
