"""``Campaign`` without Prefect: the round defined once, every algorithm preset through two rounds
on builtin:tiny, the buffer's options, the contract threshold of a round."""

import math

import pytest
import torch

from rftflow.components.algorithms import PRESETS
from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.schedule import ROUND, Planned, Step
from rftflow.components.campaign.stages import Campaign
from rftflow.components.config import load_config


@pytest.fixture
def started(tmp_path, default_config, small):
    """``started(*overrides)``: a small campaign, prepared and warm-started, ready for its rounds."""
    def start(*overrides: str) -> Campaign:
        campaign = Campaign.from_config(default_config, tmp_path, [*small, *overrides])
        campaign.prepare()
        campaign.warm_start()
        return campaign

    return start


def test_every_step_is_a_row_of_the_table_and_a_task_of_its_name_and_the_round_is_its_stages_in_order(
        tmp_path, default_config, small):
    from rftflow.components.campaign.run import CampaignRun
    from rftflow.components.campaign.steps import STEPS, spec_of
    from rftflow.flows.campaign import task_of

    assert [s.value for s in ROUND] == ["explore", "verify", "buffer", "train", "sync"]
    run = CampaignRun(preflight(default_config, tmp_path, [*small]))
    assert list(STEPS) == [s.value for s in Step]  # one row per step, in the schedule's order
    for step in Step:  # the flow's task carries the step's name, and retries only what is idempotent
        task, args = task_of(run, Planned(step, 1))
        assert task.name == step.value and args == (run, 1) and spec_of(step).step is step
        assert task.retries == (2 if spec_of(step).idempotent else 0)
        assert task.task_run_name == f"{step.value}[r={{round_no}}]"
    assert {s.name for s in STEPS.values() if s.idempotent} == {"prepare", "buffer", "register"}
    assert {s for p in run.phases() for lane in p for s in (x.step for x in lane)} <= set(Step)
    run.end("finished")


def test_sync_gives_the_explorer_the_trainers_weights_and_nothing_before(started):
    campaign = started("name=sync")
    explorer, policy = campaign.engine.model.state_dict(), campaign.trainer.unwrapped.state_dict()
    assert all(torch.equal(explorer[k], policy[k]) for k in policy)  # the warm start's weights, published
    for stage in ROUND[:-1]:
        campaign.stage(stage, 1)
    assert not all(torch.equal(explorer[k], policy[k]) for k in policy)  # trained, not yet synced
    assert campaign.sync(1)["sync/weight_version"] == 2
    assert all(torch.equal(explorer[k], policy[k]) for k in policy)
    assert all(explorer[k].data_ptr() != policy[k].data_ptr() for k in policy)  # copies, not the same tensors


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_runs_two_rounds(preset, started):
    campaign = started(
        f"name=p-{preset}", f"algorithm.name={preset}",
        # DPO pairs need groups with a right and a wrong answer: a longer warm start, dynamic sampling
        *(["trainer.warmup_steps=100", "algorithm.dynamic_sampling=true"] if preset == "dpo" else []),
    )
    for r in (1, 2):
        metrics = campaign.run_round(r)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        if preset == "dapo":  # an untrained model's groups mostly score all 0: dynamic sampling drops them
            informative = metrics["explore/rows"] / 4 - metrics["sample/dropped_groups"]
            # ... and refills: more task batches until 4 groups with signal, or the 4-batch limit
            assert metrics["rollout/batches"] == 4 or (metrics["rollout/batches"] > 1 and informative >= 4)
            assert metrics["train/steps"] == math.ceil(min(informative, 4) * 4 / 16)
            continue
        assert metrics["train/steps"] >= 1
        if preset == "dpo":
            assert metrics["sample/pairs"] >= 1 and metrics["train/steps"] == math.ceil(metrics["sample/pairs"] * 2 / 16)
        assert metrics["sync/weight_version"] == r + 1  # the warm start synced once
    expected = {"sft": "loss/sft", "mix": "loss/sft", "dapo": "sample/dropped_groups", "ppo": "value/loss",
                "dpo": "update/dpo_reward_accuracy"}.get(preset, "loss/policy")
    assert expected in metrics


