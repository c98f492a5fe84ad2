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


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 server on 127.0.0.1 (a free port, own process) for the session, with fake
    credentials and ``AWS_ENDPOINT_URL`` pointing at it in ``os.environ`` (nothing reaches AWS)."""
    from tests.s3server import S3TestServer

    with S3TestServer() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server):
    """A fresh, empty bucket on the session's S3 server."""
    return s3_server.new_bucket()
