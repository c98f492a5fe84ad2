"""The warm start's own checkpoints, without Prefect: a warm start stopped (or its process gone)
part-way resumes from its newest checkpoint, not its first step, and the campaign ends with the
weights of an uninterrupted one; the checkpoint after the warm start retires them."""

import pytest
import torch

from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from rftflow.components.campaign.schedule import Planned, Step
from rftflow.components.stopping import StopRequested

WARM = ["rounds=1", "trainer.warmup_steps=40", "trainer.warmup_checkpoint_every=10"]


@pytest.fixture
def start(tmp_path, default_config, small):
    def make(name: str) -> CampaignRun:
        return CampaignRun(preflight(default_config, tmp_path / name, [*small, *WARM]))

    return make


def _state(run: CampaignRun) -> dict[str, torch.Tensor]:
    """The trainer's weights and AdamW moments."""
    trainer = run.campaign.trainer
    moments = {f"adam/{i}/{k}": v for i, s in trainer.optimizer.state_dict()["state"].items() for k, v in s.items()}
    return {**{k: v.clone() for k, v in trainer.unwrapped.state_dict().items()}, **moments}


def _through_the_warm_start(run: CampaignRun) -> None:
    """Every step up to the checkpoint after the warm start."""
    for planned in run.steps():
        run.do(planned)
        if (planned.step.value, planned.round) == ("checkpoint", 0):
            return


class Crash(Exception):
    """The process dies here (nothing after it runs)."""


def _cut_warm_start(run: CampaignRun, at: int, stop: bool) -> int:
    """Prepare, then the warm start until step ``at``: asked to stop there (Ctrl-C), or gone (a crash).
    The first step it took."""
    steps = []

    def hook(step: int, _metrics) -> None:
        steps.append(step)
        if step == at:
            if not stop:
                raise Crash
            run.campaign.stop.reason = "SIGINT"

    run.on_warmup_step = hook
    run.do(Planned(Step.PREPARE, 0))
    with pytest.raises(StopRequested if stop else Crash):
        run.do(Planned(Step.WARM_START, 0))
    return steps[0]


def test_a_warm_start_cut_part_way_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(start):
    reference = start("reference")
    _through_the_warm_start(reference)
    assert reference.campaign.weight_store.warm_starts() == []  # retired by the checkpoint after the warm start
    expected = _state(reference)
    # stopped at step 17 (checkpointed there), then resumed and crashed at step 25 (its newest: step 20)
    for at, stop, first, newest in ((17, True, 1, 17), (25, False, 18, 20)):
        run = start("cut")
        assert run.fresh  # no round's checkpoint yet: prepare and the warm start come again
        assert _cut_warm_start(run, at, stop) == first
        assert [m["step"] for m in run.campaign.weight_store.warm_starts()] == [newest]
    resumed = start("cut")
    _through_the_warm_start(resumed)
    tags = resumed.tracker.client.get_run(resumed.tracker.run_id).data.tags  # a run tag: a value set once
    assert tags["warmup/resumed_from_step"] == "20"
    state = _state(resumed)
    assert state.keys() == expected.keys()
    for key, value in expected.items():  # equal, not close: weights, optimizer, RNG, data order, LR
        assert torch.equal(value, state[key]), key
    assert resumed.campaign.weight_store.warm_starts() == []