def test_kl_entropy_and_staleness_options_run_in_a_campaign(started):
    campaign = started("name=reg", "algorithm.name=grpo", "algorithm.kl_coef=0.05",
                        "algorithm.entropy_coef=0.001", "algorithm.max_staleness=0")
    metrics = [campaign.run_round(r) for r in (1, 2)][-1]
    # on-policy: every row is from the current version, none is stale
    assert metrics["sample/dropped_stale"] == 0 and metrics["train/steps"] == 1
    assert metrics["kl/low_var_kl"] >= 0 and metrics["update/entropy"] > 0


def test_the_warm_start_is_sft_alone_and_the_entropy_bonus_starts_with_the_rounds(started):
    plain = started("name=plain", "algorithm.name=grpo")
    bonus = started("name=bonus", "algorithm.name=grpo", "algorithm.entropy_coef=0.5")
    assert plain.trainer.steps == bonus.trainer.steps > 0
    warm = plain.trainer.unwrapped.state_dict()
    assert all(torch.equal(warm[k], v) for k, v in bonus.trainer.unwrapped.state_dict().items())
    # the rounds' loss takes it: total = policy − 0.5 · entropy (each averaged over the round's steps)
    m = bonus.run_round(1)
    assert m["train/steps"] >= 1 and m["update/entropy"] > 0
    assert m["loss/total"] == pytest.approx(m["loss/policy"] - 0.5 * m["update/entropy"], abs=1e-5)


def test_mix_expert_ratio_sets_the_expert_share_of_the_round(started):
    campaign = started("name=ratio", "algorithm.name=mix", "buffer.expert_ratio=0.25")
    metrics = campaign.run_round(1)
    # 16 explorer rows taken; 25% expert → 16 · .25/.75 = 5.33 → 5 rows; 21 rows in micro-batches of 16
    assert metrics["sample/usual_rows"] == 16 and metrics["sample/expert_rows"] == 5
    assert metrics["train/steps"] == 2


def test_replay_buffer_and_curriculum_run_in_a_campaign(started):
    campaign = started("name=cur", "algorithm.name=grpo", "buffer.sampling=replay",
                        "buffer.train_rows=32", "explorer.task_selector=curriculum")
    metrics = [campaign.run_round(r) for r in (1, 2)]
    # round 2 replays 32 rows (8 groups) out of the 2 rounds' 32 rows; each group used at most twice
    assert metrics[0]["sample/usual_rows"] == 16 and metrics[1]["sample/usual_rows"] == 32
    uses = campaign.store.read_state("replay_uses")
    assert len(uses) == 8 and set(uses.values()) <= {1, 2}
    rates = campaign.explorer.pass_rates()
    assert rates.rounds == {1, 2} and sum(n for _, n in rates.tasks.values()) == 32
    assert 0 <= metrics[1]["tasks/mean_pass_rate"] <= 1


def test_prioritize_orders_train_tasks_by_pass_rates_measured_in_the_store(tmp_path, default_config, small):
    from rftflow.components.buffer.experiences import ExperienceStore
    from rftflow.components.buffer.store import open_store
    from rftflow.components.data.tasksets import load_tasks

    cfg = load_config(default_config, [*small, "name=second", f"storage.url={(tmp_path / 'store').as_uri()}",
                               "explorer.task_selector=sequential", "pipelines.tasks=[{op: prioritize, target: 0.0}]"])
    train = load_tasks(cfg.taskset, cfg.seed, cfg.contracts).train
    # what an earlier campaign in this store measured (reward sum, attempts) for three of its tasks
    measured = {train[5].task_id: [4.0, 4], train[9].task_id: [0.0, 8], train[20].task_id: [2.0, 4]}
    ExperienceStore(open_store(cfg.storage.url), "first").write_state("pass_rates", {"rounds": [1], "tasks": measured})
    campaign = Campaign.from_config(cfg, tmp_path / "run")
    campaign.prepare()
    order = [t.task_id for t in campaign.splits.train]
    # hardest first: 0/8, then every unmeasured task (shrunk to the mean, 6/16), then 2/4, then 4/4
    assert order[0] == train[9].task_id and order[-2:] == [train[20].task_id, train[5].task_id]
    assert sorted(order) == sorted(t.task_id for t in train)  # reordered, nothing lost


