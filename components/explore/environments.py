"""Built-in environments and tools that run offline, and how a configured one is found.

A ``multi_turn`` environment is a gymnasium 1.x ``Env`` with text observations and actions:
``reset(seed=, options={"task": entry}) -> (observation, info)`` and ``step(action) ->
(observation, reward, terminated, truncated, info)``, ``entry`` being the task's question, answer
and metadata. Any such class plugs in by import path (``workflow.environment:
"package.module:Class"``, constructed with ``workflow.env_args``). An environment may also offer
``expert_action() -> str``, the best next action in its current state: its episodes then become
expert demonstrations (the warm start's).

A tool is a Python callable; its JSON schema (what a chat template's ``tools=`` and the model
see) is its ``schema`` attribute, or is made from its signature and docstring by transformers'
``get_json_schema``.
"""

from __future__ import annotations

import ast
import importlib
import operator
from collections.abc import Callable
from typing import Any

import gymnasium as gym

BUILTIN = "builtin:"


class GuessNumberEnv(gym.Env):
    """Guess a secret integer in [low, high]: each guess is answered ``higher``, ``lower`` or
    ``correct`` (reward 1, the episode ends); anything but a number in range is answered
    ``invalid`` (reward 0). The secret is the task's ``metadata.secret``, else drawn from the seed.
    A policy must use what it is told: binary search finds any secret in ⌈log2(high − low + 2)⌉ guesses."""

    metadata = {"render_modes": []}

    def __init__(self, low: int = 1, high: int = 32):
        self.low, self.high = low, high
        self.observation_space = gym.spaces.Text(max_length=64)
        self.action_space = gym.spaces.Text(max_length=64)
        self.secret = self.lo = self.hi = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        meta = ((options or {}).get("task") or {}).get("metadata") or {}
        self.low, self.high = int(meta.get("low", self.low)), int(meta.get("high", self.high))
        secret = meta.get("secret")
        self.secret = int(secret) if secret is not None else int(self.np_random.integers(self.low, self.high + 1))
        self.lo, self.hi = self.low, self.high  # what the feedback so far allows
        return "", {}

    def step(self, action: str):
        text = action.strip()
        if not text.lstrip("-").isdigit() or not self.low <= int(text) <= self.high:
            return "invalid", 0.0, False, False, {}
        guess = int(text)
        if guess == self.secret:
            return "correct", 1.0, True, False, {"success": True}
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
            return "higher", 0.0, False, False, {}
        self.hi = min(self.hi, guess - 1)
        return "lower", 0.0, False, False, {}

    def expert_action(self) -> str:
        """Binary search: the middle of what the feedback so far allows."""
        return str((self.lo + self.hi) // 2)


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
              ast.Mod: operator.mod, ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with + - * // % and parentheses.

    Args:
        expression: The expression, e.g. "47*38+12".
    """
    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Mult) and abs(left) * abs(right) > 10**30:
                raise ValueError("result too large")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not an integer arithmetic expression: {ast.unparse(node)!r}")

    # ast, not eval: the model writes the expression, and eval would run whatever it wrote
    return str(value(ast.parse(str(expression), mode="eval").body))


ENVIRONMENTS: dict[str, type] = {"guess_number": GuessNumberEnv}
TOOLS: dict[str, Callable[..., Any]] = {"calculator": calculator}


def _import(path: str, what: str) -> Any:
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{what} {path!r}: expected `builtin:<name>` or `package.module:name`")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{what} {path!r} cannot be imported: {e}") from None


def environment_factory(path: str, env_args: dict[str, Any]) -> Callable[[], gym.Env]:
    """A function making a fresh environment ``path`` (``builtin:<name>`` or an import path)."""
    if path.startswith(BUILTIN):
        name = path[len(BUILTIN):]
        if name not in ENVIRONMENTS:
            raise ValueError(f"workflow.environment {path!r}: unknown; built in: {', '.join(ENVIRONMENTS)}")
        cls = ENVIRONMENTS[name]
    else:
        cls = _import(path, "workflow.environment")
    return lambda: cls(**env_args)


def tool_functions(paths: list[str]) -> dict[str, Callable[..., Any]]:
    """The tools ``paths`` by name (a callable's ``__name__``)."""
    tools = {}
    for path in paths:
        if path.startswith(BUILTIN):
            if path[len(BUILTIN):] not in TOOLS:
                raise ValueError(f"workflow.tools {path!r}: unknown; built in: {', '.join(TOOLS)}")
            fn = TOOLS[path[len(BUILTIN):]]
        else:
            fn = _import(path, "workflow.tools entry")
        if not callable(fn):
            raise ValueError(f"workflow.tools entry {path!r} is not callable")
        tools[fn.__name__] = fn
    return tools


def tool_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The tool's JSON schema: ``fn.schema``, else transformers' ``get_json_schema`` (signature + docstring)."""
    schema = getattr(fn, "schema", None)
    if schema is not None:
        return schema
    from transformers.utils import get_json_schema

    return get_json_schema(fn)
