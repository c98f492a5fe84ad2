"""MkDocs hook: mkdocstrings reads the ``rftflow`` package as it is installed.

The repository's folders install as ``rftflow.components``, ``rftflow.flows``, … through setuptools'
``package-dir`` (pyproject.toml), which mkdocstrings' module finder does not follow. Before a build,
the package is staged in a temporary folder as a wheel lays it out (``rftflow/`` with a copy of each
mapped folder under it), and the python handler reads its modules there."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def stage_package(into: Path) -> Path:
    """Copy each package of pyproject's ``package-dir`` to where its import name puts it under ``into``."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for name, folder in sorted(mapping.items()):  # rftflow before rftflow.components, ...
        shutil.copytree(ROOT / folder, into.joinpath(*name.split(".")), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return into


@event_priority(100)  # before mkdocstrings makes its handlers
def on_config(config):
    staged = Path(tempfile.mkdtemp(prefix="rftflow-docs-"))
    atexit.register(shutil.rmtree, staged, True)
    handlers = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [str(stage_package(staged))]
    return config
