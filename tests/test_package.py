"""One import name: the wheel installs ``rftflow`` and nothing else at the top level, with every
module of the repository's folders and the shipped configs; ``import rftflow`` gives the version
and the notebook API without importing torch."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("components", "flows", "tasks", "infra", "configs")


def test_the_wheel_holds_rftflow_alone_with_every_module_and_the_shipped_configs(tmp_path):
    source = tmp_path / "source"  # a copy: setuptools builds in the source tree (its build/ folder)
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "rftflow", *FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name, **({"symlinks": True, "ignore": shutil.ignore_patterns("__pycache__")}
                                           if copy is shutil.copytree else {}))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(source),
                            "-w", str(tmp_path)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = tmp_path.glob("rftflow-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"rftflow", f"rftflow-{version('rftflow')}.dist-info"}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".py", ".yaml", ".sh") and "__pycache__" not in path.parts:
                assert f"rftflow/{path.relative_to(ROOT)}" in names, path
    entry_points = zipfile.ZipFile(wheel).read(f"rftflow-{version('rftflow')}.dist-info/entry_points.txt").decode()
    assert "rftflow = rftflow.flows.cli:main" in entry_points


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
