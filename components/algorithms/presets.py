"""Algorithm presets, and a campaign's algorithm resolved once into a frozen ``Algorithm``.

A preset names the advantage and the policy loss an algorithm uses, with their defaults; every
part can be overridden by the ``algorithm.*`` key of the same name. ``resolve`` merges a config's
keys over the preset, looks the parts up in the registry and checks that they fit together, so the
trainer reads ``algorithm.clip_high`` or ``algorithm.loss_fn`` by attribute and a typo fails here,
before any work, in one line naming the key.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from rftflow.components.algorithms.registry import get_advantage, get_loss


@dataclass(frozen=True)
class Preset:
    """What a named algorithm uses (registered names) and the defaults of its options."""

    advantage: str | None  # registered advantage; None: no advantage (sft, dpo)
    loss: str  # registered policy loss
    agg: str = "token-mean"
    advantage_options: Mapping[str, Any] = field(default_factory=dict)
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    ratio_level: str = "token"
    tau: float = 1.0
    dynamic_sampling: bool = False
    uses_explorer: bool = True  # trains on explorer rows
    uses_expert: bool = False  # trains on expert rows (demonstrations, well-rated human rows)

    @property
    def lr_scale(self) -> float:
        """The rounds' learning rate is this × the trainer's: ``RL_LR_SCALE`` for a preset that trains
        on explorer rows alone, 1 for one with expert rows (sft, mix)."""
        return 1.0 if self.uses_expert else RL_LR_SCALE


# Presets that train on explorer rows alone step at a tenth of ``trainer.lr`` (``Preset.lr_scale``): the
# trainer's rate is set for supervised steps (the warm start decays to it, MIX's SFT term uses it), and
# a policy-gradient step at that rate overshoots (on the default task, GRPO at the supervised rate lost
# held-out accuracy where a tenth of it gained; docs/benchmarks.md has the algorithms' figures).
# MIX keeps 1.0: its GRPO term is already weighted by (1 − mu) = 0.1 in the default campaign.
RL_LR_SCALE = 0.1
PRESETS: dict[str, Preset] = {
    "sft": Preset(advantage=None, loss="sft", uses_explorer=False, uses_expert=True),
    "grpo": Preset(advantage="grpo", loss="ppo_clip"),
    # Dr. GRPO (arXiv:2503.20783): no std division, constant length normaliser.
    "dr_grpo": Preset(advantage="grpo", advantage_options={"std_normalize": False}, loss="ppo_clip",
                      agg="seq-mean-token-sum-norm"),
    # DAPO (arXiv:2503.14476): clip-higher, token-level loss, dynamic sampling.
    "dapo": Preset(advantage="grpo", loss="ppo_clip", clip_high=0.28, dynamic_sampling=True),
    "rloo": Preset(advantage="rloo", loss="ppo_clip"),
    "reinforce_pp": Preset(advantage="reinforce_pp", advantage_options={"baseline": True}, loss="ppo_clip"),
    # GSPO (arXiv:2507.18071): sequence-level ratio, tiny clip range, sequence-mean loss.
    "gspo": Preset(advantage="grpo", loss="ppo_clip", ratio_level="sequence", clip_low=3e-4, clip_high=4e-4,
                   agg="seq-mean-token-mean"),
    # OPMD (Trinity-RFT; Kimi k1.5): group-mean baseline (Trinity-RFT's default), −A·log π / (1 + τ).
    "opmd": Preset(advantage="opmd", loss="opmd"),
    # MIX (Trinity-RFT): (1 − mu)·GRPO on explorer rows + mu·SFT on expert rows.
    "mix": Preset(advantage="grpo", loss="mix", uses_expert=True),
    # PPO (arXiv:1707.06347) with a critic: token-level GAE advantages, clipped value loss.
    "ppo": Preset(advantage="gae", advantage_options={"gamma": 1.0, "lam": 0.95}, loss="ppo_clip"),
    # Online DPO (arXiv:2305.18290): each group's best vs worst responses as (chosen, rejected) pairs.
    "dpo": Preset(advantage=None, loss="dpo"),
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


@dataclass(frozen=True)
class Algorithm:
    """One campaign's algorithm: a preset with the config's overrides, its registered parts looked up.

    The options every policy loss receives are ``loss_options``; each loss takes the ones it needs.
    """

    name: str
    advantage: str | None
    advantage_fn: Callable | None
    advantage_options: Mapping[str, Any]
    loss: str
    loss_fn: Callable
    agg: str
    clip_low: float
    clip_high: float
    dual_clip: float | None
    ratio_level: str
    tau: float
    dynamic_sampling: bool
    lr_scale: float
    uses_explorer: bool
    uses_expert: bool
    mu: float = 0.1
    beta: float = 0.1
    value_clip: float | None = 0.2
    kl_coef: float = 0.0
    kl_kind: str = "low_var_kl"
    kl_mode: str = "loss"
    entropy_coef: float = 0.0
    max_staleness: int | None = None

    @property
    def pairwise(self) -> bool:
        """The loss trains on (chosen, rejected) pairs (DPO)."""
        return getattr(self.loss_fn, "pairwise", False)

    @property
    def needs_critic(self) -> bool:
        """The advantage is token-level GAE from a critic's values (PPO)."""
        return getattr(self.advantage_fn, "needs_critic", False)

    @property
    def needs_reference(self) -> bool:
        """A frozen reference model is kept: for a KL term, or because the loss reads it (DPO)."""
        return self.kl_coef > 0 or getattr(self.loss_fn, "needs_reference", False)

    @property
    def zero_without_advantage(self) -> bool:
        """A batch whose advantages are all 0 leaves nothing to learn: the policy loss is registered
        ``zero_without_advantage`` and nothing else is added to it (no KL term in the loss, no
        entropy bonus) nor trained beside it (no critic)."""
        kl_in_loss = self.kl_coef > 0 and self.kl_mode == "loss"
        return (getattr(self.loss_fn, "zero_without_advantage", False) and not kl_in_loss
                and not self.entropy_coef and not self.needs_critic)

    def loss_options(self) -> dict[str, Any]:
        """Keyword options every registered policy loss receives."""
        return {"clip_low": self.clip_low, "clip_high": self.clip_high, "dual_clip": self.dual_clip,
                "ratio_level": self.ratio_level, "agg": self.agg, "tau": self.tau, "mu": self.mu, "beta": self.beta}


