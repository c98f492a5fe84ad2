"""MLflow helpers: one run per campaign, metrics per round, the final model registered.

Uses ``MlflowClient`` with an explicit tracking URI (no global state); the default store is
``sqlite:///<run dir>/mlflow.db`` with artifacts under ``<run dir>/mlartifacts`` (a new one starts as
a copy of an empty store MLflow set up once per machine: ``seed_sqlite_store``); a tracking server
(``http://…``) keeps artifacts where it is configured to (``mlflow server --artifacts-destination``).

What a step reports goes three ways: charted metrics (a value per round), run tags (``TAGGED``:
data sizes and choices made once, shown in the run's overview instead of as one-point charts), and
nowhere (``NOT_CHARTED``: values the config fixes, in the step's log line only). The links built
here (``run_url``, ``experiment_url``, ``model_version_url``) open MLflow 3's model-training view.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rftflow.components.config import cache_dir, flatten
from rftflow.components.secrets import mask_secrets

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# A new SQLite store logs its schema set-up at INFO on every first use.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)


def seed_sqlite_store(uri: str) -> None:
    """A new SQLite store (``sqlite:///<path>`` with nothing at ``path`` yet) starts as a copy of an
    empty one that MLflow itself set up (``_initialize_tables``: its tables, then every schema
    migration), kept per MLflow version under ``cache_dir()``. MLflow does that set-up, seconds of
    schema migrations, for every new database, once per run directory; a copy is a file copy. The copy
    holds no experiment: MLflow makes its Default experiment on first use, as for a new file."""
    path = Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") and "?" not in uri else None
    if path is None or path.exists():
        return
    import mlflow

    template = cache_dir() / f"mlflow-{mlflow.__version__}-empty.db"
    if not template.exists():
        try:
            from mlflow.store.db.utils import _initialize_tables  # MLflow's own set-up of a new store
        except ImportError:  # another MLflow: it sets the database up itself
            return
        import sqlalchemy

        template.parent.mkdir(parents=True, exist_ok=True)
        building = _unique_beside(template)
        engine = sqlalchemy.create_engine(f"sqlite:///{building}")
        try:
            _initialize_tables(engine)
            os.replace(building, template)  # whole or not at all, also with two runs at once
        finally:
            engine.dispose()
            building.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    copying = _unique_beside(path)
    shutil.copyfile(template, copying)
    try:
        os.link(copying, path)  # only if still absent: a store another process made meanwhile stays
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links
        if not path.exists():
            os.replace(copying, path)
    finally:
        copying.unlink(missing_ok=True)


def _unique_beside(path: Path) -> Path:
    """A name next to ``path`` that no other process or thread writes to."""
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


# A step's results that its config fixes (rows a round samples, optimizer steps, weight versions,
# accepted rows without a failure): in the step's log line, not charted as flat lines in MLflow,
# where the config's params already hold them.
NOT_CHARTED = frozenset({"explore/rows", "buffer/usual_rows", "sample/usual_rows", "sample/expert_rows", "train/steps",
                         "sync/weight_version", "sync/checked", "contract/accepted"})


# Data sizes and choices made once (the taskset's rows at prepare, the warm start's steps, how the
# flow cut its task runs): run tags, not metrics, which MLflow would draw as one-point charts ahead
# of the learning curves. ``Tracker.log_metrics`` writes them as tags.
TAGGED = frozenset({"tasks/train", "tasks/eval", "tasks/expert", "tasks/quarantined", "tasks/pipeline_dropped",
                    "tasks/pipeline_added", "warmup/steps", "warmup/resumed_from_step", "time/prefect_share",
                    "time/rounds_per_task_run"})


def charted(metrics: Mapping[str, float]) -> dict[str, float]:
    """``metrics`` less those ``NOT_CHARTED``."""
    return {k: v for k, v in metrics.items() if k not in NOT_CHARTED}


def tag_value(value: float) -> str:
    """A number as a tag shows it: an integer without ``.0``, else four significant digits."""
    return str(int(value)) if float(value).is_integer() else f"{value:.4g}"


# MLflow 3's UI shows each page in one of two views, chosen by ``workflowType`` in the link, else by
# what the browser last chose (GenAI, for a browser that never chose): every link names the training view
TRAINING_VIEW = "workflowType=machine_learning"
SHARED_VIEW = "rftflow"  # the experiment's saved runs-table view (``experiment_view``), by its share key
# the runs table's columns in that view: the learning figures, then where each campaign is
KEY_METRICS = ("accuracy/held_out", "reward/mean", "loss/total")
PROGRESS_TAGS = ("rftflow.progress", "rftflow.eta")


def run_url(ui: str, experiment_id: str, run_id: str) -> str:
    """A run's charts (its Model metrics tab) in the training view."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}/model-metrics?{TRAINING_VIEW}"


def artifact_url(ui: str, experiment_id: str, run_id: str, path: str) -> str:
    """A run's artifact (a table, a picture) in its Artifacts tab."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}/artifacts/{path}"


def experiment_url(ui: str, experiment_id: str) -> str:
    """An experiment's runs table in the training view, with the key metrics and progress as columns
    (the view ``experiment_view`` saves in the experiment)."""
    return f"{ui.rstrip('/')}/#/experiments/{experiment_id}/runs?viewStateShareKey={SHARED_VIEW}&{TRAINING_VIEW}"


def model_version_url(ui: str, name: str, version: str) -> str:
    """A registered model version's page in the training view (the GenAI view hides the registry)."""
    from urllib.parse import quote

    return f"{ui.rstrip('/')}/#/models/{quote(name, safe='')}/versions/{version}?{TRAINING_VIEW}"


def experiment_view() -> str:
    """The runs-table view ``experiment_url`` opens: MLflow's shared view state (an experiment tag
    ``mlflow.sharedViewState.<key>`` holding the page's JSON state, as its Share button saves it),
    with ``KEY_METRICS`` and ``PROGRESS_TAGS`` as columns; ``attributes.`Models``` keeps the
    registered versions in view. Column keys are MLflow's canonical ``<kind>.`<name>```."""
    import json

    columns = ([f"metrics.`{key}`" for key in KEY_METRICS] + [f"tags.`{key}`" for key in PROGRESS_TAGS]
               + ["attributes.`Models`"])
    return json.dumps({"selectedColumns": columns})


def campaign_runs(client, experiment_id: str, run_name: str) -> list:
    """The runs of a campaign in one run dir (tag ``rftflow.campaign_run`` = ``run_name``, or runs
    named ``run_name`` exactly, as before attempts were numbered), oldest first."""
    found = {}
    for query in (f"tags.`rftflow.campaign_run` = '{run_name}'", f"attributes.run_name = '{run_name}'"):
        for run in client.search_runs([experiment_id], query, order_by=["attributes.start_time ASC"]):
            found[run.info.run_id] = run
    return sorted(found.values(), key=lambda run: run.info.start_time)


def attempts_before(runs: list) -> int:
    """Attempts the earlier runs of a campaign made (``campaign_runs``): the highest ``rftflow.attempt``
    tag, or one per run for runs made before attempts were numbered."""
    numbered = [int(run.data.tags["rftflow.attempt"]) for run in runs if "rftflow.attempt" in run.data.tags]
    return max(numbered) if numbered else len(runs)


def registry_name(uri: str) -> str:
    """Where a campaign's registered models live, in a word (two campaigns in two run dirs each have
    a v1 of one name, in two registries): a SQLite file as ``<its folder>/<file>`` (``run/mlflow.db``),
    else the server's or database's host and port (never its credentials)."""
    from urllib.parse import urlsplit

    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        return f"{path.parent.name}/{path.name}"
    parts = urlsplit(uri)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def is_tracking_server(uri: str) -> bool:
    """An MLflow tracking server (``http(s)://``), as opposed to a database the client writes itself."""
    return uri.startswith(("http://", "https://"))


class Tracker:
    """One MLflow run: params, step metrics, artifacts, registration.

    ``run_id`` reopens an existing run (a resumed campaign): it is set RUNNING again, and a metric
    is never logged twice at one step (``history`` holds every value logged, {step: {key: value}},
    read back on reopening), so a round redone after a crash leaves one value per key and round.

    ``attempt`` (the attempt's number within the campaign's state, 1 for its first) numbers the
    attempts of a campaign across restarts: ``self.attempt`` continues from the attempts its earlier
    runs of ``run_name`` made (``--restart`` starts a new run, and a new state whose count starts
    at 1 again); a new run is named ``<run_name>-a<attempt>`` after the attempt that made it, tagged
    ``rftflow.campaign_run`` (``run_name``) and ``rftflow.attempts_before``; each attempt sets
    ``rftflow.attempt``. Without ``attempt`` the run is named ``run_name``.
    """

    def _experiment(self, name: str, artifact_root: Path | None, uri: str) -> str:
        """The id of experiment ``name``, made (and tagged) if missing. Campaigns that start together on
        a new tracking server race to make it: a loser's create or tag fails on the database's unique
        key, and it then reads what the winner made."""
        from mlflow.exceptions import MlflowException

        # the experiment's kind (read by MLflow UIs that choose the view by it; 3.17's follows the link)
        # and its runs table's saved view (``experiment_url``)
        tags = {"mlflow.experimentKind": "custom_model_development",
                f"mlflow.sharedViewState.{SHARED_VIEW}": experiment_view()}
        found = self.client.get_experiment_by_name(name)
        if found is not None and all(found.tags.get(k) == v for k, v in tags.items()):
            return found.experiment_id
        try:
            if found is None:
                # a tracking server keeps artifacts its own way
                location = (artifact_root / name).as_uri() if artifact_root and not is_tracking_server(uri) else None
                found = self.client.get_experiment(self.client.create_experiment(name, artifact_location=location))
            for key, value in tags.items():
                self.client.set_experiment_tag(found.experiment_id, key, value)
        except MlflowException:
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
        return found.experiment_id

    def __init__(self, uri: str, experiment: str, run_name: str, *, artifact_root: Path | None = None,
                 tags: Mapping[str, str] | None = None, run_id: str | None = None, attempt: int | None = None):
        from mlflow import MlflowClient

        self.uri = uri
        seed_sqlite_store(uri)
        self.client = MlflowClient(uri, registry_uri=uri)
        self.history: dict[int, dict[str, float]] = {}
        self.pending: list = []  # metrics held back by log_metrics(defer=True)
        self.pending_tags: dict[str, str] = {}  # and ``TAGGED`` values
        self.attempt = attempt
        if run_id is not None:
            self.run_id = run_id
            run = self.client.get_run(run_id)
            self.experiment_id = run.info.experiment_id
            for key in run.data.metrics:
                for m in self.client.get_metric_history(run_id, key):
                    self.history.setdefault(m.step, {})[key] = m.value
            self.client.update_run(run_id, status="RUNNING")
            for key in ("rftflow.version", "prefect.flow_run_id", "prefect.flow_run_url"):  # this attempt's
                if (tags or {}).get(key):
                    self.client.set_tag(run_id, key, tags[key])
            if attempt is not None:
                self.attempt = int(run.data.tags.get("rftflow.attempts_before", 0)) + attempt
                self.client.set_tag(run_id, "rftflow.attempt", str(self.attempt))
            return
        experiment_id = self._experiment(experiment, artifact_root, uri)
        self.experiment_id = experiment_id
        tags = dict(tags or {})
        if attempt is not None:
            before = attempts_before(campaign_runs(self.client, experiment_id, run_name))
            self.attempt = before + attempt
            tags |= {"rftflow.campaign_run": run_name, "rftflow.attempts_before": str(before),
                     "rftflow.attempt": str(self.attempt)}
            run_name = f"{run_name}-a{self.attempt}"
        self.run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
        self.run_name = run_name

    @functools.cached_property
    def run_name(self) -> str:
        return self.client.get_run(self.run_id).info.run_name

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set (or replace) the run's ``tags`` now."""
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log ``params`` (flattened, secrets masked); a resumed run already holds them."""
        from mlflow.entities import Param

        if self.client.get_run(self.run_id).data.params:
            return  # params are immutable in MLflow: a resumed run has them (and its config did not change)
        items = [Param(k, mask_secrets(k, v)[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int, *, defer: bool = False) -> None:
        """Log each metric at ``step`` unless this run already has it at that step; those ``TAGGED``
        become run tags instead. ``defer`` holds them until the next call without it (or ``flush``,
        ``finish``): one MLflow write for a round's stages instead of one per stage (each write to
        SQLite is a transaction)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        logged = self.history.setdefault(step, {})
        self.pending_tags.update((k, tag_value(v)) for k, v in metrics.items() if k in TAGGED)
        new = [Metric(k, float(v), now, step) for k, v in metrics.items() if k not in logged and k not in TAGGED]
        logged.update((m.key, m.value) for m in new)
        self.pending.extend(new)
        if not defer:
            self.flush()

    def flush(self) -> None:
        """Write the metrics and tags held back by ``log_metrics(defer=True)``."""
        if self.pending_tags:
            tags, self.pending_tags = self.pending_tags, {}
            self.set_tags(tags)
        if self.pending:
            batch, self.pending = self.pending, []
            for i in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
                self.client.log_batch(self.run_id, metrics=batch[i:i + 1000])

    @functools.cached_property
    def artifact_uri(self) -> str:
        """Where the run's artifacts live (fixed when the run is made)."""
        return self.client.get_run(self.run_id).info.artifact_uri

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> str:
        """Upload a directory; returns its artifact URI."""
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)
        return f"{self.artifact_uri}/{artifact_path}"

    def log_table(self, columns: Mapping[str, list], artifact_file: str) -> None:
        """Columns as an MLflow table (``artifact_file``, JSON; PIL images shown inline in its UI),
        replacing a table of that name (MLflow's ``log_table`` would append to it: a redone
        evaluation after a resume logs its table again)."""
        self.delete_artifacts(artifact_file)
        self.delete_artifacts(f"table_images/{artifact_file.removesuffix('.json')}")
        self.client.log_table(self.run_id, data=dict(columns), artifact_file=artifact_file)

    def delete_artifacts(self, artifact_path: str) -> None:
        """Delete a directory of the run's artifacts (an old checkpoint)."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        get_artifact_repository(self.artifact_uri).delete_artifacts(artifact_path)

    def register(self, name: str, source: str, tags: Mapping[str, str]) -> str:
        """Register ``source`` as a new version of model ``name``; returns the version. Once per
        run: a version this run already registered (before a crash) is returned instead."""
        from mlflow.exceptions import MlflowException

        for version in self.client.search_model_versions(f"name='{name}' and run_id='{self.run_id}'"):
            return str(version.version)
        try:
            self.client.create_registered_model(name)
        except MlflowException as e:
            if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
                raise
        version = self.client.create_model_version(name, source=source, run_id=self.run_id, tags=dict(tags))
        return str(version.version)

    def version_tagged(self, name: str, key: str, value: str) -> str | None:
        """A version of registered model ``name`` tagged ``key`` = ``value`` (None: none, or no such model)."""
        for version in self.client.search_model_versions(f"name='{name}' and tags.{key}='{value}'"):
            return str(version.version)
        return None

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED."""
        self.flush()
        self.client.set_terminated(self.run_id, status=status)
