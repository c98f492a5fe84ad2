"""MLflow helpers: one run per campaign, metrics per round, the final model registered.

Uses ``MlflowClient`` with an explicit tracking URI (no global state); the default store is
``sqlite:///<run dir>/mlflow.db`` with artifacts under ``<run dir>/mlartifacts``.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# A new SQLite store logs its schema set-up at INFO on every first use.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)

SECRET_KEY = re.compile(r"secret|password|token|credential|access_key|api_key", re.IGNORECASE)
URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")


def mask_secrets(key: str, value: Any) -> str:
    """The value as logged: secrets by key name become ``***``; credentials inside URLs too."""
    if SECRET_KEY.search(key):
        return "***"
    return URL_USERINFO.sub("***@", str(value))


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} → {"a.b": 1}."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


class Tracker:
    """One MLflow run: params, step metrics, artifacts, registration."""

    def __init__(self, uri: str, experiment: str, run_name: str, *, artifact_root: Path | None = None,
                 tags: Mapping[str, str] | None = None, run_id: str | None = None):
        from mlflow import MlflowClient

        self.uri = uri
        self.client = MlflowClient(uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            location = (artifact_root / experiment).as_uri() if artifact_root else None
            experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        if run_id is None:
            run_id = self.client.create_run(experiment_id, run_name=run_name, tags=dict(tags or {})).info.run_id
        self.run_id = run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, mask_secrets(k, v)[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=items[i:i + 100])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])

    def log_artifacts(self, local_dir: str | Path, artifact_path: str) -> str:
        """Upload a directory; returns its artifact URI."""
        self.client.log_artifacts(self.run_id, str(local_dir), artifact_path)
        return f"{self.client.get_run(self.run_id).info.artifact_uri}/{artifact_path}"

    def register(self, name: str, source: str, tags: Mapping[str, str]) -> str:
        """Register ``source`` as a new version of model ``name``; returns the version."""
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(name)
        except MlflowException as e:
            if "RESOURCE_ALREADY_EXISTS" not in str(e.error_code):
                raise
        version = self.client.create_model_version(name, source=source, run_id=self.run_id, tags=dict(tags))
        return str(version.version)

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)
