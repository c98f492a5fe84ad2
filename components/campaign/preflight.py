"""The one validation gate: ``preflight`` runs before any work, wherever a campaign starts.

The CLI, the ``rft_campaign`` flow (called with a mapping or a YAML path, or run by a deployment)
and ``Campaign.from_config`` in a notebook all pass it once, and it fails before anything is written or
loaded, with one ``ConfigError`` line naming the culprit:

- the config: unknown keys, wrong types, moved keys, cross-field rules (``config.load_config``);
- the run dir: a path that is a file, lies under a file, or cannot be written;
- the store: a URL of an unknown scheme, with credentials, or malformed (nothing is connected or made);
- tracking: a URI MLflow cannot keep runs in;
- the model: a path that is not a model directory, an unknown built-in (nothing is built or loaded);
- the algorithm: an unknown preset part or advantage option, a pairwise loss on expert rows;
- the pipelines: an unknown operator or option, an option value of the wrong type;
- the taskset: a missing or unreadable task file, too many bad rows, a missing question or answer
  column, a question with two answers, too few tasks to hold some out, an unknown reasoning-gym
  dataset or parameter, a prompt template that names a missing field;
- the rewards: the code reward's sandbox runs; a reward by import path imports, has a reward's
  signature and scores a sample task (``check_rewards``);
- sizes that cannot fit (``sizes.check_sizes``): a response past the model's positions, a batch
  whose attention keys, values and logits exceed the memory available;
- the campaign already in the run dir's store: started with another config (the line lists the
  keys that differ; ``restart`` moves it aside instead), or running right now in another process;
  or missing from the store while the run dir's tracking store holds attempts of it (an emptied
  bucket, a wrong prefix: ``restart`` starts it anew).

A store down past ``storage.outage_seconds`` raises ``StoreUnavailable`` (a failure, not bad input).

A finished campaign passes: ``Preflight.previous`` tells callers, who then have nothing to do.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rftflow.components.algorithms import Algorithm
from rftflow.components.buffer.layout import run_store_url
from rftflow.components.campaign.state import (AlreadyRunning, CampaignState, StateStore, config_changes, running_line,
                                               state_role, tracked_attempts)
from rftflow.components.buffer.store import StoreUnavailable, open_store, parse_store_url, store_options
from rftflow.components.campaign.sizes import check_sizes
from rftflow.components.secrets import redact_url
from rftflow.components.config import CampaignConfig, ConfigError, Mode, load_config
from rftflow.components.data.pipelines import check_pipeline
from rftflow.components.data.tasksets import check_taskset
from rftflow.components.verify.rewards import check_rewards
from rftflow.components.explore.models import check_images, check_model_path
from rftflow.components.tracking import is_tracking_server

# Backends MLflow 3 keeps runs in (SQLAlchemy dialects may carry a driver: postgresql+psycopg2).
TRACKING_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")


@dataclass(frozen=True)
class Preflight:
    """What the gate checked and resolved: the config, the run dir, the algorithm, where things go."""

    cfg: CampaignConfig
    run_dir: Path
    algorithm: Algorithm
    previous: CampaignState | None = None  # the state of the campaign already in the store, if any

    @property
    def finished(self) -> bool:
        return self.previous is not None and self.previous.status == "finished"

    @property
    def tracking_uri(self) -> str:
        """``tracking.uri``, else ``MLFLOW_TRACKING_URI`` (a team's MLflow server, set once for a
        worker), else ``sqlite:///<run dir>/mlflow.db``."""
        return configured_tracking_uri(self.cfg) or f"sqlite:///{self.run_dir / 'mlflow.db'}"

    @property
    def store_url(self) -> str:
        return run_store_url(self.cfg.storage, self.run_dir)

    @property
    def label(self) -> str:
        return campaign_label(self.cfg.name, self.run_dir)


def campaign_label(name: str, run_dir: str | Path) -> str:
    """The campaign's name and a short hash of its run dir (``arith-mix-3f2a1c``): what tells two
    campaigns of one name in two run dirs apart in Prefect and MLflow."""
    return f"{name}-{hashlib.sha256(str(Path(run_dir).expanduser().resolve()).encode()).hexdigest()[:6]}"


def preflight(config: CampaignConfig | Mapping[str, Any] | str | Path | None = None,
              run_dir: str | Path | None = None, overrides: Sequence[str] = (), *, restart: bool = False) -> Preflight:
    """Check a campaign before any work (see the module docstring); ``ConfigError`` on the first problem.

    ``config``: a ``CampaignConfig``, a mapping of its keys, the path of a campaign YAML file, or
    None (all defaults); ``overrides``: ``key.path=value`` strings; ``run_dir`` defaults to
    ``runs/<name>``; ``restart``: the campaign already there will be moved aside, so its config
    may differ.
    """
    cfg = load_config(config, overrides)
    out = Path(run_dir if run_dir is not None else Path("runs") / cfg.name).expanduser().resolve()
    try:
        _check_run_dir(out)
        parse_store_url(run_store_url(cfg.storage, out))
        _check_tracking_uri(configured_tracking_uri(cfg))
        check_model_path(cfg.model.path, allow_download=cfg.model.allow_download)
        algorithm = cfg.algorithm.resolve()
        check_pipeline("tasks", cfg.pipelines.tasks)
        check_pipeline("experiences", cfg.pipelines.experiences)
        if not algorithm.uses_explorer and cfg.buffer.expert_per_round == 0:
            raise ValueError(f"buffer.expert_per_round must be > 0 for {algorithm.name!r} (it trains on expert "
                             "rows only)")
        samples = _checked_tasksets(cfg)  # it reads the task files or generates a task
        check_images(cfg, samples, algorithm)  # tasks with pictures: a vision-language model on the hf engine
        _warn_lora_on_random_base(cfg)
        check_sizes(cfg, samples)  # a response past the model's positions, a batch past the memory
        check_rewards(cfg, samples)  # the code sandbox runs here; rewards by import path score a sample task
        previous = None if restart else _previous_state(cfg, out)
    except (ConfigError, StoreUnavailable):  # the store down past its outage budget is no bad input
        raise
    except (ValueError, OSError) as e:  # each names its key, file or URL
        raise ConfigError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return Preflight(cfg, out, algorithm, previous)


