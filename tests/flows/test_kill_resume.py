"""``rftflow run`` SIGKILLed at chosen points, then run again until it finishes: every trial ends
with exactly its rounds in the store and in MLflow, the configured rows in every round, no
experience twice, one MLflow run, and the final model bit for bit the uninterrupted run's (5
trials, 3 of them on S3; one more of a LoRA campaign, killed in training, whose adapter is
compared: a torn checkpoint write is a full-weight trial's, and the adapter's checkpoint goes
through the same write). Two trials are killed inside a store write, held there by the kill point
(``components/buffer/kill_point.py``): a shard's bytes stored and its commit marker not, a
checkpoint's files stored and its manifest not; the others after a step's predecessor finished and
before the step did. Also: no process outlives a killed run, and SIGTERM stops a run at a safe
point that the same command resumes.
The reference, the trials and the SIGTERM run go two at a time (single-threaded processes).

The trials share one real ``prefect server start`` (PREFECT_API_URL), so each run does not pay
for a Prefect server of its own; the orphan trial uses the run's embedded server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.flows.processes import outliving

pytestmark = pytest.mark.slow  # 17 real runs of the CLI

ROUNDS = 4
# "a?b" → "<" or ">": a held-out accuracy well away from 0 and 1 after a few steps, so it moves
# with the weights (the weights themselves are compared bit for bit too)
TASKS = [{"question": f"{a}?{b}", "answer": "<" if a < b else ">"} for a in range(10) for b in range(10) if a != b]
CAMPAIGN = ["name=killed", f"rounds={ROUNDS}", "taskset.eval_size=20", "taskset.prompt_template={question}=",
            "reward.function=exact_match", "explorer.max_new_tokens=3", "eval.max_new_tokens=3",
            "trainer.warmup_steps=30", "trainer.micro_batch_size=16", "explorer.tasks_per_round=4",
            "explorer.repeat_times=4", "buffer.expert_per_round=16", "checkpoint.every=2", "eval.every=2",
            "orchestration.task_runs=stage"]  # killed between stages: a task run per stage throughout
# the task runs of one campaign, in order (the flow logs "Task run '<name>' - Finished" after each)
STEPS = ["prepare[r=0]", "warm_start[r=0]", "evaluate[r=0]", "checkpoint[r=0]"] + [
    step for r in range(1, ROUNDS + 1) for step in
    [f"{s}[r={r}]" for s in ("explore", "verify", "buffer", "train", "sync")]
    + ([f"evaluate[r={r}]", f"checkpoint[r={r}]"] if r % 2 == 0 else [])]


def rftflow(run_dir: Path, *extra: str, env: dict) -> subprocess.Popen:
    args = [sys.executable, "-m", "rftflow.flows.cli", "run", "--run-dir", str(run_dir), "--no-progress"]
    args += [a for s in [*CAMPAIGN, f"taskset.source={env['TASKS']}", *extra] for a in ("--set", s)]
    return subprocess.Popen(args, cwd=Path(__file__).resolve().parents[2], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(run_dir: Path, *extra: str, env: dict) -> str:
    """Run the same command once: it must finish (exit 0) with no traceback; its output."""
    proc = rftflow(run_dir, *extra, env=env)
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0 or "Traceback" in out:
        raise AssertionError(f"`rftflow run` exited {proc.returncode}: {out[-3000:]}")
    return out


def kill_during(run_dir: Path, step: str, delay: float, *extra: str, env: dict) -> list[str]:
    """Start a run, SIGKILL it ``delay`` s after the step before ``step`` finished; its output lines,
    all of them (what it printed before the kill, read after it). ``AssertionError`` when the kill
    did not land in ``step``: the step had finished, or its predecessor was never seen."""
    before = STEPS[STEPS.index(step) - 1]
    proc, lines = rftflow(run_dir, *extra, env=env), []
    for line in proc.stdout:
        lines.append(line)
        if f"Task run '{before}' - Finished" in line:
            time.sleep(delay)
            break
    else:
        raise AssertionError(f"the run ended before step {before} was seen: {''.join(lines)[-3000:]}")
    proc.kill()
    proc.wait()
    lines += proc.stdout.readlines()  # what it printed before it died
    proc.stdout.close()
    finished = [line for line in lines if f"Task run '{step}' - Finished" in line]
    assert not finished, f"the kill landed after {step} had finished: {finished}"
    return lines


def kill_inside(run_dir: Path, point: str, *extra: str, env: dict) -> tuple[list[str], str]:
    """Start a run that stops inside the store write ``point`` (``RFTFLOW_KILL_POINT``, see
    ``components/buffer/kill_point.py``) and SIGKILL it there; its output lines and the key it
    stopped at. ``AssertionError`` if it ended without reaching the point."""
    ready = run_dir.parent / f"{run_dir.name}.ready"
    proc = rftflow(run_dir, *extra, env={**env, "RFTFLOW_KILL_POINT": point, "RFTFLOW_KILL_READY": str(ready)})
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    while not ready.exists() and proc.poll() is None:
        time.sleep(0.05)
    proc.kill()
    code = proc.wait()
    reader.join(timeout=60)
    proc.stdout.close()
    assert ready.exists() and code == -signal.SIGKILL, f"exited {code} before {point}: {''.join(lines)[-3000:]}"
    return lines, ready.read_text().split()[1]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_trial(run_dir: Path, reference: dict) -> None:
    """The campaign in ``run_dir`` is whole, once, and the uninterrupted one's."""
    from mlflow import MlflowClient

    from rftflow.components.buffer.experiences import ExperienceStore

    from rftflow.components.buffer.layout import recorded_store
    from rftflow.components.buffer.store import open_store

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_accuracy_after"] == reference["accuracy"]
    assert final_weights(run_dir) == reference["weights"]  # state equal, not close
    url, options = recorded_store(run_dir)
    usual = ExperienceStore(open_store(url, **options), "killed").read_kind("usual")
    per_round = usual.group_by("round").aggregate([([], "count_all")]).to_pylist()
    assert sorted((r["round"], r["count_all"]) for r in per_round) == [(r, 16) for r in range(1, ROUNDS + 1)]
    ids = usual.column("experience_id").to_pylist()
    assert len(ids) == len(set(ids))
    client = MlflowClient(summary["mlflow_tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("rftflow").experiment_id])
    assert [r.info.run_id for r in runs] == [summary["mlflow_run_id"]] and runs[0].info.status == "FINISHED"
    for key in runs[0].data.metrics:
        steps = [m.step for m in client.get_metric_history(summary["mlflow_run_id"], key)]
        assert len(steps) == len(set(steps)), f"{key} logged twice at one step: {steps}"
    rounds = sorted(m.step for m in client.get_metric_history(summary["mlflow_run_id"], "reward/mean"))
    assert rounds == list(range(1, ROUNDS + 1))


@pytest.fixture(scope="module")
def env(cli_env, tmp_path_factory):
    """``cli_env`` (one real Prefect server) and the task file of these campaigns, one torch thread.

    One thread: the weights are compared bit for bit with another process's, and in earlier CI runs
    about one process in 25 (on a loaded 2-core machine, at 2 threads) took its warm start along
    another float path than its twin — before any kill, so not a resume fault. Single-threaded
    kernels add in one fixed order; what this test checks is that resume restores the state."""
    tasks = tmp_path_factory.mktemp("tasks") / "compare.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return {**cli_env, "TASKS": str(tasks), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


# where each trial is killed: during a step (after its predecessor finished), or inside a store write
# (``<write>:<key part>``, see kill_inside): round 2's shard of experiences, round 2's checkpoint (v3)
KILL_AT = ["train[r=1]", "warm_start[r=0]", "shard:experiences/usual/round=2/", "checkpoint:checkpoints/v000003",
           "sync[r=3]"]
TRIALS = range(len(KILL_AT))
S3_TRIALS = range(2, 5)  # the trials that kill a write run on the S3 test server
# a LoRA campaign (checkpoints hold the adapter and its optimizer state), killed in these steps
LORA = ["model.lora={rank: 8, alpha: 16}", "trainer.warmup_lr=1.0e-2"]
LORA_KILL_AT = ["train[r=3]"]


def final_weights(run_dir: Path) -> str:
    """sha256 of the registered model's weights (with LoRA: its adapter's)."""
    adapter = run_dir / "model" / "adapter_model.safetensors"
    return sha256(adapter if adapter.exists() else run_dir / "model" / "model.safetensors")


def reference_run(run_dir: Path, env: dict, extra: list[str] = ()) -> dict:
    """The uninterrupted campaign: its held-out accuracy and final weights."""
    finish(run_dir, *extra, env=env)
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"accuracy": summary["eval_accuracy_after"], "weights": final_weights(run_dir)}


def kill_trial(run_dir: Path, env: dict, n: int, extra: list[str], step: str | None = None,
               store: tuple[str, dict] | None = None) -> dict:
    """Trial ``n``: kill ``rftflow run`` during its step or inside its store write (``KILL_AT[n]``
    unless given), then run the same command once, to its end. Killed inside a write: what the
    store ``store`` (URL, options) held at the kill goes in the result (``torn``: the write's own
    keys present, and whether its commit object was)."""
    step, torn = step or KILL_AT[n], None
    if "[" not in step:
        from rftflow.components.buffer.layout import recorded_store
        from rftflow.components.buffer.store import open_store

        lines, key = kill_inside(run_dir, step, *extra, env=env)
        url, options = store or recorded_store(run_dir)
        torn = _torn_write(step.split(":")[0], key, open_store(url, **options))
    else:  # into the step: at once (a stage of this campaign takes milliseconds), or into the warm start's steps
        delay = random.Random(n).uniform(0.0, 0.2) if step.startswith("warm_start") else 0.0
        lines = kill_during(run_dir, step, delay, *extra, env=env)
    finish(run_dir, *extra, env=env)
    return {"run_dir": run_dir, "lines": lines, "torn": torn}


def _torn_write(point: str, key: str, objects) -> dict:
    """What a write killed at ``point`` (the shard's or checkpoint's ``key``) left in the store."""
    from rftflow.components.buffer.layout import CHECKPOINT_MANIFEST
    from rftflow.components.buffer.shards import COMMIT_DIR

    if point == "shard":
        prefix, name = key.rsplit("/", 1)
        marker = f"{prefix}/{COMMIT_DIR}/{name.removesuffix('.parquet')}.json"
        return {"key": key, "written": objects.exists(key), "committed": objects.exists(marker)}
    return {"key": key, "written": len(objects.list(key + "/")) > 0,
            "committed": objects.exists(f"{key}/{CHECKPOINT_MANIFEST}")}


def sigterm_run(run_dir: Path, env: dict) -> dict:
    """SIGTERM after round 3's explore: the stopped run's exit code, output and MLflow run status;
    then the same command, which finishes it."""
    from mlflow import MlflowClient

    proc = rftflow(run_dir, env=env)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "Task run 'explore[r=3]' - Finished" in line:
            proc.send_signal(signal.SIGTERM)
    proc.wait()
    proc.stdout.close()
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    status = [run.info.status for run in client.search_runs([client.get_experiment_by_name("rftflow").experiment_id])]
    finish(run_dir, env=env)
    return {"run_dir": run_dir, "returncode": proc.returncode, "lines": lines, "mlflow_status": status}


@pytest.fixture(scope="module")
def runs(env, tmp_path_factory, request) -> dict:
    """Every campaign of this module, two at a time (each process is single-threaded: 2 cores, no
    thrashing): the reference, the trials (by number) and the SIGTERM run. Per job its result, or
    the exception it raised, for the job's own test to raise."""
    from concurrent.futures import ThreadPoolExecutor
    from functools import partial

    server = request.getfixturevalue("s3_server")  # sets the AWS_ variables
    s3_env = {**env, **{k: os.environ[k] for k in os.environ if k.startswith("AWS_")}}
    buckets = {n: server.new_bucket() for n in S3_TRIALS}
    extras = {n: [f"storage.url=s3://{buckets[n]}/trial{n}", f"storage.endpoint_url={server.endpoint_url}",
                  "storage.addressing_style=path"] if n in S3_TRIALS else [] for n in TRIALS}
    stores = {n: (f"s3://{buckets[n]}/trial{n}", {"endpoint_url": server.endpoint_url, "addressing_style": "path"})
              for n in S3_TRIALS}
    jobs = {"reference": (reference_run, env), "sigterm": (sigterm_run, env),
            **{n: (partial(kill_trial, n=n, extra=extras[n], store=stores.get(n)), s3_env if extras[n] else env)
               for n in TRIALS},
            "lora-reference": (partial(reference_run, extra=LORA), env),
            **{f"lora-{step}": (partial(kill_trial, n=i, extra=LORA, step=step), env)
               for i, step in enumerate(LORA_KILL_AT)}}

    chosen = {item.name for item in request.session.items if item.path == request.path}  # after -k and the like
    jobs = {name: job for name, job in jobs.items() if _needed(name, chosen)}

    def job(name) -> dict:
        work, job_env = jobs[name]
        try:
            return work(tmp_path_factory.mktemp(f"run-{name}"), job_env)
        except Exception as e:  # noqa: BLE001 — raised by the job's own test
            return {"error": e}

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(jobs, pool.map(job, jobs)))


