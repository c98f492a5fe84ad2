"""The layering rule of docs/architecture.md, kept: every module's imports — at the top of the module
and inside functions, ``import x`` and ``from x import y``, relative ones resolved — against the
page's table of rooms and levels. A module imports its own room or a lower level, never sideways or
upward, and never a package its row forbids."""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE_DIR: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


@dataclass(frozen=True)
class Rule:
    level: int
    never: frozenset[str]  # top-level packages the room never imports


def read_table(page: str) -> dict[str, Rule]:
    """The rooms table of ``page``: room → its level and forbidden packages."""
    head = re.search(r"^\| level \| rooms \| never imports \|.*\n\|[- |]+\|\n((?:\|.*\n)+)", page, re.M)
    assert head, f"{PAGE.relative_to(ROOT)}: no table with the columns level, rooms, never imports"
    rules = {}
    for row in head.group(1).splitlines():
        level, rooms, never = (cell.strip() for cell in row.strip("|").split("|")[:3])
        for room in re.findall(r"`([^`]+)`", rooms):
            assert room not in rules, f"{PAGE.relative_to(ROOT)}: room {room} is on two rows"
            rules[room] = Rule(int(level), frozenset(re.findall(r"`([^`]+)`", never)))
    return rules


def room_of(module: str) -> str:
    """``rftflow.components.explore.engines`` → ``explore``; ``rftflow.flows.cli`` → ``flows``;
    ``rftflow``, ``rftflow.__main__`` → ``rftflow``."""
    parts = module.split(".")
    if parts[:2] == ["rftflow", "components"]:
        return parts[2] if len(parts) > 2 else "components"
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else "rftflow"


def modules() -> dict[str, Path]:
    """Every module of the package, by import name (pyproject's ``package-dir``: folder → name)."""
    found = {}
    for name, folder in PACKAGE_DIR.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [*name.split("."), *path.relative_to(ROOT / folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(module: str, source: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported module) of every import statement anywhere in ``source``; ``from a import b``
    names ``a.b`` when that is a module, else ``a``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in known else base) for a in node.names]
    return found


def broken_rules(rules: dict[str, Rule], module: str, source: str, is_package: bool, known: set[str]) -> list[str]:
    """Each import of ``module`` that the table does not allow: ``line: what is broken``."""
    here = room_of(module)
    if here not in rules:
        return [f"1: room {here!r} is not in the table of {PAGE.relative_to(ROOT)}"]
    broken = []
    for line, target in imports(module, source, is_package, known):
        top = target.split(".")[0]
        if top != "rftflow":
            if top in rules[here].never:
                broken.append(f"{line}: {here} never imports {top} ({target})")
            continue
        there = room_of(target)
        if there == here:
            continue
        if there not in rules:
            broken.append(f"{line}: imports {target}, whose room {there!r} is not in the table")
        elif rules[there].level >= rules[here].level:
            way = "sideways" if rules[there].level == rules[here].level else "upward"
            broken.append(f"{line}: {here} (level {rules[here].level}) imports {target} of {there} "
                          f"(level {rules[there].level}): {way}")
    return broken


@pytest.fixture(scope="module")
def rules() -> dict[str, Rule]:
    return read_table(PAGE.read_text())


def test_every_import_of_every_module_follows_the_layering_table(rules):
    found = modules()
    broken = [f"{path.relative_to(ROOT)}:{problem}" for module, path in sorted(found.items())
              for problem in broken_rules(rules, module, path.read_text(), path.name == "__init__.py", set(found))]
    assert broken == [], "imports the layering table (docs/architecture.md) does not allow:\n" + "\n".join(broken)


def test_the_table_names_the_rooms_there_are(rules):
    assert sorted(rules) == sorted({room_of(m) for m in modules()})


@pytest.mark.parametrize("module, source, problem", [
    ("rftflow.components.data.tasksets", "def f():\n    from rftflow.components.explore.environments import x\n",
     "2: data (level 2) imports rftflow.components.explore.environments of explore (level 4): upward"),
    ("rftflow.components.verify.scoring", "from rftflow.components.explore import engines\n",
     "1: verify (level 4) imports rftflow.components.explore.engines of explore (level 4): sideways"),
    ("rftflow.components.campaign.run", "import rftflow\n",
     "1: campaign (level 5) imports rftflow of rftflow (level 9): upward"),
    ("rftflow.components.buffer.store", "from ...flows import cli\n",
     "1: buffer (level 3) imports rftflow.flows.cli of flows (level 8): upward"),
    ("rftflow.components.train.trainer", "import prefect.tasks\n", "1: train never imports prefect (prefect.tasks)"),
])
def test_a_forbidden_import_is_named_with_its_line_and_the_rule(rules, module, source, problem):
    assert broken_rules(rules, module, source, False, set(modules())) == [problem]


def test_allowed_imports_pass(rules):
    source = ("from rftflow.components.data.tasksets import Task\nfrom . import engines\n"
              "def f():\n    import rftflow.components.config\n    from rftflow.components import buffer\n")
    assert broken_rules(rules, "rftflow.components.explore.models", source, False, set(modules())) == []
