"""One import name: the repository's folders install as ``rftflow.*`` through pyproject's
``package-dir``. The wheel holds ``rftflow`` and nothing else at the top level, every file of the
mapped folders byte for byte (modules and package data) and no other; installed into a fresh
virtualenv outside the repository, its ``rftflow`` command runs a round of the default campaign
from another directory and finds the shipped configs and data. An editable install maps the same
names to the checkout's folders; a folder imported by its bare name fails in one line; a static
analyser (mypy) resolves every ``rftflow.*`` import of the package, the tests, the benchmarks and the
docs' scripts against the wheel's layout. ``import rftflow`` gives the version and the notebook API
without importing torch."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import SMALL

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
PACKAGE_DIR: dict[str, str] = SETUPTOOLS["package-dir"]  # import name → folder
FOLDERS = ("components", "flows", "tasks", "infra", "configs")
NOT_SOURCE = (".git", ".venv*", "__pycache__", "*.egg-info", "build", "dist", "site", "runs", ".pytest_cache")


def _source_files() -> dict[str, Path]:
    """Every file of the mapped folders (what the wheel must hold), by its path in the wheel."""
    files = {}
    for name, folder in PACKAGE_DIR.items():
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files["/".join([*name.split("."), *path.relative_to(ROOT / folder).parts])] = path
    return files


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _bare_venv(where: Path) -> Path:
    """A fresh virtualenv without pip whose dependencies are this environment's, put on its path by
    a ``.pth`` line (this environment's own ``.pth`` files, this checkout's editable install among
    them, are not run); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A copy of the checkout (setuptools writes its build files into the source tree)."""
    copy = tmp_path_factory.mktemp("source") / "rftflow-source"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    return copy


@pytest.fixture(scope="module")
def wheel(source, tmp_path_factory) -> Path:
    """The wheel, built with pip from the copy of the checkout."""
    work = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            str(source), "-w", str(work)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = work.glob("rftflow-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh virtualenv outside the repository with the wheel installed (``--no-deps``, see
    ``_bare_venv``); its ``bin``."""
    python = _bare_venv(tmp_path_factory.mktemp("venv") / "env")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                           "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return python.parent


def test_pyproject_lists_every_package_of_the_mapped_folders():
    """A folder with an ``__init__.py`` that pyproject does not list would be left out of the wheel."""
    found = {".".join([name, *init.parent.relative_to(ROOT / folder).parts])
             for name, folder in PACKAGE_DIR.items() for init in (ROOT / folder).rglob("__init__.py")}
    assert sorted(found) == sorted(SETUPTOOLS["packages"])
    assert sorted(PACKAGE_DIR) == sorted(["rftflow", *(f"rftflow.{f}" for f in FOLDERS)])
    assert not any((ROOT / "rftflow" / f).exists() for f in FOLDERS)  # no links: the mapping alone


def test_the_wheel_holds_rftflow_alone_with_every_file_of_the_folders_and_no_other(wheel):
    archive = zipfile.ZipFile(wheel)
    dist_info = f"rftflow-{version('rftflow')}.dist-info"
    names = {n for n in archive.namelist() if not n.startswith(f"{dist_info}/")}
    assert {n.split("/")[0] for n in archive.namelist()} == {"rftflow", dist_info}
    expected = _source_files()
    assert names == set(expected), (sorted(set(expected) - names), sorted(names - set(expected)))
    changed = [n for n, path in expected.items() if _sha256(archive.read(n)) != _sha256(path.read_bytes())]
    assert changed == []
    assert "rftflow = rftflow.flows.cli:main" in archive.read(f"{dist_info}/entry_points.txt").decode()


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
    shipped = {name.removeprefix("rftflow/"): path for name, path in _source_files().items()
               if name.startswith(("rftflow/configs/", "rftflow/infra/")) and path.suffix != ".py"}
    assert set(shipped) <= set(found["files"]), set(shipped) - set(found["files"])
    package = Path(found["module"]).parent
    assert [n for n, path in shipped.items() if _sha256((package / n).read_bytes()) != _sha256(path.read_bytes())] == []

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
    assert lines[1] == str(["__version__", "load_config", "load_registered_model", "open_store", "promote",
                            "read_experiences", "run_campaign"])
    assert lines[2] == "False False"


def test_a_shipped_config_is_found_by_name_from_any_directory():
    code = "import rftflow; print(rftflow.load_config('arith-grpo').name, rftflow.load_config().name)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0 and out.stdout.split() == ["arith-grpo", "campaign"], out.stderr


def test_an_editable_install_maps_the_names_to_the_checkouts_folders(source, tmp_path):
    python = _bare_venv(tmp_path / "env")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                           "--no-build-isolation", "--no-index", "-e", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    code = ("import json, rftflow, rftflow.components.config as c, rftflow.flows.cli as f, rftflow.tasks.stages as t, "
            "rftflow.infra.vllm_server as i, rftflow.configs as d; "
            "print(json.dumps([m.__file__ for m in (c, f, t, i, d)] + [rftflow.load_config('arith-grpo').name]))")
    shown = subprocess.run([python, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert shown.returncode == 0, shown.stderr
    *files, name = json.loads(shown.stdout)
    assert files == [str(source / f) for f in ("components/config.py", "flows/cli.py", "tasks/stages.py",
                                                "infra/vllm_server.py", "configs/__init__.py")]
    assert name == "arith-grpo"


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_folder_imported_by_its_bare_name_fails_in_one_line_naming_rftflow(folder):
    done = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (f"ImportError: import rftflow.{folder}, not {folder}: "
                                            "this folder is a part of the rftflow package")


MYPY_CONFIG = """[mypy]
ignore_missing_imports = True
follow_imports = silent
no_site_packages = True
explicit_package_bases = True
check_untyped_defs = True

[mypy-rftflow.*]
ignore_missing_imports = False
"""
# what mypy says of an import it cannot resolve, or of a name a module of rftflow does not have
UNRESOLVED = re.compile(r'module named "rftflow[."]|Module "rftflow[^"]*" has no attribute|Module has no attribute')


def test_a_static_analyser_resolves_every_rftflow_import_against_the_wheels_layout(wheel, tmp_path):
    """mypy on the wheel's ``rftflow`` and the repository's tests, benchmarks and docs' scripts beside
    it: imports at module level and inside functions, ``import`` and ``from … import``. Only this is
    checked: third-party packages are not read (their names are Any), other type errors are not
    this test's."""
    pytest.importorskip("mypy", reason="the dev extra is not installed: pip install -e '.[dev]'")
    archive = zipfile.ZipFile(wheel)
    archive.extractall(tmp_path, [n for n in archive.namelist() if n.startswith("rftflow/")])
    for folder in ("tests", "benchmarks", "docs"):
        for path in (ROOT / folder).rglob("*.py"):
            if "fixtures" not in path.relative_to(ROOT).parts:
                (tmp_path / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, tmp_path / path.relative_to(ROOT))
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG)
    done = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir",
                           str(tmp_path / "cache"), "rftflow", "tests", "benchmarks", "docs"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]  # 2: mypy could not run
    assert [line for line in done.stdout.splitlines() if UNRESOLVED.search(line)] == []
