"""Name → function registries, so a campaign config selects an advantage or loss by name.

A user adds their own without editing rftflow::

    from rftflow.components.algorithms import register_advantage

    @register_advantage("my_adv")
    def my_adv(rewards, group_ids, **options): ...

or by an entry point in their package (groups ``rftflow.advantages`` / ``rftflow.losses``).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points

_REGISTRIES: dict[str, dict[str, Callable]] = {"advantages": {}, "losses": {}}
_SINGULAR = {"advantages": "advantage", "losses": "loss"}


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


def register_loss(name: str, *, pairwise: bool = False, needs_reference: bool = False,
                  zero_without_advantage: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss ``fn(batch: LossInputs, **options) -> (loss, metrics)``.

    ``pairwise``: the trainer feeds rows as (chosen, rejected) pairs at even/odd positions, built
    from each group's best and worst responses (``sampling.preference_pairs``), never splitting a
    pair. ``needs_reference``: ``batch.ref_logprobs`` holds a frozen reference model's log-probs.
    ``zero_without_advantage``: the loss, and so its gradient, is 0 whatever the log-probs when
    every advantage in the batch is 0; the trainer then steps on zero gradients without the forward
    and backward (``Trainer._zero_step``).
    """
    return _register("losses", name, pairwise=pairwise, needs_reference=needs_reference,
                     zero_without_advantage=zero_without_advantage)


def _lookup(kind: str, name: str) -> Callable:
    registry = _REGISTRIES[kind]
    if name not in registry:
        for ep in entry_points(group=f"rftflow.{kind}"):
            if ep.name == name:
                registry[name] = ep.load()
    if name not in registry:
        raise KeyError(f"unknown {_SINGULAR[kind]} {name!r}; known: {', '.join(sorted(registry))}")
    return registry[name]


def get_advantage(name: str) -> Callable:
    """The advantage function registered under ``name`` (KeyError lists the known names)."""
    return _lookup("advantages", name)


def get_loss(name: str) -> Callable:
    """The policy loss registered under ``name`` (KeyError lists the known names)."""
    return _lookup("losses", name)
