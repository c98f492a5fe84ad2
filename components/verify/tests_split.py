"""How a `tests` task splits over two sandboxes, read from its source before anything runs.

The tests' sandbox gets the task's own helpers — its ``code_prompt`` without the entry point's
``def`` (HumanEval's ``poly``, ``encode_cyclic``: code the tests call, taken from the task, never
from the response) — and its tests, where each name of the program's that the tests call stands
for a proxy: the entry point, ``candidate``, and every name the tests use without defining it
(MBPP's ``assert remove_Occ("hello", "l") == "heo"``).

A task whose tests need the program's objects themselves is refused (``Refusal``, with the reason):
tests that read an attribute of the candidate (``candidate.__name__``), pass it to a function not
their own (``inspect.getsource(candidate)``), pass a function to it, or call nothing of the
program. What the source does not show (an argument that is an object, not a literal) the
proxy refuses when it happens.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass

_BUILTINS = frozenset(dir(builtins))


class Refusal(ValueError):
    """Tests that two sandboxes cannot run (the message says why)."""


@dataclass(frozen=True)
class Split:
    """The tests' sandbox's code: ``helpers``, ``tests``, and ``names`` (a name in the tests → the
    program's function it stands for)."""

    helpers: str
    tests: str
    names: dict[str, str]


def helpers_of(prompt: str, entry_point: str | None) -> str:
    """``prompt``'s code without the ``def`` of ``entry_point`` (a prompt that ends at a signature
    gets a ``pass`` body to parse)."""
    if not prompt.strip():
        return ""
    for source in (prompt, prompt.rstrip() + "\n    pass\n"):
        try:
            tree = ast.parse(source)
            break
        except SyntaxError:
            continue
    else:
        raise Refusal("its code_prompt is not Python")
    tree.body = [node for node in tree.body if not (
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point)]
    return ast.unparse(tree)


def _bound(tree: ast.AST) -> set[str]:
    """The names ``tree`` binds anywhere (assignments, defs, parameters, imports, ``except … as``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def split(tests: str, prompt: str = "", entry_point: str | None = None) -> Split:
    """The tests' sandbox's code for a task (see the module docstring), or ``Refusal``."""
    helpers = helpers_of(prompt, entry_point)
    try:
        tree = ast.parse(tests)
    except SyntaxError as e:
        raise Refusal(f"its tests are not Python ({e.msg}, line {e.lineno})") from None
    helper_names = _bound(ast.parse(helpers))
    free = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    free -= _bound(tree) | helper_names | _BUILTINS
    names = {name: name for name in free if name != "candidate"} | ({entry_point: entry_point} if entry_point else {})
    if "candidate" in free:
        if not entry_point:
            raise Refusal("its tests call `candidate` and it names no entry_point")
        names["candidate"] = entry_point
    own = {node.name: node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    _check_uses(tree, set(names) | {"candidate"}, own)
    if not names:
        raise Refusal("its tests call no function of the program (and it names no entry_point)")
    return Split(helpers, tests, names)


def _check_uses(tree: ast.AST, candidates: set[str], own: dict[str, ast.AST]) -> None:
    """``Refusal`` where the tests use a name in ``candidates`` other than by calling it, passing
    it to a function of their own (whose parameter then counts as one), or binding it to a name."""
    parents, called = _parents(tree), False
    uses = [node for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)]
    while uses:
        node = uses.pop()
        if node.id not in candidates:
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.keyword):
            parent = parents.get(parent)
        if isinstance(parent, ast.Call) and parent.func is node:
            called = True
            for arg in [*parent.args, *(k.value for k in parent.keywords)]:
                if isinstance(arg, ast.Lambda) or (isinstance(arg, ast.Name) and arg.id in own):
                    raise Refusal(f"its tests pass a function to {node.id}: only literals cross between sandboxes")
        elif isinstance(parent, ast.Attribute):
            raise Refusal(f"its tests read {node.id}.{parent.attr}: the program's objects stay in its sandbox")
        elif isinstance(parent, ast.Call):
            callee = parent.func.id if isinstance(parent.func, ast.Name) else None
            if callee not in own:
                raise Refusal(f"its tests pass {node.id} to {ast.unparse(parent.func)}(): only calls cross "
                              "between sandboxes")
            params = own[callee].args
            if node in parent.args and parent.args.index(node) < len(params.args):
                param = params.args[parent.args.index(node)].arg
                if param not in candidates:  # check(fn): fn is the candidate inside check
                    candidates.add(param)
                    uses.extend(n for n in ast.walk(own[callee]) if isinstance(n, ast.Name) and n.id == param)
    if not called:
        raise Refusal("its tests call no function of the program")
