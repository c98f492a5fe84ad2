"""One import name: the wheel installs ``rftflow`` and nothing else at the top level, with every
module of the repository's folders and every data file of configs/ and infra/; installed into a
fresh virtualenv outside the repository, its ``rftflow`` command runs a round of the default
campaign from another directory and finds the shipped configs and data; ``import rftflow`` gives
the version and the notebook API without importing torch."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("components", "flows", "tasks", "infra", "configs")
DATA = ("configs", "infra")  # folders whose every file ships, code or not
NOT_SOURCE = (".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", "site", "runs", ".pytest_cache")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built with pip from a copy of the checkout (setuptools builds in the source tree)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                            "-w", str(work)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = work.glob("rftflow-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv outside the repository with the wheel installed (``--no-deps``: its
    dependencies are this environment's, put on its path by a ``.pth`` line, whose own ``.pth``
    files, this checkout's editable install among them, are not run); its ``bin``."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                           "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv / "bin"


def test_the_wheel_holds_rftflow_alone_with_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"rftflow", f"rftflow-{version('rftflow')}.dist-info"}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and (path.suffix == ".py" or folder in DATA):
                assert f"rftflow/{path.relative_to(ROOT)}" in names, path
    entry_points = zipfile.ZipFile(wheel).read(f"rftflow-{version('rftflow')}.dist-info/entry_points.txt").decode()
    assert "rftflow = rftflow.flows.cli:main" in entry_points


def test_the_installed_wheel_runs_a_round_from_another_directory_with_its_package_data(installed, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PREFECT_API_URL")}
    env |= {"PREFECT_HOME": str(tmp_path / "prefect"), "HOME": str(tmp_path / "home")}
    code = ("import json, rftflow, importlib.resources as r; "
            "print(json.dumps({'module': rftflow.__file__, 'files': sorted(str(p.relative_to(r.files('rftflow'))) "
            "for d in ('configs', 'infra') for p in r.files('rftflow').joinpath(d).rglob('*') if p.is_file() "
            "and '__pycache__' not in p.parts)}))")
    shown = subprocess.run([installed / "python", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert Path(found["module"]).is_relative_to(installed.parent), found["module"]  # the wheel's, not the checkout's
    shipped = {str(p.relative_to(ROOT)) for d in DATA for p in (ROOT / d).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}
    assert shipped <= set(found["files"]), shipped - set(found["files"])

    run = subprocess.run([installed / "rftflow", "run", "--run-dir", "run", "--no-progress",
                          *[a for s in (*SMALL, "rounds=1") for a in ("--set", s)]],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "Traceback" not in out, out[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["campaign"] == "arith-mix" and summary["rounds"] == 1
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_import_rftflow_is_light_and_has_the_version_and_the_api():
    code = ("import sys, rftflow; print(rftflow.__version__); print(sorted(rftflow.__all__)); "
            "print('torch' in sys.modules, 'prefect' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == version("rftflow")
    assert lines[1] == str(["__version__", "load_config", "open_store", "promote", "read_experiences", "run_campaign"])
    assert lines[2] == "False False"


def test_a_shipped_config_is_found_by_name_from_any_directory():
    code = "import rftflow; print(rftflow.load_config('arith-grpo').name, rftflow.load_config().name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.split() == ["arith-grpo", "campaign"], out.stderr
