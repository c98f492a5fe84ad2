"""Advantage estimators: per-sequence rewards → advantages the policy loss multiplies."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from components.algorithms.registry import register_advantage


def _group_index(group_ids: Sequence) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids (strings or ints) to dense indices 0..G-1, in order of appearance."""
    dense: dict = {}
    index = [dense.setdefault(g, len(dense)) for g in group_ids]
    return torch.tensor(index, dtype=torch.long), len(dense)


@register_advantage("grpo")
def grpo_advantages(
    rewards: torch.Tensor, group_ids: Sequence, *, eps: float = 1e-6, std_normalize: bool = True
) -> torch.Tensor:
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (r_i − mean_g(r)) / (std_g(r) + eps), std unbiased (like ``torch.std``) over the
    responses of the same group g. With ``std_normalize=False``: A_i = r_i − mean_g(r)
    (Dr. GRPO, arXiv:2503.20783). A group of one response has std 0 by convention (not NaN),
    so its advantage is 0; a group whose rewards are all equal gets advantage 0.

    rewards: (B,) float; group_ids: B hashable ids. Returns (B,).
    """
    rewards = rewards.to(torch.float32)  # (B,)
    index, n_groups = _group_index(group_ids)  # (B,)
    count = torch.zeros(n_groups).index_add_(0, index, torch.ones_like(rewards))  # (G,)
    mean = torch.zeros(n_groups).index_add_(0, index, rewards) / count  # (G,)
    centred = rewards - mean[index]  # (B,)
    if not std_normalize:
        return centred
    sq = torch.zeros(n_groups).index_add_(0, index, centred**2)  # (G,)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))  # (G,) unbiased; 0 for groups of one
    return centred / (std[index] + eps)
