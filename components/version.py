"""The version of the installed rftflow: recorded with each attempt of a campaign and in its MLflow run."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("rftflow")
except PackageNotFoundError:  # a source tree that was never installed
    VERSION = "0+unknown"
