"""``Tracker`` on a real SQLite MLflow store: deferred metrics reach the run together, once per
step and key, and nothing held back is lost when the run ends."""

from components.tracking import Tracker


def _logged(tracker: Tracker, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracker.client.get_metric_history(tracker.run_id, key))


def test_deferred_metrics_are_written_by_the_next_plain_call_and_at_the_end(tmp_path):
    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "rftflow", "deferred", artifact_root=tmp_path / "art")
    tracker.log_metrics({"explore/rows": 64.0}, step=1, defer=True)
    tracker.log_metrics({"reward/mean": 0.25}, step=1, defer=True)
    assert _logged(tracker, "explore/rows") == [] and _logged(tracker, "reward/mean") == []
    tracker.log_metrics({"reward/mean": 0.75}, step=1, defer=True)  # a retried stage: the first value stays
    tracker.log_metrics({"sync/weight_version": 2.0}, step=1)  # the round's last stage writes them all
    assert _logged(tracker, "explore/rows") == [(1, 64.0)]
    assert _logged(tracker, "reward/mean") == [(1, 0.25)]
    assert _logged(tracker, "sync/weight_version") == [(1, 2.0)]
    tracker.log_metrics({"reward/mean": 0.5}, step=2, defer=True)  # a round cut short by a failure
    tracker.finish("FAILED")
    assert _logged(tracker, "reward/mean") == [(1, 0.25), (2, 0.5)]
    reopened = Tracker(tracker.uri, "rftflow", "deferred", run_id=tracker.run_id)
    reopened.log_metrics({"reward/mean": 0.9}, step=2)  # a resumed run logs no step twice
    assert _logged(reopened, "reward/mean") == [(1, 0.25), (2, 0.5)]
