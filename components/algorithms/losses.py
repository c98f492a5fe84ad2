"""Policy losses and KL estimators on response tokens.

Shapes: ``logprobs``, ``old_logprobs``, ``ref_logprobs``, ``mask`` are (B, T); ``advantages`` are
(B, T) or (B,) (broadcast over tokens); ``is_expert`` is a (B,) bool.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rftflow.components.algorithms.aggregation import aggregate, batch_mean
from rftflow.components.algorithms.registry import register_loss

KL_KINDS = ("k1", "k2", "k3", "low_var_kl")


def _per_token(advantages: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """(B,) or (B, T) advantages → (B, T)."""
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1.0))


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347; clip-higher from DAPO,
    arXiv:2503.14476; dual clip from Ye et al. 2020, arXiv:1912.09729).

    r = exp(logprobs − old_logprobs);  l = max(−A·r, −A·clip(r, 1 − clip_low, 1 + clip_high));
    with ``dual_clip=c`` (c > 1), for A < 0: l = min(l, −A·c). Aggregated with ``agg``.
    ``ratio_level="sequence"`` (GSPO, arXiv:2507.18071): every token of a row uses the row's
    r = exp(Σ_t m·(logprobs − old_logprobs) / Σ_t m).
    """
    mask = mask.to(logprobs.dtype)  # (B, T)
    adv = _per_token(advantages, logprobs)  # (B, T)
    log_ratio = logprobs - old_logprobs  # (B, T)
    if ratio_level == "sequence":
        per_row = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        log_ratio = per_row.unsqueeze(-1).expand_as(logprobs)  # (B, T)
    elif ratio_level != "token":
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {ratio_level!r}")
    log_ratio = log_ratio.clamp(-20.0, 20.0)  # (B, T) keeps exp finite
    ratio = torch.exp(log_ratio)  # (B, T)
    unclipped = -adv * ratio  # (B, T)
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)  # (B, T)
    per_token = torch.maximum(unclipped, clipped)  # (B, T)
    if dual_clip is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip), per_token)
    loss = aggregate(per_token, mask, agg)
    metrics = {
        "update/clip_frac": _masked_mean((clipped > unclipped).to(mask.dtype), mask),
        "update/ratio_mean": _masked_mean(ratio.detach(), mask),
        "update/approx_kl": _masked_mean((-log_ratio).detach(), mask),
    }
    return loss, metrics


def sft_loss(logprobs: torch.Tensor, mask: torch.Tensor, *, agg: str = "token-mean") -> torch.Tensor:
    """Supervised negative log-likelihood of the response tokens: l = −logprobs, aggregated
    (Trinity-RFT ``sft`` loss; TRL ``SFTTrainer`` completion-only loss)."""
    return aggregate(-logprobs, mask, agg)


def opmd_loss(logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, *, tau: float = 1.0,
              agg: str = "token-mean") -> torch.Tensor:
    """Online policy mirror descent policy loss (Trinity-RFT ``opmd``; Kimi k1.5, arXiv:2501.12599).

    l = −A·logprobs, aggregated, divided by (1 + τ): the mirror-descent step's regularisation
    toward the current policy shrinks the update by 1/(1 + τ). Pair with ``opmd_advantages``.
    """
    return aggregate(-_per_token(advantages, logprobs) * logprobs, mask, agg) / (1.0 + tau)


