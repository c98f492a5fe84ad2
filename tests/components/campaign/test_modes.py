"""Run modes without Prefect: an explorer alone and a trainer alone on one store (weights through
the store, ``sync.method=checkpoint``); ``async`` overlaps the explorer with the trainer and keeps
every batch within the staleness bound; the wait for the other process polls with back-off and
times out in one line."""

import time
from types import SimpleNamespace

import pyarrow.compute as pc
import pytest

import rftflow.components.stopping as stopping
from rftflow.components.config import ConfigError, load_config
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from rftflow.components.campaign.schedule import Planned, Step

def _named(steps) -> list[tuple[str, int]]:
    """Planned steps as (step name, round)."""
    return [(p.step.value, p.round) for p in steps]


TWO = ["sync.method=checkpoint", "rounds=3", "eval.every=3", "checkpoint.every=3", "trainer.warmup_steps=4"]


def test_an_explorer_alone_and_a_trainer_alone_form_one_campaign(tmp_path, default_config, small):
    store = f"storage.url={(tmp_path / 'store').as_uri()}"
    trainer = CampaignRun(preflight(default_config, tmp_path / "trainer", [*small, *TWO, store, "mode=train"]))
    steps = list(trainer.steps())
    assert ("explore", 1) not in _named(steps) and _named(steps)[:2] == [("prepare", 0), ("warm_start", 0)]
    for step in steps[:4]:  # prepare, warm start (publishes version 1), evaluate, checkpoint
        trainer.do(step)
    assert trainer.campaign.weight_store.published_weights() == [1]

    explorer = CampaignRun(preflight(default_config, tmp_path / "explorer",
                                     [*small, *TWO, store, "mode=explore", "sync.offset=3"]))
    assert _named(explorer.steps()) == [("await_taskset", 0)] + [
        (s, r) for r in (1, 2, 3) for s in ("explore", "verify", "buffer")]
    summary = explorer.run()  # offset 3: every round may use the start weights, so it runs alone to the end
    assert summary["mode"] == "explore" and summary["model_version"] is None
    usual = explorer.campaign.store.read_kind("usual")
    assert sorted(set(usual.column("round").to_pylist())) == [1, 2, 3]
    assert set(usual.column("model_version").to_pylist()) == {1}  # sampled with the published start weights
    assert explorer.states.prefix.endswith("/state/explorer/") and explorer.states.read().status == "finished"

    for step in steps[4:]:  # the trainer alone: trains on what the store holds, publishing weights
        trainer.do(step)
    assert trainer.campaign.policy_version == 4
    assert trainer.campaign.weight_store.published_weights() == [2, 3, 4]  # the newest three are kept
    staleness = trainer.tracker.client.get_metric_history(trainer.tracker.run_id, "sample/staleness_max")
    assert [(m.step, m.value) for m in staleness] == [(1, 0.0), (2, 1.0), (3, 2.0)]  # version r vs rows of v1


def test_async_runs_the_explorer_ahead_within_the_staleness_bound(tmp_path, default_config, small):
    run = CampaignRun(preflight(default_config, tmp_path / "async", [
        *small, "mode=async", "rounds=4", "sync.offset=1", "algorithm.max_staleness=1", "trainer.warmup_steps=4"]))
    phases = list(run.phases())
    lanes = [p for p in phases if len(p) == 2]
    assert [_named(lane) for lane in lanes[0]] == [[("explore", 2), ("verify", 2), ("buffer", 2)], [("train", 1)]]
    summary = run.run()
    usual = run.campaign.store.read_kind("usual")
    for r in range(1, 5):  # the trainer's version at round r is r (1 after the warm start, +1 a round)
        versions = usual.filter(pc.equal(usual.column("round"), r)).column("model_version").to_pylist()
        assert versions and all(0 <= r - v <= 1 for v in versions), (r, set(versions))
    assert summary["eval_accuracy_after"] is not None
    history = run.tracker.client.get_metric_history(run.tracker.run_id, "sample/staleness_max")
    assert max(m.value for m in history) == 1.0


def test_a_trainer_alone_times_out_in_one_line_when_no_explorer_comes(tmp_path, default_config, small, monkeypatch):
    run = CampaignRun(preflight(default_config, tmp_path / "alone", [
        *small, *TWO, "mode=train", "sync.timeout_seconds=1", "trainer.warmup_steps=0"]))
    for step in list(run.steps())[:4]:
        run.do(step)
    pauses = []  # the waits' clock only: other threads' sleeps (MLflow's) stay out of it
    monkeypatch.setattr(stopping, "time", SimpleNamespace(
        monotonic=time.monotonic, sleep=lambda s: (pauses.append(s), time.sleep(s))))
    with pytest.raises(TimeoutError, match=r"waited 1 s for round 1's experiences .* --mode explore\|train"):
        run.do(Planned(Step.TRAIN, 1))
    # the store is looked at after 2 ms, then twice as long each time, never more than 0.5 s apart
    assert pauses[:4] == [0.002, 0.004, 0.008, 0.016] and max(pauses) == stopping.POLL_MAX_SECONDS == 0.5


@pytest.mark.parametrize("overrides, message", [
    (["mode=explore"], "mode 'explore' runs the explorer alone: weights move through the store; set sync.method"),
    (["explorer.engine=openai"], "explorer.engine 'openai' needs explorer.base_url and explorer.served_model"),
    (["mode=bench"], "mode 'bench' needs bench.models"),
    (["mode=async", "sync.offset=2", "algorithm.max_staleness=1"], "algorithm.max_staleness 1 is below"),
])
def test_mode_keys_are_checked_before_any_work(default_config, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_config(default_config, overrides)


def test_a_trainer_alone_evaluates_the_weights_it_trained_since_its_last_evaluation(tmp_path, default_config, small):
    """A trainer alone decodes with its own model, which its fused AdamW steps in place without
    marking the tensors' versions: its evaluation must decode with the new weights, as a copy does."""
    import copy

    from rftflow.components.campaign.stages import Campaign
    from rftflow.components.explore.engines import make_engine

    campaign = Campaign.from_config(default_config, tmp_path, [*small, *TWO, "mode=train", "trainer.warmup_steps=0"])
    campaign.prepare()
    prompts = [campaign.engine.encode(t.prompt) for t in campaign.splits.train[:16]]

    def greedy(engine) -> list[tuple[list[int], list[float]]]:
        engine.stop_ids = {-1}  # no stop token: every row takes 12 decode steps after the prefill
        rollouts = engine.generate_ids(prompts, max_new_tokens=12, greedy=True)
        return [(g[0].response_ids, g[0].logprobs) for g in rollouts]

    before = greedy(campaign.engine)  # the decoder's fused weights are made for the start weights
    campaign.trainer.warm_start(campaign.sampler.warm_start_steps(4), 1e-3)
    copied = make_engine(campaign.cfg.explorer, copy.deepcopy(campaign.trainer.unwrapped), campaign.tokenizer,
                         campaign.cfg.model)
    after = greedy(campaign.engine)
    assert after != before  # the steps moved the policy
    assert after == greedy(copied)
