"""Retention (``buffer gc``): what goes, and that what a resume or a replay needs stays — gc an
abandoned replay campaign, resume it, and it ends exactly as the uninterrupted one."""

import pytest
import torch

from rftflow.components.buffer import retention
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun

# replay, each group trained on twice at most, none older than one weight version: old rounds stop mattering
REPLAY = ["rounds=6", "checkpoint.every=2", "eval.every=2", "trainer.warmup_steps=10", "checkpoint.keep_last=1",
          "checkpoint.keep_best=false", "buffer.sampling=replay", "buffer.reuse_limit=2", "algorithm.max_staleness=1"]


@pytest.fixture
def start(tmp_path, default_config, small):
    def make(name: str, *overrides: str) -> CampaignRun:
        return CampaignRun(preflight(default_config, tmp_path / name, [*small, *REPLAY, *overrides]))

    return make


def _rounds(keys: list[str]) -> list[int]:
    return sorted({int(k.split("round=")[1].split("/")[0]) for k in keys})


def test_gc_keeps_what_a_resumed_replay_campaign_needs_and_it_ends_as_the_uninterrupted_one(start):
    reference = start("reference")
    reference.run()
    abandoned = start("cut")
    for planned in abandoned.steps():  # killed after round 5's train: round 4's checkpoint is the newest
        abandoned.do(planned)
        if (planned.step.value, planned.round) == ("train", 5):
            break
    store = abandoned.campaign.store
    store.flush()
    config = abandoned.cfg.model_dump(mode="json")

    # given keep_rounds 1 (round 5 alone): at round 4's checkpoint (weight version 5), rounds 1-3 hold only groups
    # explored more than one version before; round 4's (version 4, used once) a replay may still draw
    plan = retention.plan(store, config, finished=False, keep_rounds=1)
    assert _rounds(plan.deletions["experiences"]) == [1, 2, 3]
    assert _rounds(plan.deletions["staging"]) == [1, 2, 3, 4]  # at or before the checkpoint's round 4
    assert plan.deletions["checkpoints"] == [] and plan.deletions["weights"] == []
    assert "a resume or replay needs 4 on" in plan.notes["experiences"]
    # when gc applies it, then the campaign resumes and replays from round 4's checkpoint
    assert retention.apply(store, plan) == plan.total > 0
    assert _rounds(store.objects.list(store.key("experiences", "usual"))) == [4, 5]
    resumed = start("cut")
    assert resumed.resumed_from == 4
    resumed.run()
    # then it ended exactly where the uninterrupted campaign did
    ours, theirs = resumed.campaign.trainer.unwrapped.state_dict(), reference.campaign.trainer.unwrapped.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert resumed.state.evals == reference.state.evals


def test_gc_of_a_finished_campaign_drops_staging_and_superseded_weights_and_keeps_the_newest_rounds(start):
    run = start("done", "sync.method=checkpoint", "rounds=4", "retention.keep_rounds=2", "retention.after_campaign=true")
    summary = run.run()  # gc'ed as it finished
    store = run.campaign.store
    assert summary["gc_deleted_objects"] > 0
    assert store.objects.list(store.key("staging")) == [] and run.campaign.weight_store.published_weights() == []
    assert _rounds(store.objects.list(store.key("experiences", "usual"))) == [3, 4]
    assert store.read_tasks("train").num_rows and store.read_expert().num_rows  # never collected
    assert [m["round"] for m in run.campaign.weight_store.checkpoints()] == [4]  # keep_last 1
    again = retention.plan(store, run.cfg.model_dump(mode="json"), finished=True)
    assert again.total == 0  # nothing left to collect