def dpo_loss(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, *, beta: float = 0.1,
             label_smoothing: float = 0.0) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO (Rafailov et al. 2023, arXiv:2305.18290; TRL ``DPOTrainer`` sigmoid loss) on pairs:
    rows 0, 2, 4, … are chosen, rows 1, 3, 5, … the rejected response to the same prompt.

    With sequence log-ratios ρ = Σ_t m·(logprobs − ref_logprobs) and z = β·(ρ_chosen − ρ_rejected):
    l = −(1 − ε)·log σ(z) − ε·log σ(−z) (ε = ``label_smoothing``, cDPO), averaged over pairs.
    """
    if logprobs.shape[0] % 2:
        raise ValueError(f"dpo_loss needs (chosen, rejected) pairs: got an odd batch of {logprobs.shape[0]} rows")
    rho = ((logprobs - ref_logprobs) * mask.to(logprobs.dtype)).sum(-1)  # (B,)
    chosen, rejected = rho[0::2], rho[1::2]  # (B/2,), (B/2,)
    z = beta * (chosen - rejected)  # (B/2,)
    losses = -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)  # (B/2,)
    loss = batch_mean(losses)  # 0 (still on the graph) without pairs
    metrics = {
        "update/dpo_reward_accuracy": float((z > 0).float().mean()) if z.numel() else 0.0,
        "update/dpo_margin": float(z.detach().mean() / beta) if z.numel() else 0.0,
    }
    return loss, metrics


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, *,
               clip: float | None = 0.2, agg: str = "token-mean") -> torch.Tensor:
    """Clipped critic loss of PPO (Schulman et al. 2017; veRL ``compute_value_loss``).

    V_clip = old_values + clamp(values − old_values, −clip, clip);
    l = ½ · max((values − R)², (V_clip − R)²), aggregated; ``clip=None``: l = ½ (values − R)².
    """
    unclipped = (values - returns) ** 2  # (B, T)
    if clip is None:
        return 0.5 * aggregate(unclipped, mask, agg)
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)  # (B, T)
    return 0.5 * aggregate(torch.maximum(unclipped, (clipped_values - returns) ** 2), mask, agg)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimators (Schulman, "Approximating KL divergence", 2020).

    With d = logprobs − ref_logprobs: k1 = d; k2 = d²/2; k3 = exp(−d) + d − 1;
    low_var_kl = k3 clamped to [−10, 10] (veRL ``kl_penalty``). For k3 and low_var_kl, d is first
    clamped to [−20, 20] as in veRL, so extreme log-ratios stay finite. Returns (B, T).
    """
    d = logprobs - ref_logprobs  # (B, T)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d**2
    if kind in ("k3", "low_var_kl"):
        d = d.clamp(-20.0, 20.0)  # (B, T)
        k3 = torch.exp(-d) + d - 1.0  # (B, T)
        return k3.clamp(-10.0, 10.0) if kind == "low_var_kl" else k3
    raise ValueError(f"unknown KL kind {kind!r}; known: {', '.join(KL_KINDS)}")