RANDOM_BASES = ("builtin:tiny", "builtin:tiny-wide")  # built with random weights (components.explore.models)


def _warn_lora_on_random_base(cfg: CampaignConfig) -> None:
    """One line when ``model.lora`` would adapt a randomly initialised model: an adapter on noise
    samples noise, every reward stays near 0 and the rounds learn nothing, silently."""
    if cfg.model.lora is not None and cfg.model.path in RANDOM_BASES and cfg.model.path not in _WARNED:
        _WARNED.add(cfg.model.path)
        logging.getLogger("rftflow").warning(
            "model.lora on %s, a randomly initialised model: an adapter on it samples noise and the rounds learn "
            "nothing; train its full weights first (trainer.warmup_steps without model.lora) and put the adapter on "
            "that model's directory, or start from a pretrained model (builtin:smollm2-135m-instruct)", cfg.model.path)


_WARNED: set[str] = set()


def _checked_tasksets(cfg: CampaignConfig) -> dict[str | None, list]:
    """Each taskset (the campaign's, or each mixture part's) read and checked (``check_taskset``): its
    tasks by part (None outside a mixture), samples for the rewards' check."""
    samples = {}
    for part, taskset in (cfg.part_tasksets() or {None: cfg.taskset}).items():
        try:
            samples[part] = check_taskset(taskset, cfg.contracts)
        except ValueError as e:
            raise ValueError(f"mixture part {part}: {e}" if part else str(e)) from None
    return samples


def _previous_state(cfg: CampaignConfig, run_dir: Path) -> CampaignState | None:
    """The state of campaign ``cfg.name`` in the run's store (None if it never started); fails if it
    was started with another config or is running in another process. Reads, never writes."""
    url = run_store_url(cfg.storage, run_dir)
    scheme, location, _ = parse_store_url(url)
    if cfg.mode == Mode.BENCH:
        return None  # a bench run keeps no campaign state
    role = state_role(cfg, run_dir)
    if scheme == "file" and not (Path(location) / cfg.name / "state").is_dir():
        _check_state_not_lost(cfg, run_dir, f"{url}/{cfg.name}/state/{role}/")
        return None  # (opening a FileStore would create its directory)
    try:
        store = open_store(url, **(store_options(cfg.storage) if scheme == "s3" else {}))
        previous = StateStore(store, cfg.name, role).read()
    except Exception as e:  # noqa: BLE001 — botocore's errors (no such bucket, access denied) in one line
        if isinstance(e, (ValueError, ConfigError, StoreUnavailable)):
            raise
        raise ValueError(f"storage.url {redact_url(url)}: cannot read campaign {cfg.name!r}: "
                         f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if previous is None:
        _check_state_not_lost(cfg, run_dir, f"{redact_url(url)}/{cfg.name}/state/{role}/")
        return None
    changes = config_changes(previous.config, cfg.model_dump(mode="json"))
    if changes:
        raise ValueError(f"run dir {run_dir} holds campaign {cfg.name!r} with another config: {'; '.join(changes)}; "
                         "run it with its own config, or start over with --restart (the old run is moved aside)")
    if previous.alive_elsewhere():
        raise AlreadyRunning(running_line(previous))
    return previous


def _check_state_not_lost(cfg: CampaignConfig, run_dir: Path, expected: str) -> None:
    """``ValueError`` when the campaign has no state in its store although its tracking store holds
    attempts of it from this run dir (an emptied bucket, a wrong ``storage.url`` or prefix, an S3
    server restarted without its data): it would start anew in silence. ``--restart`` starts it anew."""
    uri = configured_tracking_uri(cfg) or f"sqlite:///{run_dir / 'mlflow.db'}"
    runs = tracked_attempts(uri, cfg.tracking.experiment, run_name(cfg, run_dir))
    if runs:
        raise ValueError(f"run dir {run_dir} ran campaign {cfg.name!r} before (MLflow run {runs[-1]} in "
                         f"{redact_url(uri)}), but its state is missing from its store: expected under {expected}; "
                         "point storage.url at the store that holds it, or start over with --restart")


def run_name(cfg: CampaignConfig, run_dir: str | Path) -> str:
    """The MLflow run name of the campaign's attempts in ``run_dir``: its label (``campaign_label``),
    with ``-explorer`` for an explorer process of its own."""
    label = campaign_label(cfg.name, run_dir)
    return f"{label}-explorer" if cfg.mode == Mode.EXPLORE else label


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


def configured_tracking_uri(cfg: CampaignConfig) -> str | None:
    """``tracking.uri``, else ``MLFLOW_TRACKING_URI``; None: the run dir's own SQLite store."""
    return cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")


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
    if is_tracking_server(uri):  # else MLflow's client retries for minutes, then fails in a wall of text
        import urllib.request

        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=10)
        except OSError as e:
            reason = getattr(e, "reason", e)
            raise ValueError(f"tracking.uri {redact_url(uri)!r}: no MLflow server answers ({reason})") from None