def _needed(job, chosen: set[str]) -> bool:
    """Whether a selected test (``chosen``: their names) reads job ``job``'s result."""
    trials = {f"test_a_killed_run_resumes_to_the_uninterrupted_result[{n}]" for n in TRIALS} & chosen
    sigterm = any(name.startswith("test_sigterm") for name in chosen)
    lora = {name[name.index("[") + 1:-1] for name in chosen if name.startswith("test_a_killed_lora_run")}
    return {"reference": bool(trials) or sigterm, "sigterm": sigterm, "lora-reference": bool(lora)}.get(
        job, f"test_a_killed_run_resumes_to_the_uninterrupted_result[{job}]" in trials
        or str(job).removeprefix("lora-") in lora)


def outcome(runs: dict, name) -> dict:
    """Job ``name``'s result; its exception raised here."""
    if "error" in runs[name]:
        raise runs[name]["error"]
    return runs[name]


@pytest.fixture(scope="module")
def reference(runs) -> dict:
    reference = outcome(runs, "reference")
    assert 0 < reference["accuracy"] < 1  # a result that moves with the weights
    return reference


@pytest.mark.parametrize("trial", TRIALS)
def test_a_killed_run_resumes_to_the_uninterrupted_result(trial, runs, env, reference):
    killed = outcome(runs, trial)
    assert not any("Task run 'register" in line for line in killed["lines"]), "killed too late: the run had finished"
    if killed["torn"] is not None:  # killed inside the write: its data stored, its commit not
        assert killed["torn"]["written"] and not killed["torn"]["committed"], killed["torn"]
    check_trial(killed["run_dir"], reference)
    # the killed attempt's flow run no longer says Running in Prefect
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    state = json.loads((killed["run_dir"] / "summary.json").read_text())
    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}), get_client(sync_client=True) as client:
        crashed = client.read_flow_run(_attempts(killed["run_dir"])[0]["flow_run_id"])
    assert crashed.state.type.value == "CRASHED" and state["prefect_flow_run_id"] in crashed.state.message