def mix_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    is_expert: torch.Tensor,
    *,
    mu: float = 0.1,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    ratio_level: str = "token",
    agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """MIX (Trinity-RFT ``mix`` algorithm): GRPO on explorer rows + SFT on expert rows.

    loss = (1 − mu) · PPO-clip(usual rows) + mu · SFT(expert rows); a term whose rows are absent
    is 0. ``is_expert``: (B,) bool (a 0/1 tensor or a list is read as bool). The PPO-clip options
    are ``ppo_clip_loss``'s.
    """
    is_expert = torch.as_tensor(is_expert, dtype=torch.bool, device=logprobs.device)  # (B,)
    if is_expert.shape != logprobs.shape[:1]:
        raise ValueError(f"is_expert must be (B,) = ({logprobs.shape[0]},), got shape {tuple(is_expert.shape)}")
    usual = ~is_expert  # (B,)
    policy, metrics = ppo_clip_loss(
        logprobs[usual], old_logprobs[usual], _per_token(advantages, logprobs)[usual], mask[usual],
        clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip, ratio_level=ratio_level, agg=agg,
    )
    sft = sft_loss(logprobs[is_expert], mask[is_expert], agg=agg)
    loss = (1.0 - mu) * policy + mu * sft
    return loss, {**metrics, "loss/policy": float(policy.detach()), "loss/sft": float(sft.detach())}


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Per-token entropy H = −Σ_v p_v log p_v from full log-probabilities (B, T, V) → (B, T)
    (Shannon entropy; the bonus term of veRL's ``entropy_coeff``)."""
    return -(logp.exp() * logp).sum(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy of logits (B, T, V) → (B, T): H = −Σ_v softmax(z)_v log softmax(z)_v
    (veRL ``entropy_from_logits``)."""
    return entropy_from_logprobs(torch.log_softmax(logits.float(), dim=-1))


def regularized(
    loss: torch.Tensor, logprobs: torch.Tensor, mask: torch.Tensor, *, ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0, kl_kind: str = "low_var_kl", entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0, agg: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """loss + kl_coef · agg(KL_kind(π ‖ π_ref)) − entropy_coef · agg(H(π)) (GRPO's KL-in-loss,
    Shao et al. 2024; the entropy bonus of PPO, Schulman et al. 2017). Terms with coefficient 0
    (or no reference / entropy given) are left out; their values are still reported when given."""
    metrics: dict[str, float] = {}
    if ref_logprobs is not None:
        kl = aggregate(kl_penalty(logprobs, ref_logprobs, kl_kind), mask, agg)
        metrics[f"kl/{kl_kind}"] = float(kl.detach())
        if kl_coef:
            loss = loss + kl_coef * kl
    if entropy is not None:
        h = aggregate(entropy, mask, agg)
        metrics["update/entropy"] = float(h.detach())
        if entropy_coef:
            loss = loss - entropy_coef * h
    return loss, metrics


@dataclass
class LossInputs:
    """Everything a registered policy loss may read; tensors as in the module docstring."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    is_expert: torch.Tensor
    ref_logprobs: torch.Tensor | None = None  # set for losses registered with ``needs_reference``


@register_loss("ppo_clip", zero_without_advantage=True)
def _ppo_clip(x: LossInputs, *, clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = None,
              ratio_level: str = "token", agg: str = "token-mean", **_) -> tuple[torch.Tensor, dict[str, float]]:
    loss, metrics = ppo_clip_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, clip_low=clip_low,
                                  clip_high=clip_high, dual_clip=dual_clip, ratio_level=ratio_level, agg=agg)
    return loss, {**metrics, "loss/policy": float(loss.detach())}


@register_loss("opmd", zero_without_advantage=True)
def _opmd(x: LossInputs, *, tau: float = 1.0, agg: str = "token-mean", **_) -> tuple[torch.Tensor, dict[str, float]]:
    loss = opmd_loss(x.logprobs, x.advantages, x.mask, tau=tau, agg=agg)
    return loss, {"loss/policy": float(loss.detach())}


@register_loss("dpo", pairwise=True, needs_reference=True)
def _dpo(x: LossInputs, *, beta: float = 0.1, label_smoothing: float = 0.0, **_) -> tuple[torch.Tensor, dict[str, float]]:
    loss, metrics = dpo_loss(x.logprobs, x.ref_logprobs, x.mask, beta=beta, label_smoothing=label_smoothing)
    return loss, {**metrics, "loss/policy": float(loss.detach())}


@register_loss("sft")
def _sft(x: LossInputs, *, agg: str = "token-mean", **_) -> tuple[torch.Tensor, dict[str, float]]:
    loss = sft_loss(x.logprobs, x.mask, agg=agg)
    return loss, {"loss/sft": float(loss.detach())}


@register_loss("mix")
def _mix(x: LossInputs, *, mu: float = 0.1, clip_low: float = 0.2, clip_high: float = 0.2,
         dual_clip: float | None = None, ratio_level: str = "token", agg: str = "token-mean",
         **_) -> tuple[torch.Tensor, dict[str, float]]:
    return mix_loss(x.logprobs, x.old_logprobs, x.advantages, x.mask, x.is_expert, mu=mu, clip_low=clip_low,
                    clip_high=clip_high, dual_clip=dual_clip, ratio_level=ratio_level, agg=agg)