_PRESET_KEYS = {f.name for f in fields(Preset)} - {"uses_explorer", "uses_expert"} | {"lr_scale"}
_OWN_KEYS = {"mu", "beta", "value_clip", "kl_coef", "kl_kind", "kl_mode", "entropy_coef", "max_staleness"}


def resolve(name: str = "mix", **overrides: Any) -> Algorithm:
    """Preset ``name`` with ``overrides`` (the ``algorithm.*`` keys; None = the preset's value).

    ``advantage_options`` merge over the preset's, which apply only while the advantage is the
    preset's. ``ValueError`` (one line naming the ``algorithm.*`` key) for an unknown preset, part
    or option, or a pairwise loss on a preset that adds expert rows.
    """
    if name not in PRESETS:
        raise ValueError(f"algorithm.name: unknown preset {name!r}; known: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides) - _PRESET_KEYS - _OWN_KEYS)
    if unknown:
        raise ValueError(f"algorithm: unknown key(s) {', '.join(unknown)}")
    preset = PRESETS[name]
    chosen = {k: getattr(preset, k) if overrides.get(k) is None else overrides[k] for k in _PRESET_KEYS}
    own = {k: overrides[k] for k in _OWN_KEYS if overrides.get(k) is not None}
    chosen["advantage_options"] = MappingProxyType({
        **(preset.advantage_options if chosen["advantage"] == preset.advantage else {}),
        **(overrides.get("advantage_options") or {})})
    advantage_fn = _part(get_advantage, "advantage", chosen["advantage"]) if chosen["advantage"] else None
    loss_fn = _part(get_loss, "loss", chosen["loss"])
    algorithm = Algorithm(name=name, advantage_fn=advantage_fn, loss_fn=loss_fn, uses_explorer=preset.uses_explorer,
                          uses_expert=preset.uses_expert, **chosen, **own)
    _check_options(algorithm)
    if algorithm.pairwise and algorithm.uses_expert:
        raise ValueError(f"algorithm.loss: {algorithm.loss!r} trains on (chosen, rejected) pairs and cannot take "
                         f"the expert rows preset {name!r} adds; pick a preset without them (e.g. dpo)")
    return algorithm


def _part(lookup: Callable[[str], Callable], key: str, name: str) -> Callable:
    try:
        return lookup(name)
    except KeyError as e:
        raise ValueError(f"algorithm.{key}: {e.args[0]}") from None


def _check_options(algorithm: Algorithm) -> None:
    """Every advantage option is a keyword the advantage function takes (after its tensors)."""
    fn, options = algorithm.advantage_fn, algorithm.advantage_options
    if fn is None or not options:
        return
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    tensors = 3 if algorithm.needs_critic else 2  # (token_rewards, values, mask) or (rewards, group_ids)
    takes = [p.name for p in params[tensors:]]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ValueError(f"algorithm.advantage_options: {algorithm.advantage!r} takes no option(s) "
                         f"{', '.join(unknown)}; it takes: {', '.join(takes) or 'none'}")
