"""Ctrl-C pressed twice, as people do, in a terminal (a real pseudo-terminal, the signal to the whole
process group, the embedded Prefect server): at any moment of the stop, the second one ends the
command at once with one "stopped:" line and exit 130 (within a second of the first, it is the same
stop), never a traceback (``Exception ignored in: <module 'threading'>`` included); what it leaves
resumes. Between the trials a second ``rftflow
run`` of the same campaign is refused (2). And a warm start killed part-way (SIGKILL to the group:
the machine's OOM killer, a lost node) resumes from its own checkpoint, ending with the weights of
an uninterrupted campaign of the same seed."""

from __future__ import annotations

import hashlib
import re
import signal
import time

import pytest

from tests.conftest import SMALL
from tests.flows.user import UserRun, clean, lines_with, run_to_end, sets

pytestmark = pytest.mark.slow  # campaigns through the CLI, stopped and resumed

STOPPED = re.compile(r"^stopped: campaign twice (stopped \(SIGINT\) (at step \d+ of the warm start|after .+)|"
                     r"stopped at once \(SIGINT\)); resume with the same command \(from .+\)$")


@pytest.fixture
def embedded_env(cli_env, tmp_path):
    """No ``PREFECT_API_URL``: each run starts its own Prefect server, on a ``PREFECT_HOME`` of its own."""
    env = {k: v for k, v in cli_env.items() if k != "PREFECT_API_URL"}
    return {**env, "PREFECT_HOME": str(tmp_path / "prefect-home")}


def test_a_second_ctrl_c_stops_at_once_in_one_line_every_time_and_the_campaign_resumes(embedded_env, tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", "--run-dir", str(run_dir), *sets(*SMALL, "name=twice", "rounds=3", "trainer.warmup_steps=300",
                                                    "trainer.warmup_checkpoint_every=20")]
    # the second Ctrl-C this long after the first: the same stop (a launcher passing the first on), while the
    # campaign stops, once its stop's line is out (the interpreter's teardown)
    lines = []
    for trial, pause in enumerate((0.0, 1.2, "its line")):
        run = UserRun(args, env=embedded_env, tty=True)
        run.wait_for("warm start" if trial < 2 else "rounds")  # its bars: the campaign is under way
        if trial == 1:  # meanwhile the same command is refused: another attempt holds the campaign
            code, out = run_to_end([*args, "--no-progress"], env=embedded_env)
            assert code == 2 and re.search(r"error: campaign 'twice' is running now \(pid \d+", out), out[-3000:]
        run.interrupt()
        if pause == "its line":
            run.wait_for("stopped:", timeout=120)
        else:
            time.sleep(pause)
        try:
            run.interrupt()
        except ProcessLookupError:  # it had ended: one Ctrl-C was enough
            pass
        code, out = run.finish(timeout=120)
        assert code == 130, (pause, out[-3000:])
        clean(out)
        assert "Exception ignored" not in out, out[-3000:]
        stops = lines_with(out, "stopped:")
        assert len(stops) == 1 and STOPPED.match(stops[0].strip()), (pause, out[-3000:])
        lines.append(stops[0].strip())
    assert "stopped at once (SIGINT)" not in lines[0]  # at once: the same stop
    # whether a later trial's second Ctrl-C lands while the campaign stops ("stopped at once") or after it
    # stopped depends on the machine's pace; either way each trial above ended in one line with 130
    code, out = run_to_end(args, env=embedded_env, tty=True)  # what the stops left resumes to the end
    assert code == 0, out[-3000:]
    clean(out)


WARM_STEPS = 100  # the warm start's steps: its first checkpoint (step 20) well before its end
WARM = [*SMALL, "rounds=2", f"trainer.warmup_steps={WARM_STEPS}", "trainer.warmup_checkpoint_every=20",
        "checkpoint.every=1"]


def _model_sha(run_dir) -> str:
    return hashlib.sha256((run_dir / "model" / "model.safetensors").read_bytes()).hexdigest()


def test_a_warm_start_killed_part_way_resumes_from_its_checkpoint_to_an_uninterrupted_campaigns_weights(
        cli_env, tmp_path):
    from mlflow import MlflowClient

    from rftflow.components.buffer.store import open_store
    from rftflow.components.buffer.weights import WeightStore

    whole, cut = tmp_path / "whole", tmp_path / "cut"
    code, out = run_to_end(["run", "--run-dir", str(whole), "--no-progress", *sets(*WARM, "name=warm")], env=cli_env)
    assert code == 0, out[-3000:]
    args = ["run", "--run-dir", str(cut), "--no-progress", *sets(*WARM, "name=warm")]
    run = UserRun(args, env=cli_env)
    warm = None
    while warm is None:  # its first warm-start checkpoint: then kill the whole group, mid-way
        assert run.proc.poll() is None, run.output[-3000:]
        if (cut / "store" / "warm").is_dir():
            steps = [m["step"] for m in WeightStore(open_store((cut / "store").as_uri()), "warm").warm_starts()]
            warm = steps[-1] if steps else None
        time.sleep(0.02)
    run.interrupt(signal.SIGKILL)
    run.finish()
    store = WeightStore(open_store((cut / "store").as_uri()), "warm")
    assert store.checkpoints() == [] and 0 < store.warm_starts()[-1]["step"] < WARM_STEPS  # killed in it
    killed_at = store.warm_starts()[-1]["step"]
    code, out = run_to_end(args, env=cli_env)
    assert code == 0, out[-3000:]
    clean(out)
    summary = (cut / "summary.json").read_text()
    client = MlflowClient(f"sqlite:///{cut / 'mlflow.db'}")
    run_id = re.search(r'"mlflow_run_id": "(\w+)"', summary).group(1)
    # from its checkpoint, not its first step (a run tag: a value set once, not a chart)
    assert client.get_run(run_id).data.tags["warmup/resumed_from_step"] == str(killed_at)
    assert _model_sha(cut) == _model_sha(whole)  # the same weights, bit for bit
    assert store.warm_starts() == []  # retired by the checkpoint after the warm start


def test_ctrl_c_in_the_interpreters_last_steps_never_kills_the_command_by_the_signal(cli_env, tmp_path):
    """Python puts the default SIGINT action back at the very end of its teardown: a Ctrl-C there
    killed the command by the signal (-2, not 130) after its line was out."""
    for _ in range(5):
        run = UserRun(["run", "--run-dir", str(tmp_path / "run"), "--set", "nope=1"], env=cli_env)
        run.wait_for("error:")  # refused (2); its teardown under way: Ctrl-C pressed again and again
        while run.proc.poll() is None:
            try:
                run.interrupt()
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        code, out = run.finish()
        assert code in (2, 130) and "Traceback" not in out, (code, out)
