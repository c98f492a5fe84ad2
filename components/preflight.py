"""The one validation gate: ``preflight`` runs before any work, wherever a campaign starts.

The CLI, the ``rft_campaign`` flow (called with a mapping or a YAML path, or run by a deployment)
and ``Campaign(...)`` in a notebook all pass it, and it fails before anything is written or
loaded, with one ``ConfigError`` line naming the culprit:

- the config: unknown keys, wrong types, moved keys, cross-field rules (``config.load_config``);
- the run dir: a path that is a file, lies under a file, or cannot be written;
- the store: a URL of an unknown scheme, with credentials, or malformed (nothing is connected or made);
- tracking: a URI MLflow cannot keep runs in;
- the model: a path that is not a model directory, an unknown built-in (nothing is built or loaded);
- the algorithm: an unknown preset part or advantage option, a pairwise loss on expert rows;
- the pipelines: an unknown operator or option, an option value of the wrong type;
- the taskset: a missing or unreadable task file, too many bad rows, an unknown reasoning-gym
  dataset or parameter, a prompt template that names a missing field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from components.algorithms import Algorithm
from components.buffer.layout import run_store_url
from components.buffer.store import parse_store_url, redact_url
from components.config import CampaignConfig, ConfigError, load_config
from components.data.pipelines import check_pipeline
from components.data.tasksets import check_taskset
from components.explore.models import check_model_path

# Backends MLflow 3 keeps runs in (SQLAlchemy dialects may carry a driver: postgresql+psycopg2).
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


@dataclass(frozen=True)
class Preflight:
    """What the gate checked and resolved: the config, the run dir, the algorithm, where things go."""

    cfg: CampaignConfig
    run_dir: Path
    algorithm: Algorithm

    @property
    def tracking_uri(self) -> str:
        return self.cfg.tracking.uri or f"sqlite:///{self.run_dir / 'mlflow.db'}"

    @property
    def store_url(self) -> str:
        return run_store_url(self.cfg.storage, self.run_dir)


def preflight(config: CampaignConfig | Mapping[str, Any] | str | Path | None = None,
              run_dir: str | Path | None = None, overrides: Sequence[str] = ()) -> Preflight:
    """Check a campaign before any work (see the module docstring); ``ConfigError`` on the first problem.

    ``config``: a ``CampaignConfig``, a mapping of its keys, the path of a campaign YAML file, or
    None (all defaults); ``overrides``: ``key.path=value`` strings; ``run_dir`` defaults to
    ``runs/<name>``.
    """
    cfg = load_config(config, overrides)
    out = Path(run_dir if run_dir is not None else Path("runs") / cfg.name).expanduser().resolve()
    try:
        _check_run_dir(out)
        parse_store_url(run_store_url(cfg.storage, out))
        _check_tracking_uri(cfg.tracking.uri)
        check_model_path(cfg.model.path, allow_download=cfg.model.allow_download)
        algorithm = cfg.algorithm.resolve()
        check_pipeline("tasks", cfg.pipelines.tasks)
        check_pipeline("experiences", cfg.pipelines.experiences)
        if not algorithm.uses_explorer and cfg.buffer.expert_per_round == 0:
            raise ValueError(f"buffer.expert_per_round must be > 0 for {algorithm.name!r} (it trains on expert "
                             "rows only)")
        check_taskset(cfg.taskset, cfg.contracts)  # last: it reads the task file or generates a task
    except ConfigError:
        raise
    except (ValueError, OSError) as e:  # each names its key, file or URL
        raise ConfigError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return Preflight(cfg, out, algorithm)


def _check_run_dir(run_dir: Path) -> None:
    """The run dir is a directory, or can be made one: no file on its path, a writable ancestor."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"run dir {run_dir}: exists and is not a directory")
    ancestor = run_dir
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"run dir {run_dir}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"run dir {run_dir}: {ancestor} is not writable")


def _check_tracking_uri(uri: str | None) -> None:
    if uri is None:
        return
    scheme = urlsplit(uri).scheme.split("+")[0]
    if scheme in ("", "file"):
        raise ValueError(f"tracking.uri {redact_url(uri)!r}: MLflow 3 keeps no runs in plain files; use "
                         "sqlite:///path/to/mlflow.db or a tracking server (http://host:5000)")
    if scheme not in TRACKING_SCHEMES:
        raise ValueError(f"tracking.uri {redact_url(uri)!r}: unsupported scheme {scheme!r}; supported: "
                         f"{', '.join(TRACKING_SCHEMES)}")