@pytest.mark.parametrize("step", LORA_KILL_AT)
def test_a_killed_lora_run_resumes_to_the_uninterrupted_adapter(step, runs):
    killed = outcome(runs, f"lora-{step}")
    assert (killed["run_dir"] / "model" / "adapter_config.json").is_file()
    check_trial(killed["run_dir"], outcome(runs, "lora-reference"))


def _attempts(run_dir: Path) -> list[dict]:
    from rftflow.components.buffer.layout import recorded_store
    from rftflow.components.campaign.state import StateStore
    from rftflow.components.buffer.store import open_store

    url, options = recorded_store(run_dir)
    return [vars(a) for a in StateStore(open_store(url, **options), "killed").read().attempts]


def _children_of(pid: int) -> list[int]:
    """Processes started by ``pid`` for its embedded Prefect API (they carry its pid in their environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if f"RFTFLOW_PREFECT_PARENT={pid}".encode() in environ:
                found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to find the server process")
def test_no_process_outlives_a_killed_run(env, tmp_path):
    embedded = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}  # the run starts its own server
    proc = rftflow(tmp_path, env=embedded)
    for line in proc.stdout:
        if "Task run 'prepare[r=0]' - Finished" in line:
            break
    servers = _children_of(proc.pid)
    assert servers, "the run's embedded Prefect API was not found"
    proc.kill()
    proc.wait()
    proc.stdout.close()
    assert not outliving(set(servers)), "the Prefect server outlived its run"


def test_sigterm_stops_at_a_safe_point_in_one_line_and_the_same_command_resumes(runs, reference):
    stopped = outcome(runs, "sigterm")
    assert stopped["returncode"] == 130
    lines = [line for line in stopped["lines"] if line.startswith(("error:", "stopped:"))]
    assert len(lines) == 1 and "stopped (SIGTERM) after round 3" in lines[0]
    assert "resume with the same command (from the checkpoint of round 2)" in lines[0]
    assert not [line for line in stopped["lines"] if "Traceback" in line]
    assert stopped["mlflow_status"] == ["KILLED"]
    check_trial(stopped["run_dir"], reference)
