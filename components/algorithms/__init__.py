"""RFT algorithm parts: advantages, policy losses, KL estimators, aggregation, and a registry."""

from components.algorithms.advantages import (
    gae_advantages, grpo_advantages, opmd_advantages, reinforce_pp_advantages, rloo_advantages,
)
from components.algorithms.aggregation import AGG_MODES, aggregate
from components.algorithms.losses import (
    KL_KINDS, LossInputs, dpo_loss, entropy_from_logits, entropy_from_logprobs, kl_penalty, mix_loss, opmd_loss,
    ppo_clip_loss, regularized, sft_loss, value_loss,
)
from components.algorithms.registry import check_algorithm, get_advantage, get_loss, known, register_advantage, register_loss

__all__ = [
    "AGG_MODES",
    "KL_KINDS",
    "LossInputs",
    "aggregate",
    "check_algorithm",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_from_logprobs",
    "get_advantage",
    "gae_advantages",
    "get_loss",
    "grpo_advantages",
    "kl_penalty",
    "known",
    "mix_loss",
    "opmd_advantages",
    "opmd_loss",
    "ppo_clip_loss",
    "register_advantage",
    "regularized",
    "register_loss",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "sft_loss",
    "value_loss",
]
