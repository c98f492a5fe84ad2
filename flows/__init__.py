"""Prefect flows and the ``rftflow`` CLI. Thin: read config, call tasks in order, report."""

from __future__ import annotations

if __name__ != "rftflow.flows":  # installed as rftflow.flows (pyproject's package-dir), never bare
    raise ImportError(f"import rftflow.flows, not {__name__}: this folder is a part of the rftflow package")

import os

# Quiet, offline-friendly defaults; each is only a default (the environment wins).
_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # else "database is locked" noise on the ephemeral API
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "GX_ANALYTICS_ENABLED": "false",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TQDM_DISABLE": "1",  # transformers' GGUF de-quantization draws a bar of its own (plain tqdm)
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def quiet_defaults() -> None:
    """Apply the defaults above to this process's environment (before Prefect is imported)."""
    for key, value in _DEFAULTS.items():
        os.environ.setdefault(key, value)


quiet_defaults()
