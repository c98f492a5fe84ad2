"""Name → function registries, so a campaign config selects an advantage or loss by name.

A user adds their own without editing rftflow::

    from components.algorithms import register_advantage

    @register_advantage("my_adv")
    def my_adv(rewards, group_ids, **options): ...

or by an entry point in their package (groups ``rftflow.advantages`` / ``rftflow.losses``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

_REGISTRIES: dict[str, dict[str, Callable]] = {"advantages": {}, "losses": {}}


def _register(kind: str, name: str) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        _REGISTRIES[kind][name] = fn
        return fn

    return decorate


def register_advantage(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage function ``fn(rewards, group_ids, **options) -> (B,)``."""
    return _register("advantages", name)


def register_loss(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss ``fn(batch: LossInputs, **options) -> (loss, metrics)``."""
    return _register("losses", name)


def _lookup(kind: str, name: str) -> Callable:
    registry = _REGISTRIES[kind]
    if name not in registry:
        for ep in entry_points(group=f"rftflow.{kind}"):
            if ep.name == name:
                registry[name] = ep.load()
    if name not in registry:
        raise KeyError(f"unknown {kind[:-1]} {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]


def get_advantage(name: str) -> Callable:
    """The advantage function registered under ``name`` (KeyError lists the known names)."""
    return _lookup("advantages", name)


def get_loss(name: str) -> Callable:
    """The policy loss registered under ``name`` (KeyError lists the known names)."""
    return _lookup("losses", name)


def known(kind: str) -> list[str]:
    """Registered names of ``kind`` (``advantages`` or ``losses``)."""
    return sorted(_REGISTRIES[kind])


def check_algorithm(algorithm) -> None:
    """Fail fast (``ConfigError``) if the config names an advantage or loss nobody registered."""
    from components.config import ConfigError

    for kind, key in (("advantages", "advantage"), ("losses", "loss")):
        name = algorithm.setting(key)
        if name is not None:
            try:
                _lookup(kind, name)
            except KeyError as e:
                raise ConfigError(f"config key 'algorithm.{key}': {e.args[0]}") from None
