"""RFT algorithm parts: advantages, policy losses, KL estimators, aggregation, a registry, and
the presets that combine them (``resolve`` turns a config's algorithm section into an ``Algorithm``)."""

from rftflow.components.algorithms.advantages import (
    gae_advantages, grpo_advantages, opmd_advantages, reinforce_pp_advantages, rloo_advantages,
)
from rftflow.components.algorithms.aggregation import AGG_MODES, AggMode, aggregate
from rftflow.components.algorithms.losses import (
    KL_KINDS, LossInputs, dpo_loss, entropy_from_logits, entropy_from_logprobs, kl_penalty, mix_loss, opmd_loss,
    ppo_clip_loss, regularized, sft_loss, value_loss,
)
from rftflow.components.algorithms.presets import PRESETS, Algorithm, Preset, resolve
from rftflow.components.algorithms.registry import get_advantage, get_loss, register_advantage, register_loss

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "PRESETS",
    "AggMode",
    "Algorithm",
    "LossInputs",
    "Preset",
    "aggregate",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_from_logprobs",
    "gae_advantages",
    "get_advantage",
    "get_loss",
    "grpo_advantages",
    "kl_penalty",
    "mix_loss",
    "opmd_advantages",
    "opmd_loss",
    "ppo_clip_loss",
    "register_advantage",
    "register_loss",
    "regularized",
    "reinforce_pp_advantages",
    "resolve",
    "rloo_advantages",
    "sft_loss",
    "value_loss",
]
