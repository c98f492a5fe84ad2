"""Every mode with a multi-turn workflow (the built-in guess-a-number game): both, async, an
explorer and a trainer as two processes' roles on one store, bench; and a run SIGKILLed in the
middle of its episodes resumes, redoing the round's episodes with no row twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.compute as pc
import pytest
import torch

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.layout import open_run_store
from rftflow.components.campaign.bench import bench
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun

GAME = ["taskset.source=builtin:guess_number", "taskset.workflow=multi_turn", "taskset.domain=game",
        "taskset.prompt_template='guess {low}-{high}:'", "taskset.size=300", "taskset.eval_size=8",
        "taskset.params={low: 1, high: 32}", "reward.function=env_return", "workflow.max_turns=4",
        "explorer.max_new_tokens=4", "eval.max_new_tokens=4", "trainer.warmup_steps=20"]


def _episodes_ok(store, rounds: list[int], per_round: int) -> None:
    usual = store.read_kind("usual")
    assert sorted(set(usual.column("round").to_pylist())) == rounds
    assert usual.num_rows == len(set(usual.column("experience_id").to_pylist())) == per_round * len(rounds)
    assert set(usual.column("domain").to_pylist()) == {"game"} and usual.column("turns").null_count == 0


def test_both_and_async_run_episodes_and_log_their_metrics(tmp_path, default_config, small):
    both = CampaignRun(preflight(default_config, tmp_path / "both", [*small, *GAME]))
    summary = both.run()
    _episodes_ok(both.campaign.store, [1, 2], 16)
    history = both.tracker.client.get_metric_history(both.tracker.run_id, "episode/turns_mean")
    assert [m.step for m in history] == [1, 2] and all(1 <= m.value <= 4 for m in history)
    # the summary's accuracy is the final policy's: its greedy games, played again, win as often
    assert summary["eval_accuracy_after"] == pytest.approx(both.campaign.evaluate()["accuracy/held_out"], abs=1e-4)
    # DuckDB reads the turns column of the stored shards
    shards = str(tmp_path / "both" / "store" / "arith-mix" / "experiences" / "usual" / "*" / "*.parquet")
    roles = dict(duckdb.sql(f"SELECT u.t.role, count(*) FROM read_parquet('{shards}', hive_partitioning = true), "
                            "unnest(turns) AS u(t) GROUP BY 1").fetchall())
    assert roles["assistant"] >= 32 and set(roles) <= {"assistant", "user"}

    run = CampaignRun(preflight(default_config, tmp_path / "async", [
        *small, *GAME, "mode=async", "rounds=3", "sync.offset=1", "algorithm.max_staleness=1"]))
    run.run()
    _episodes_ok(run.campaign.store, [1, 2, 3], 16)
    usual = run.campaign.store.read_kind("usual")
    for r in (1, 2, 3):
        versions = usual.filter(pc.equal(usual.column("round"), r)).column("model_version").to_pylist()
        assert all(0 <= r - v <= 1 for v in versions)


def test_the_warm_start_ends_at_the_first_check_that_reaches_warmup_until(tmp_path, default_config, small, caplog):
    def warm_start(name: str, until: float) -> tuple[dict[str, float], list[float], CampaignRun]:
        run = CampaignRun(preflight(default_config, tmp_path / name, [
            *small, *GAME, "trainer.warmup_steps=30", f"trainer.warmup_until={until}", "trainer.warmup_check_every=5"]))
        campaign, checks = run.campaign, []
        measure = campaign.warm.accuracy
        campaign.warm.accuracy = lambda: checks.append(measure()) or checks[-1]
        campaign.prepare()
        return campaign.warm_start(), checks, run

    metrics, checks, _ = warm_start("all", 1.0)  # never reached: every step runs, checked every 5
    assert metrics["warmup/steps"] == 30 and len(checks) == 6 and max(checks) > 0
    assert f"the warm start ran all 30 steps without reaching trainer.warmup_until 1 (last check: {checks[-1]:.3f})" \
        in caplog.text
    caplog.clear()
    first = next(i for i, c in enumerate(checks) if c == max(checks))
    metrics, again, run = warm_start("early", max(checks))  # the same campaign stops at the first check reaching it
    assert again == checks[:first + 1] and metrics["warmup/steps"] == 5 * (first + 1)
    assert metrics["warmup/check_accuracy"] == max(checks) and "without reaching" not in caplog.text
    # no step after the check that ended it, and the explorer got those weights: its greedy accuracy
    # on the same training tasks is the check's (decoded the same way, from its own copy)
    campaign = run.campaign
    explorer, policy = campaign.engine.model.state_dict(), campaign.trainer.unwrapped.state_dict()
    assert all(torch.equal(explorer[k], policy[k]) for k in policy)
    assert campaign.evaluate(campaign.splits.train[:64])["accuracy/held_out"] == max(checks)


def test_warmup_check_near_checks_every_step_once_a_check_reaches_it(tmp_path, default_config, small):
    run = CampaignRun(preflight(default_config, tmp_path / "near", [
        *small, *GAME, "trainer.warmup_steps=30", "trainer.warmup_until=0.8", "trainer.warmup_check_every=5",
        "trainer.warmup_check_near=0.4"]))
    campaign, step, checked = run.campaign, [0], []
    scripted = iter([0.1, 0.5, 0.0, 0.3, 0.9])  # the 2nd reaches 0.4: every step from then on, lower or not
    # a step's progress is reported after its check (with the check's accuracy): the step checked is the next one
    campaign.warm.accuracy = lambda: checked.append(step[0] + 1) or next(scripted)
    campaign.prepare()
    metrics = campaign.warm_start(progress=lambda done, _: step.__setitem__(0, done))
    assert checked == [5, 10, 11, 12, 13]
    assert metrics["warmup/steps"] == 13 and metrics["warmup/check_accuracy"] == 0.9


def test_warmup_check_by_takes_the_lowest_group_and_names_a_missing_key(tmp_path, default_config, small):
    calculator = ["taskset.source=builtin:calculator", "taskset.workflow=tool_use", "taskset.domain=tools",
                  "taskset.size=100", "taskset.eval_size=8", "reward.function=score_answer",
                  "explorer.max_new_tokens=40", "eval.max_new_tokens=40", "trainer.warmup_steps=2",
                  "trainer.warmup_until=1.0", "trainer.warmup_check_every=1"]
    run = CampaignRun(preflight(default_config, tmp_path / "by", [*small, *calculator,
                                                                 "trainer.warmup_check_by=operator"]))
    campaign = run.campaign
    campaign.prepare()
    groups = campaign.warm.check_groups()
    assert len(groups) == 2 and sum(len(g) for g in groups) == 64
    assert sorted(t.metadata["operator"] for g in groups for t in g[:1]) == ["+", "-"]
    assert all(len({t.metadata["operator"] for t in g}) == 1 for g in groups)
    seen, evaluate = [], campaign.evaluate  # the check evaluates each group and takes the lowest
    campaign.evaluate = lambda tasks, engine: seen.append((tasks, evaluate(tasks, engine))) or seen[-1][1]
    check = campaign.warm.accuracy()
    assert [tasks for tasks, _ in seen] == groups
    assert check == min(result["accuracy/held_out"] for _, result in seen)

    missing = CampaignRun(preflight(default_config, tmp_path / "missing", [*small, *calculator,
                                                                          "trainer.warmup_check_by=level"]))
    missing.campaign.prepare()
    with pytest.raises(ValueError, match="trainer.warmup_check_by: task .* has no metadata key 'level'"):
        missing.campaign.warm_start()
    assert missing.campaign.trainer.steps == 0  # it failed before any step


def test_warmup_check_tasks_sets_how_many_training_tasks_the_check_answers(tmp_path, default_config, small):
    checks = ["trainer.warmup_steps=2", "trainer.warmup_until=1.0"]
    for count in (64, 40):  # the default, and one set
        sets = [*small, *checks] + ([] if count == 64 else [f"trainer.warmup_check_tasks={count}"])
        campaign = CampaignRun(preflight(default_config, tmp_path / str(count), sets)).campaign
        campaign.prepare()
        (group,) = campaign.warm.check_groups()
        assert [t.task_id for t in group] == [t.task_id for t in campaign.splits.train[:count]]


def test_an_explorer_and_a_trainer_alone_and_bench_run_episodes(tmp_path, default_config, small, warm):
    two = ["sync.method=checkpoint", "rounds=2", "eval.every=2", "checkpoint.every=2",
           f"storage.url={(tmp_path / 'store').as_uri()}"]
    trainer = CampaignRun(preflight(default_config, tmp_path / "trainer", [*small, *GAME, *two, "mode=train"]))
    steps = list(trainer.steps())
    for step in steps[:4]:  # prepare, warm start, evaluate, checkpoint
        trainer.do(step)
    explorer = CampaignRun(preflight(default_config, tmp_path / "explorer",
                                     [*small, *GAME, *two, "mode=explore", "sync.offset=2"]))
    explorer.run()
    _episodes_ok(explorer.campaign.store, [1, 2], 16)
    for step in steps[4:]:
        trainer.do(step)
    assert trainer.campaign.policy_version == 3

    summary = bench(preflight(default_config, tmp_path / "bench", [
        *small, *GAME, "mode=bench", f"bench.models=[{warm[2]}, builtin:tiny]"]))
    results = {r["model"]: r["accuracy"] for r in summary["results"]}
    assert results[str(warm[2])] > results["builtin:tiny"]  # the warmed model plays; the untrained one cannot


class SlowGuess:
    """builtin:guess_number that, from the ``after``-th episode made in this process on, touches
    ``marker`` at its first step and sleeps ``delay`` s in it (the test kills the process then, in
    the middle of an episode); once the marker exists its steps are fast."""

    made = 0

    def __new__(cls, delay: float = 0.0, marker: str = "", after: int = 0):
        from rftflow.components.explore.environments import GuessNumberEnv

        SlowGuess.made += 1
        env, late = GuessNumberEnv(), SlowGuess.made > after
        step = env.step

        def slow_step(action):
            if late and marker and not Path(marker).exists():
                Path(marker).touch()
                time.sleep(delay)
            return step(action)

        env.step = slow_step
        return env


def test_a_run_killed_mid_episode_resumes_and_redoes_the_episodes_without_duplicates(tmp_path, default_config,
                                                                                      small):
    marker = tmp_path / "in-round-2"
    # round 1 makes 16 episodes (4 tasks x 4); the marker appears once round 2's episodes are stepping
    overrides = [*small, *GAME, "rounds=3", "threads=1", f"workflow.environment={__name__}:SlowGuess",
                 f"workflow.env_args={{delay: 2.0, marker: '{marker}', after: 16}}", "eval.every=3"]
    script = ("import sys; from rftflow.components.campaign.preflight import preflight; "
              "from rftflow.components.campaign.run import CampaignRun; "
              f"CampaignRun(preflight({str(default_config)!r}, {str(tmp_path / 'run')!r}, sys.argv[1:])).run()")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    proc = subprocess.Popen([sys.executable, "-c", script, *overrides], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert proc.poll() is None, proc.stdout.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    done = subprocess.run([sys.executable, "-c", script, *overrides], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "Traceback" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    checked = preflight(default_config, tmp_path / "run", overrides)
    _episodes_ok(ExperienceStore(open_run_store(checked.cfg.storage, checked.run_dir), checked.cfg.name), [1, 2, 3], 16)