def test_a_round_past_the_contract_threshold_fails_and_keeps_its_bad_rows(started):
    from rftflow.components.data.contracts import ContractError

    # rewards below 0.5 break this contract: the barely trained policy gets most answers wrong
    campaign = started("name=strict", "algorithm.name=grpo", "contracts.reward_min=0.5")
    campaign.explore(1)
    with pytest.raises(ContractError, match=r"round 1 experiences: \d+ of 16 rows .* first: .*within_bounds\(reward\)"):
        campaign.verify(1)
    bad = campaign.store.read_kind("failed", 1)
    assert bad.num_rows > 0.1 * 16 and set(bad.column("reason").to_pylist()) == {"expect_multicolumn_values_within_bounds(reward)"}
    assert bad.num_rows == campaign.validation.entries[-1].quarantined  # the report counts the same rows
    assert campaign.store.read_kind("quarantine").num_rows == 0  # a failed round's rows are apart
    # the round runs again under a looser threshold: its rows are quarantined once, under the round
    loose = campaign.cfg.contracts.model_copy(update={"max_bad_fraction": 1.0})
    campaign.handover.cfg = campaign.cfg.model_copy(update={"contracts": loose})  # verify's config
    campaign.verify(1)
    campaign.buffer(1)
    again = campaign.store.read_kind("quarantine", 1)
    assert sorted(again.column("experience_id").to_pylist()) == sorted(bad.column("experience_id").to_pylist())
    counts = {c["kind"]: c["rows"] for c in campaign.store.counts() if c["round"] == 1 and c["kind"] != "usual"}
    assert counts == {"quarantine": bad.num_rows, "failed": bad.num_rows}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="decoding and training on a GPU need one (none here)")
def test_with_a_gpu_the_explorer_decodes_and_the_trainer_trains_on_it(started):
    campaign = started("name=gpu")
    explorer_model, policy = campaign.engine.model, campaign.trainer.unwrapped
    assert next(explorer_model.parameters()).device.type == next(policy.parameters()).device.type == "cuda"
    before = next(policy.parameters()).detach().clone()
    metrics = campaign.run_round(1)
    assert metrics["explore/rows"] == campaign.cfg.explorer.tasks_per_round * campaign.cfg.explorer.repeat_times
    assert not torch.equal(before, next(policy.parameters()))  # trained
    for mine, theirs in zip(explorer_model.parameters(), policy.parameters()):  # and synced
        assert torch.equal(mine, theirs)


def test_the_rounds_take_the_train_split_the_store_holds(tmp_path, default_config, small):
    from rftflow.components.data.tasksets import tasks_from_table

    fresh = Campaign.from_config(default_config, tmp_path / "fresh", [*small, "name=split"])
    fresh.prepare()  # hands over the split it stored
    assert fresh.splits.train == tasks_from_table(fresh.store.read_tasks("train"))
    # an earlier attempt stored another train split and stopped before the eval split: that one is kept and used
    campaign = Campaign.from_config(default_config, tmp_path / "resumed", [*small, "name=split"])
    earlier = fresh.store.read_tasks("train").slice(0, 5)
    campaign.store.write_tasks("train", earlier)
    campaign.prepare()
    assert campaign.splits.train == tasks_from_table(earlier)
