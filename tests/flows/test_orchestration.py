"""How the flow cuts a campaign into task runs (``flows.orchestration``): the ``orchestration``
section checked, old top-level keys refused naming their new place and migrated in stored
configs; ``auto``'s choice from the first round's measured share; rounds grouped up to an
evaluation; and a campaign run a round (or several) at a time computes the same as one run a stage
at a time, and resumes the same way."""

import pytest
import torch

from rftflow.components.campaign.preflight import preflight
from rftflow.components.campaign.run import CampaignRun
from rftflow.components.campaign.schedule import ROUND, Planned, Step
from rftflow.components.campaign.state import config_changes
from rftflow.components.config import ConfigError, load_config
from rftflow.flows.orchestration import OrchestrationConfig, Rounds, TaskRunPlan, orchestration_of

DURABLE = ["rounds=5", "checkpoint.every=2", "eval.every=2", "trainer.warmup_steps=10", "checkpoint.keep_last=1"]


@pytest.fixture
def start(tmp_path, default_config, small):
    def make(name: str, *overrides: str) -> CampaignRun:
        return CampaignRun(preflight(default_config, tmp_path / name, [*small, *DURABLE, *overrides]))

    return make


def test_the_section_is_checked_and_its_old_keys_name_their_new_place():
    assert orchestration_of(load_config(None, ["orchestration.task_runs=round"])).task_runs == "round"
    with pytest.raises(ConfigError, match=r"^config key 'orchestration.task_run': unknown config key$"):
        orchestration_of(load_config(None, ["orchestration.task_run=round"]))
    with pytest.raises(ConfigError, match=r"orchestration.task_runs 'round' .* mode 'async'"):
        orchestration_of(load_config(None, ["orchestration.task_runs=round", "mode=async"]))
    with pytest.raises(ConfigError, match=r"rounds_per_task_run groups rounds .*not 'stage'"):
        orchestration_of(load_config(None, ["orchestration.task_runs=stage", "orchestration.rounds_per_task_run=4"]))
    for old in ("task_runs=round", "rounds_per_task_run=2", "task_runs_max_share=0.1"):
        key = old.split("=")[0]
        with pytest.raises(ConfigError, match=rf"config key '{key}' moved to 'orchestration.{key}'"):
            load_config(None, [old])


def test_a_campaign_handed_to_the_flow_is_checked_once(tmp_path, default_config, small, monkeypatch):
    """The CLI checks the config and its orchestration section before any server starts and hands
    both over; the flow takes them as they are, and checks what nobody handed it."""
    from rftflow.flows import campaign as flow_module

    checked = preflight(default_config, tmp_path / "run", [*small, "orchestration.task_runs=round"])
    settings, calls = orchestration_of(checked.cfg), []
    monkeypatch.setattr(flow_module, "orchestration_of", lambda cfg: calls.append(cfg) or orchestration_of(cfg))
    as_json, run_dir = checked.cfg.model_dump(mode="json"), str(checked.run_dir)
    with flow_module.handing_over(checked, False, settings):
        assert flow_module._checked(as_json, run_dir, [], False) == (checked, settings) and calls == []
    with flow_module.handing_over(checked):  # rftflow.run_campaign: the section is checked in the flow, once
        again, section = flow_module._checked(as_json, run_dir, [], False)
        assert again is checked and section.task_runs == "round" and calls == [checked.cfg]



def test_a_stored_config_with_the_old_keys_is_the_same_campaign():
    stored = load_config(None, ["rounds=3"]).model_dump(mode="json")
    stored.pop("orchestration")
    stored |= {"task_runs": "stage", "task_runs_max_share": 0.05, "rounds_per_task_run": None}  # as 0.1 stored it
    assert config_changes(stored, load_config(None, ["rounds=3", "orchestration.task_runs=round"]).model_dump(mode="json")) == []
    assert config_changes(stored, load_config(None, ["rounds=4"]).model_dump(mode="json")) == ["rounds (3 → 4)"]


def _plan(**settings) -> TaskRunPlan:
    return TaskRunPlan(OrchestrationConfig(**settings), "both", ROUND)


