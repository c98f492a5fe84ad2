"""Name → function registries, so a campaign config selects an advantage or loss by name.

A user adds their own without editing rftflow::

    from components.algorithms import register_advantage

    @register_advantage("my_adv")
    def my_adv(rewards, group_ids, **options): ...

or by an entry point in their package (groups ``rftflow.advantages`` / ``rftflow.losses``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import entry_points

_REGISTRIES: dict[str, dict[str, Callable]] = {"advantages": {}, "losses": {}}


def _register(kind: str, name: str, **traits: bool) -> Callable[[Callable], Callable]:
    def decorate(fn: Callable) -> Callable:
        for trait, value in traits.items():
            setattr(fn, trait, value)
        _REGISTRIES[kind][name] = fn
        return fn

    return decorate


def register_advantage(name: str, *, needs_critic: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage function.

    Outcome advantages: ``fn(rewards (B,), group_ids, **options) -> (B,)``. With ``needs_critic``
    (GAE-style): ``fn(token_rewards (B, T), values (B, T), mask (B, T), **options) -> (advantages,
    returns)``, both (B, T); the trainer then keeps a critic model and trains it on the returns.
    """
    return _register("advantages", name, needs_critic=needs_critic)


def register_loss(name: str, *, pairwise: bool = False, needs_reference: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss ``fn(batch: LossInputs, **options) -> (loss, metrics)``.

    ``pairwise``: the trainer feeds rows as (chosen, rejected) pairs at even/odd positions, built
    from each group's best and worst responses (``sampling.preference_pairs``), never splitting a
    pair. ``needs_reference``: ``batch.ref_logprobs`` holds a frozen reference model's log-probs.
    """
    return _register("losses", name, pairwise=pairwise, needs_reference=needs_reference)


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
    """Fail fast (``ConfigError``) before any work: an advantage or loss nobody registered, an
    advantage option its function does not take, a pairwise loss mixed with expert rows."""
    from components.config import ConfigError

    found = {}
    for kind, key in (("advantages", "advantage"), ("losses", "loss")):
        name = algorithm.setting(key)
        if name is not None:
            try:
                found[key] = _lookup(kind, name)
            except KeyError as e:
                raise ConfigError(f"config key 'algorithm.{key}': {e.args[0]}") from None
    options = algorithm.setting("advantage_options")
    if "advantage" in found and options:
        params = list(inspect.signature(found["advantage"]).parameters.values())
        data = 3 if getattr(found["advantage"], "needs_critic", False) else 2  # the tensors it is called with
        takes = [p.name for p in params[data:] if p.kind is not p.VAR_KEYWORD]
        unknown = sorted(set(options) - set(takes))
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in params):
            raise ConfigError(f"config key 'algorithm.advantage_options': {algorithm.setting('advantage')!r} "
                              f"takes no option(s) {', '.join(unknown)}; it takes: {', '.join(takes) or 'none'}")
    if getattr(found.get("loss"), "pairwise", False) and algorithm.uses_expert:
        raise ConfigError(f"config key 'algorithm.loss': {algorithm.setting('loss')!r} trains on (chosen, rejected) "
                          f"pairs and cannot take the expert rows preset {algorithm.name!r} adds; pick a preset "
                          "without them (e.g. dpo)")
