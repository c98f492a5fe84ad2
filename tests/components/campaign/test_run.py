"""Durable campaigns without Prefect: an abandoned attempt is resumed from its newest checkpoint and
ends exactly where an uninterrupted run ends; checkpoint retention; the re-run rules."""

import json

import pyarrow.compute as pc
import pytest
import torch

from rftflow.components.config import ConfigError
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun, move_aside

DURABLE = ["rounds=5", "checkpoint.every=2", "eval.every=2", "trainer.warmup_steps=10", "checkpoint.keep_last=1"]


@pytest.fixture
def start(tmp_path, default_config, small):
    """``start(name, *overrides, restart=False) -> CampaignRun`` in ``<tmp>/<name>``."""
    def make(name: str, *overrides: str, restart: bool = False) -> CampaignRun:
        checked = preflight(default_config, tmp_path / name, [*small, *DURABLE, *overrides], restart=restart)
        if restart:
            move_aside(checked)
        return CampaignRun(checked)

    return make


def _weights(run: CampaignRun) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in run.campaign.trainer.unwrapped.state_dict().items()}


def _abandon_after(run: CampaignRun, stop: tuple[str, int]) -> None:
    """Run steps until ``stop`` (step name, round) is done, then drop the attempt as a killed process would."""
    for planned in run.steps():
        run.do(planned)
        if (planned.step.value, planned.round) == stop:
            return


def test_an_abandoned_attempt_resumes_from_its_checkpoint_and_ends_exactly_as_an_uninterrupted_one(start):
    reference = start("reference")
    ref_summary = reference.run()
    for stop in (("train", 3), ("checkpoint", 2), ("warm_start", 0)):
        name = f"cut-{stop[0]}-{stop[1]}"
        _abandon_after(start(name), stop)
        resumed = start(name)
        assert resumed.resumed_from == (2 if stop[1] >= 2 else None)  # the newest checkpoint, or from scratch
        summary = resumed.run()
        assert summary["eval_accuracy_after"] == ref_summary["eval_accuracy_after"]
        for key, value in _weights(reference).items():  # state equal, not close: model, optimizer, RNG restored
            assert torch.equal(value, _weights(resumed)[key]), (stop, key)
        # every round once, the configured rows each, no experience twice
        usual = resumed.campaign.store.read_kind("usual")
        counts = usual.group_by("round").aggregate([([], "count_all")]).to_pylist()
        assert sorted((c["round"], c["count_all"]) for c in counts) == [(r, 16) for r in range(1, 6)]
        assert pc.count_distinct(usual.column("experience_id")).as_py() == usual.num_rows
        # one MLflow run, no metric twice at one step
        client, run_id = resumed.tracker.client, resumed.tracker.run_id
        assert run_id == summary["mlflow_run_id"] and client.get_run(run_id).info.status == "FINISHED"
        for key in client.get_run(run_id).data.metrics:
            steps = [m.step for m in client.get_metric_history(run_id, key)]
            assert len(steps) == len(set(steps)), key
        assert sorted(m.step for m in client.get_metric_history(run_id, "reward/mean")) == [1, 2, 3, 4, 5]
        assert resumed.state.status == "finished" and len(resumed.state.attempts) == 2


def test_checkpoints_are_committed_kept_by_retention_and_logged_to_the_run(start):
    run = start("keep")
    run.run()
    manifests = run.campaign.weight_store.checkpoints()
    # keep_last=1 keeps the final one (round 5); keep_best keeps the best held-out accuracy's
    best = max((m for m in manifests), key=lambda m: (m["eval_accuracy"], m["version"]))
    assert manifests[-1]["round"] == 5 and len(manifests) == (1 if best is manifests[-1] else 2)
    final = manifests[-1]
    assert {"model.safetensors", "optimizer.pt", "campaign.json", "tokenizer.json"} <= set(final["files"])
    logged = [a.path for a in run.tracker.client.list_artifacts(run.tracker.run_id, "checkpoints")]
    assert logged == [f"checkpoints/v{m['version']:06d}" for m in manifests]
    # the run keeps the model of each checkpoint; the optimizer state (resume only) stays in the store
    in_run = {a.path.rsplit("/", 1)[-1] for a in run.tracker.client.list_artifacts(run.tracker.run_id, logged[-1])}
    assert {"model.safetensors", "campaign.json", "tokenizer.json"} <= in_run and "optimizer.pt" not in in_run
    state = json.loads(run.campaign.store.objects.get(f"{run.state.checkpoint}/campaign.json"))
    assert state["round"] == 5 and state["buffer_state"]["fifo_cursor"]["shard"].endswith("round=5/part-00000.parquet")


def test_rerun_rules_finished_changed_config_running_elsewhere_and_restart(start, tmp_path, default_config, small):
    start("rules").run()
    args = (default_config, tmp_path / "rules")
    assert preflight(*args, [*small, *DURABLE]).finished  # started again: nothing to do
    with pytest.raises(ConfigError, match=r"holds campaign 'arith-mix' with another config: trainer.lr \(0.0005 → "
                                          r"0.001\); .* --restart"):
        preflight(*args, [*small, *DURABLE, "trainer.lr=1e-3"])
    old_run = preflight(*args, [*small, *DURABLE]).previous.mlflow_run_id
    restarted = start("rules", "trainer.lr=1e-3", restart=True)  # the old run moved aside, not deleted
    assert restarted.fresh and restarted.tracker.run_id != old_run
    store_dir, run_dir = tmp_path / "rules" / "store", tmp_path / "rules"
    moved = [p.name for p in store_dir.iterdir() if p.name.startswith("arith-mix.moved-")]
    assert len(moved) == 1 and (store_dir / moved[0] / "experiences" / "usual" / "round=5").is_dir()
    stamp = moved[0].split(".", 1)[1]
    assert (run_dir / stamp / "summary.json").is_file() and (run_dir / stamp / "model").is_dir()
    old = restarted.tracker.client.get_run(old_run)
    assert old.info.status == "FINISHED" and old.data.tags["rftflow.moved_aside"] == stamp
    # an attempt whose process is alive (here: this test's parent) blocks a second one
    import os

    restarted.state.attempt.pid = os.getppid()
    restarted.states.write(restarted.state)
    with pytest.raises(ConfigError, match=rf"campaign 'arith-mix' is running now \(pid {os.getppid()} on "):
        preflight(*args, [*small, *DURABLE, "trainer.lr=1e-3"])
