"""Attempts never share a name, and the warm start shows where it is, on a real Prefect API and a
SQLite MLflow store: one campaign run three times in one run dir (an attempt that fails in round 1,
the same command resuming it, then ``--restart``). Each attempt has its own flow run name and
artifact keys, also after the failed one; the resume keeps its MLflow run, the restart makes one of
its own; no earlier attempt's card is overwritten. While the warm start runs, its flow run's tags
say the step, the loss, the last ``warmup_until`` check and an ETA marked as an upper bound; its
progress card ends at 100 %. Data sizes are run tags, never metrics."""

from __future__ import annotations

import re
import threading
import time

import pytest

from tests.flows.faults import ARMED, register_fails_once_in_round

pytestmark = pytest.mark.slow  # three campaigns through Prefect

# the warm start checked every 10 steps against a share it cannot reach (so all 20 steps run)
RUN = ["name=attempted", "rounds=2", "trainer.warmup_steps=20", "trainer.warmup_until=1.0",
       "trainer.warmup_check_every=10", "pipelines.experiences=[{op: fails_once_in_round, round: 1}]"]


class TagWatcher:
    """Reads the tags of the flow runs named ``<prefix>…`` every 0.1 s, from a thread, while a
    campaign runs in this one."""

    def __init__(self, prefix: str):
        self.prefix, self.seen, self._stop = prefix, [], threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self):
        from prefect import get_client
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

        with get_client(sync_client=True) as client:
            while not self._stop.is_set():
                for run in client.read_flow_runs(flow_run_filter=FlowRunFilter(
                        name=FlowRunFilterName(like_=f"{self.prefix}%"))):
                    if not self.seen or self.seen[-1] != (run.name, run.tags):
                        self.seen.append((run.name, run.tags))
                time.sleep(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)


@pytest.fixture(scope="module")
def attempts(prefect_api, tmp_path_factory, default_config, small):
    """The three attempts' summaries or states, the flow runs and artifacts of the campaign, and the
    tags seen while the first attempt ran (Prefect's views written at every step)."""
    import rftflow.flows.monitor as monitor
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    from rftflow.components.campaign.preflight import campaign_label
    from rftflow.flows.campaign import rft_campaign

    register_fails_once_in_round()  # for the module's campaigns (each test's registrations go after it)
    run_dir = tmp_path_factory.mktemp("attempts")
    overrides, label = [*small, *RUN], campaign_label("attempted", run_dir)
    saved, monitor.UPDATE_SECONDS = monitor.UPDATE_SECONDS, 0.0  # every step's tags (the test reads them)
    try:
        ARMED["fail"] = True
        with TagWatcher("attempted-") as watcher:
            failed = rft_campaign(str(default_config), str(run_dir), overrides=overrides, return_state=True)
        assert failed.is_failed() and not ARMED["fail"], failed
    finally:
        monitor.UPDATE_SECONDS = saved
    resumed = rft_campaign(str(default_config), str(run_dir), overrides=overrides)
    restarted = rft_campaign(str(default_config), str(run_dir), overrides=overrides, restart=True)
    with get_client(sync_client=True) as client:
        flow_runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_="attempted-%")),
                                          sort=FlowRunSort.EXPECTED_START_TIME_ASC)
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(like_=f"{label}-%")))
    return {"label": label, "run_dir": run_dir, "resumed": resumed, "restarted": restarted, "seen": watcher.seen,
            "flow_runs": flow_runs, "artifacts": artifacts}


def test_each_attempt_has_its_own_flow_run_name_also_after_a_failed_one(attempts):
    names = [run.name for run in attempts["flow_runs"]]
    hash_ = attempts["label"].rsplit("-", 1)[1]
    assert [re.sub(r"^attempted-\d{4}-\d\d-\d\d-", "", n) for n in names] == [f"{hash_}-a{k}" for k in (1, 2, 3)], names
    assert [run.state_type.value for run in attempts["flow_runs"]] == ["FAILED", "COMPLETED", "COMPLETED"]
    assert attempts["resumed"]["attempts"] == 2 and attempts["restarted"]["attempts"] == 1  # the state's own count


