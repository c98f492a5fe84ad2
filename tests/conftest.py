"""Shared fixtures: a private model cache, quiet service defaults, a Prefect test API."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("RFTFLOW_CACHE_DIR", tempfile.mkdtemp(prefix="rftflow-cache-"))
import flows  # noqa: E402,F401  (applies the quiet service defaults before Prefect is imported)


@pytest.fixture(scope="session")
def prefect_api():
    """A real (temporary) Prefect API for the whole session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny():
    """builtin:tiny, built once, loaded like any local model directory."""
    from components.models import load_model

    return load_model("builtin:tiny")