@pytest.mark.parametrize("max_share, chosen", [(0.25, "round"), (0.35, "stage"), (0.0, "round")])
def test_auto_chooses_by_prefects_share_of_the_first_round(max_share, chosen):
    """(Σ wall − Σ own) / Σ wall over the first round's stages against task_runs_max_share: each
    stage's task run took its own time + 30% of the whole, Prefect's share 0.3."""
    plan = _plan(task_runs_max_share=max_share)
    own = {Step.EXPLORE: 0.020, Step.VERIFY: 0.005, Step.BUFFER: 0.002, Step.TRAIN: 0.030, Step.SYNC: 0.003}
    for step in ROUND:
        made = plan.measured(Planned(step, 1), own[step] / 0.7, own[step])
        assert (made is None) == (step != Step.SYNC)
    line, metrics = made
    assert "30% of round 1" in line and metrics["time/prefect_share"] == pytest.approx(0.3)
    assert plan.granularity == chosen
    k, total = plan.rounds_per_task_run, sum(own.values())
    if chosen == "round":
        c, fit = (total / 0.7 - total) / len(ROUND), max(1, int(5.0 / total))  # at most 5 s of rounds a task run

        def share(rounds):
            return c / (c + rounds * total)

        if max_share and k < fit:  # the fewest rounds for which a task run's cost is within max_share / 4
            assert share(k) <= max_share / 4 and (k == 1 or share(k - 1) > max_share / 4), k
        else:  # no share small enough (max_share 0): capped at 5 s of rounds
            assert k == fit, (k, fit)
        assert (f"one task run per {k} rounds" if k > 1 else "one task run per round") in line, line
    else:
        assert k == 1
    assert plan.measured(Planned(Step.EXPLORE, 2), 1.0, 0.1) is None  # chosen once
    assert TaskRunPlan(OrchestrationConfig(), "async", ROUND).granularity == "stage"  # async: always per stage
    assert _plan(task_runs_max_share=0, rounds_per_task_run=3).rounds_per_task_run == 3


def test_rounds_group_up_to_an_evaluation_or_a_checkpoint():
    phases = [[[Planned(s, r)]] for r in (2, 3, 4, 5) for s in ROUND] + [[[Planned(Step.EVALUATE, 5)]]]
    phases += [[[Planned(s, r)]] for r in (6, 7) for s in ROUND] + [[[Planned(Step.REGISTER, 7)]]]
    assert [p[0] for p in _plan(task_runs="round").cut(phases)] == [
        *([Rounds(r, r)] for r in (2, 3, 4, 5)), [Planned(Step.EVALUATE, 5)], [Rounds(6, 6)], [Rounds(7, 7)],
        [Planned(Step.REGISTER, 7)]]
    # three rounds a task run: 2-4, then 5 alone (an evaluation follows it), 6-7
    assert [p[0] for p in _plan(task_runs="round", rounds_per_task_run=3).cut(phases)] == [
        [Rounds(2, 4)], [Rounds(5, 5)], [Planned(Step.EVALUATE, 5)], [Rounds(6, 7)], [Planned(Step.REGISTER, 7)]]
    assert _plan(task_runs="stage").cut(phases) == phases


def _walk(run: CampaignRun, plan: TaskRunPlan, stop: Rounds | None = None) -> None:
    """The steps as the flow cuts them, in plain Python: a group of rounds by ``CampaignRun.round``."""
    for phase in plan.cut(list(run.phases())):
        for unit in phase[0]:
            if isinstance(unit, Rounds):
                for r in range(unit.first, unit.last + 1):
                    run.round(r)
            else:
                run.do(unit)
            if unit == stop:
                return
    run.finish()


def test_a_campaign_run_rounds_at_a_time_computes_the_same_and_resumes_the_same_way(start):
    reference = start("by-stage")
    reference.run()
    by_round = _plan(task_runs="round", rounds_per_task_run=2)
    cut = start("by-round", "orchestration.task_runs=round")
    assert [p[0][0] for p in by_round.cut(list(cut.phases())) if isinstance(p[0][0], Rounds)] == [
        Rounds(1, 2), Rounds(3, 4), Rounds(5, 5)]
    _walk(cut, by_round, stop=Rounds(3, 4))  # dropped there, as a killed process: before round 4's checkpoint
    resumed = start("by-round", "orchestration.task_runs=round")
    assert resumed.resumed_from == 2
    _walk(resumed, by_round)
    ours, theirs = resumed.campaign.trainer.unwrapped.state_dict(), reference.campaign.trainer.unwrapped.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    client, run_id = resumed.tracker.client, resumed.tracker.run_id
    assert sorted(m.step for m in client.get_metric_history(run_id, "time/train_s")) == [1, 2, 3, 4, 5]
    assert resumed.state.evals == reference.state.evals