def test_artifact_keys_are_unique_per_attempt_and_no_earlier_card_is_overwritten(attempts):
    label, by_key = attempts["label"], {}
    for artifact in attempts["artifacts"]:
        by_key.setdefault(artifact.key, []).append(artifact)
    assert all(len(cards) == 1 for cards in by_key.values()), {k: len(v) for k, v in by_key.items()}
    assert {f"{label}-a1-{kind}" for kind in ("warm-start", "progress", "summary")} <= set(by_key), sorted(by_key)
    assert {f"{label}-a2-{kind}" for kind in ("progress", "rounds", "summary")} <= set(by_key), sorted(by_key)
    assert {f"{label}-a3-{kind}" for kind in ("warm-start", "progress", "rounds", "summary")} <= set(by_key)
    (first,) = by_key[f"{label}-a1-summary"]
    assert "attempt 1)" in first.data and "**Stopped:** RuntimeError: a fault in round 1" in first.data, first.data
    (third,) = by_key[f"{label}-a3-summary"]
    assert "attempt 3)" in third.data and "Stopped" not in third.data
    owners = {a.key: a.flow_run_id for a in attempts["artifacts"]}
    runs = [run.id for run in attempts["flow_runs"]]
    assert {owners[f"{label}-a{k}-summary"] for k in (1, 2, 3)} == set(runs)  # each in its own flow run


def test_the_warm_start_shows_its_step_loss_check_and_an_upper_bound_eta_while_it_runs(attempts):
    first = [tags for name, tags in attempts["seen"] if name.endswith("-a1")]
    warm = [tags for tags in first if any(t.startswith("warm start ") for t in tags)]
    steps = sorted({int(m.group(1)) for tags in warm for t in tags if (m := re.fullmatch(r"warm start (\d+)/20", t))})
    assert len(steps) >= 3 and steps[0] < 20, steps  # seen as it went, not only at the end
    assert any(re.fullmatch(r"sft loss \d+\.\d{3}", t) for tags in warm for t in tags), warm[-3:]
    assert any(re.fullmatch(r"check \d\.\d{3}", t) for tags in warm for t in tags), warm[-3:]
    etas = [t for tags in warm for t in tags if t.startswith("eta ")]
    assert etas and all(re.fullmatch(r"eta ≤ \d+ (s|min) \(warm start\)", t) for t in etas), etas
    (card,) = [a for a in attempts["artifacts"] if a.key == f"{attempts['label']}-a1-warm-start"]
    assert card.type == "progress" and float(card.data) == 100.0
    assert card.description.startswith(f"campaign {attempts['label']}: warm start, step 20 of 20: sft loss ")
    assert "trainer.warmup_until 1 may end it sooner" in card.description, card.description
    assert {run.name: run.tags for run in attempts["flow_runs"]}  # the end's tags replace the warm start's
    assert not any(t.startswith(("warm start ", "eta ")) for run in attempts["flow_runs"][1:] for t in run.tags)


def test_the_resume_keeps_its_mlflow_run_and_the_restart_makes_one_named_after_its_attempt(attempts):
    from mlflow import MlflowClient

    from rftflow.components.tracking import TAGGED

    resumed, restarted, label = attempts["resumed"], attempts["restarted"], attempts["label"]
    client = MlflowClient(resumed["mlflow_tracking_uri"])
    runs = client.search_runs([client.get_experiment_by_name("rftflow").experiment_id],
                              order_by=["attributes.start_time ASC"])
    assert [r.info.run_id for r in runs] == [resumed["mlflow_run_id"], restarted["mlflow_run_id"]]
    first, second = runs
    assert (first.info.run_name, second.info.run_name) == (f"{label}-a1", f"{label}-a3")
    assert first.data.tags["rftflow.attempt"] == "2" and second.data.tags["rftflow.attempt"] == "3"
    assert second.data.tags["rftflow.attempts_before"] == "2" and "rftflow.moved_aside" in first.data.tags
    assert {r.data.tags["rftflow.campaign_run"] for r in runs} == {label}
    for run in runs:  # sizes and choices made once are tags, never one-point charts
        assert not set(run.data.metrics) & TAGGED, set(run.data.metrics) & TAGGED
        assert run.data.tags["warmup/steps"] == "20" and run.data.tags["tasks/eval"] == "10"
        assert int(run.data.tags["tasks/train"]) > 0
    assert second.data.tags["rftflow.progress"].startswith("finished, round 2/2")
