"""The docs: every config key described, the generated configuration reference current, and the
site building with ``mkdocs build --strict`` (broken links, missing pages, bad docstrings fail)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rftflow.flows.reference import config_reference, undocumented_keys

ROOT = Path(__file__).resolve().parents[1]


def test_every_config_key_has_a_description():
    assert undocumented_keys() == []


def test_the_configuration_reference_is_the_one_generated_from_the_schema():
    page = ROOT / "docs" / "reference" / "configuration.md"
    assert page.read_text() == config_reference(), (
        "docs/reference/configuration.md is out of date: rftflow config reference > docs/reference/configuration.md")


@pytest.mark.skipif(not (ROOT / "mkdocs.yml").is_file(), reason="no mkdocs.yml in this checkout")
def test_the_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
