"""``Tracker`` on a real SQLite MLflow store: deferred metrics reach the run together, once per
step and key, and nothing held back is lost when the run ends."""

from rftflow.components.tracking import Tracker


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


def _schema(path) -> tuple[str, set, list]:
    """A SQLite store's schema version, its tables (with their columns) and indexes, and its experiments."""
    import sqlite3

    with sqlite3.connect(path) as db:
        version = db.execute("select version_num from alembic_version").fetchone()[0]
        objects = {(kind, name, table) for kind, name, table in db.execute("select type, name, tbl_name from sqlite_master")}
        objects |= {(table, tuple(db.execute(f"pragma table_info('{table}')").fetchall()))
                    for kind, _, table in list(objects) if kind == "table"}
        experiments = db.execute("select experiment_id, name from experiments order by experiment_id").fetchall()
    return version, objects, experiments


def test_a_new_sqlite_store_is_a_copy_of_the_one_mlflow_sets_up(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from rftflow.components.tracking import seed_sqlite_store

    monkeypatch.setenv("RFTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    plain = tmp_path / "plain.db"
    MlflowClient(f"sqlite:///{plain}").search_experiments()  # MLflow's own set-up of a new file
    first = Tracker(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}", "rftflow", "a", artifact_root=tmp_path / "art")
    [template] = (tmp_path / "cache").glob("mlflow-*-empty.db")
    made = template.stat().st_mtime_ns
    second = Tracker(f"sqlite:///{tmp_path / 'b' / 'mlflow.db'}", "rftflow", "b", artifact_root=tmp_path / "art")
    assert template.stat().st_mtime_ns == made  # made once, then copied
    version, objects, experiments = _schema(plain)
    for tracker, run_dir in ((first, "a"), (second, "b")):
        seeded = _schema(tmp_path / run_dir / "mlflow.db")
        assert seeded[:2] == (version, objects)  # the same schema as MLflow's own new store
        assert seeded[2] == [*experiments, (1, "rftflow")]  # MLflow's Default experiment, then ours
        tracker.log_metrics({"reward/mean": 0.5}, step=1)
        assert _logged(tracker, "reward/mean") == [(1, 0.5)]
    before = (tmp_path / "a" / "mlflow.db").read_bytes()
    seed_sqlite_store(f"sqlite:///{tmp_path / 'a' / 'mlflow.db'}")  # a store that exists is left as it is
    assert (tmp_path / "a" / "mlflow.db").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["mlflow.db"]  # no copy left behind


def test_sizes_and_choices_made_once_are_run_tags_never_metrics(tmp_path):
    from rftflow.components.tracking import TAGGED

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "rftflow", "sizes", artifact_root=tmp_path / "art")
    tracker.log_metrics({"tasks/train": 290.0, "warmup/steps": 30.0, "time/prefect_share": 0.0123456}, step=0,
                        defer=True)
    tracker.log_metrics({"reward/mean": 0.5}, step=1)
    run = tracker.client.get_run(tracker.run_id)
    assert set(run.data.metrics) == {"reward/mean"} and not set(run.data.metrics) & TAGGED
    assert {k: run.data.tags[k] for k in ("tasks/train", "warmup/steps", "time/prefect_share")} == {
        "tasks/train": "290", "warmup/steps": "30", "time/prefect_share": "0.01235"}


def test_attempts_are_numbered_across_restarts_and_a_resume_keeps_its_run(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    old = Tracker(uri, "rftflow", "camp-3f2a1c", artifact_root=tmp_path / "art")  # made before attempts were numbered
    first = Tracker(uri, "rftflow", "camp-3f2a1c", artifact_root=tmp_path / "art", attempt=1)
    assert (old.run_name, first.run_name, first.attempt) == ("camp-3f2a1c", "camp-3f2a1c-a2", 2)
    resumed = Tracker(uri, "rftflow", "camp-3f2a1c", run_id=first.run_id, attempt=2)  # the state's second attempt
    assert resumed.attempt == 3 and resumed.client.get_run(first.run_id).data.tags["rftflow.attempt"] == "3"
    restarted = Tracker(uri, "rftflow", "camp-3f2a1c", artifact_root=tmp_path / "art", attempt=1)  # a new state
    run = restarted.client.get_run(restarted.run_id)
    assert (run.info.run_name, restarted.attempt) == ("camp-3f2a1c-a4", 4)
    assert run.data.tags["rftflow.attempts_before"] == "3"
    other = Tracker(uri, "rftflow", "camp-9e8d7c", artifact_root=tmp_path / "art", attempt=1)  # another run dir
    assert other.run_name == "camp-9e8d7c-a1"


def test_every_link_opens_the_training_view_on_its_page():
    from rftflow.components.tracking import experiment_url, model_version_url, run_url

    ui = "http://mlflow.example:5000/"
    assert run_url(ui, "3", "abc") == "http://mlflow.example:5000/#/experiments/3/runs/abc/model-metrics" \
                                      "?workflowType=machine_learning"
    assert model_version_url(ui, "team/arith tiny", "2") == \
        "http://mlflow.example:5000/#/models/team%2Farith%20tiny/versions/2?workflowType=machine_learning"
    assert experiment_url(ui, "3").startswith("http://mlflow.example:5000/#/experiments/3/runs?")
    assert experiment_url(ui, "3").endswith("&workflowType=machine_learning")
