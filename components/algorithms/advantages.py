"""Advantage estimators: per-sequence rewards → advantages the policy loss multiplies."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rftflow.components.algorithms.registry import register_advantage


def _ids(group_ids: Sequence | torch.Tensor) -> Sequence:
    """Group ids as plain values: a 1-D tensor or NumPy array becomes a list (tensor elements
    hash by identity, so used as dict keys every row would be its own group)."""
    if hasattr(group_ids, "tolist"):  # torch.Tensor, numpy.ndarray
        if group_ids.ndim != 1:
            raise ValueError(f"group_ids must be one-dimensional, got shape {tuple(group_ids.shape)}")
        return group_ids.tolist()
    return group_ids


def _group_index(group_ids: Sequence | torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map group ids (strings or ints; a list, a NumPy array or a 1-D tensor) to dense indices
    0..G-1, in order of appearance."""
    dense: dict = {}
    index = [dense.setdefault(g, len(dense)) for g in _ids(group_ids)]
    return torch.tensor(index, dtype=torch.long), len(dense)


def _rewards(rewards: torch.Tensor | Sequence[float], group_ids: Sequence | torch.Tensor) -> torch.Tensor:
    """Rewards as a float32 (B,) tensor (a list or array is converted), as long as ``group_ids``."""
    group_ids = _ids(group_ids)
    rewards = torch.as_tensor(rewards, dtype=torch.float32)  # (B,)
    if rewards.dim() != 1 or rewards.shape[0] != len(group_ids):
        raise ValueError(f"rewards must be (B,) with B = len(group_ids) = {len(group_ids)}, got shape "
                         f"{tuple(rewards.shape)}")
    return rewards


def _group_stats(values: torch.Tensor, index: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group count and mean of ``values``: (G,), (G,)."""
    count = torch.zeros(n_groups).index_add_(0, index, torch.ones_like(values))  # (G,)
    return count, torch.zeros(n_groups).index_add_(0, index, values) / count


def _unbiased_std(centred: torch.Tensor) -> torch.Tensor:
    """Unbiased std of already-centred values; 0 for fewer than two."""
    return torch.sqrt((centred**2).sum() / max(centred.numel() - 1, 1))


@register_advantage("grpo")
def grpo_advantages(
    rewards: torch.Tensor, group_ids: Sequence, *, eps: float = 1e-6, std_normalize: bool = True,
    std_over: str = "group",
) -> torch.Tensor:
    """GRPO group-relative advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (r_i − mean_g(r)) / (std_g(r) + eps), std unbiased (like ``torch.std``) over the
    responses of the same group g; ``std_over="batch"`` divides by the std of the whole batch's
    rewards instead (Liu et al., "Part I: Tricks or Traps?", arXiv:2508.08221). With
    ``std_normalize=False``: A_i = r_i − mean_g(r) (Dr. GRPO, arXiv:2503.20783). A group of one
    response has std 0 by convention (not NaN), so its advantage is 0; a group whose rewards are
    all equal gets advantage 0.

    rewards: (B,) float; group_ids: B ids (a list, array or tensor). Returns (B,).
    """
    rewards = _rewards(rewards, group_ids)  # (B,)
    index, n_groups = _group_index(group_ids)  # (B,)
    count, mean = _group_stats(rewards, index, n_groups)  # (G,), (G,)
    centred = rewards - mean[index]  # (B,)
    if not std_normalize:
        return centred
    if std_over == "batch":
        return centred / (_unbiased_std(rewards - rewards.mean()) + eps)
    if std_over != "group":
        raise ValueError(f"std_over must be 'group' or 'batch', got {std_over!r}")
    sq = torch.zeros(n_groups).index_add_(0, index, centred**2)  # (G,)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))  # (G,) unbiased; 0 for groups of one
    return centred / (std[index] + eps)


@register_advantage("rloo")
def rloo_advantages(rewards: torch.Tensor, group_ids: Sequence) -> torch.Tensor:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = r_i − (Σ_{j∈g, j≠i} r_j) / (G − 1) = G/(G − 1) · (r_i − mean_g(r)); 0 for a group of one.
    """
    rewards = _rewards(rewards, group_ids)  # (B,)
    index, n_groups = _group_index(group_ids)
    count, mean = _group_stats(rewards, index, n_groups)  # (G,), (G,)
    G = count[index]  # (B,)
    return torch.where(G > 1, G / (G - 1).clamp(min=1.0) * (rewards - mean[index]), torch.zeros_like(rewards))


@register_advantage("reinforce_pp")
def reinforce_pp_advantages(
    rewards: torch.Tensor, group_ids: Sequence, *, baseline: bool = False, eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv:2501.03262; OpenRLHF ``reinforce`` / ``reinforce_baseline``).

    A' = r − b with b = 0, or b = mean_g(r) with ``baseline``; then whitened over the batch:
    A = (A' − mean_batch(A')) / (std_batch(A') + eps), std unbiased.
    """
    rewards = _rewards(rewards, group_ids)  # (B,)
    shifted = rewards
    if baseline:
        index, n_groups = _group_index(group_ids)
        shifted = rewards - _group_stats(rewards, index, n_groups)[1][index]  # (B,)
    centred = shifted - shifted.mean()
    return centred / (_unbiased_std(centred) + eps)


@register_advantage("opmd")
def opmd_advantages(rewards: torch.Tensor, group_ids: Sequence, *, baseline: str = "mean",
                    tau: float = 1.0) -> torch.Tensor:
    """Online policy mirror descent advantages (Trinity-RFT ``opmd``; Kimi k1.5, arXiv:2501.12599):
    A_i = r_i − b_g, unnormalised.

    ``baseline="mean"`` (Trinity-RFT's default): b_g = mean_{j∈g} r_j.
    ``baseline="logavgexp"``: b_g = τ · log( mean_{j∈g} exp(r_j / τ) ), the group's soft-max value
    (≥ the mean, so most advantages are negative).
    """
    rewards = _rewards(rewards, group_ids)  # (B,)
    index, n_groups = _group_index(group_ids)
    count, mean = _group_stats(rewards, index, n_groups)  # (G,), (G,)
    if baseline == "mean":
        return rewards - mean[index]
    if baseline != "logavgexp":
        raise ValueError(f"opmd baseline {baseline!r}: expected 'mean' or 'logavgexp'")
    # each group's own max keeps every exp in (0, 1] with one term = 1: no underflow to log 0
    shift = torch.full((n_groups,), -torch.inf).scatter_reduce(0, index, rewards, "amax")  # (G,)
    summed = torch.zeros(n_groups).index_add_(0, index, torch.exp((rewards - shift[index]) / tau))  # (G,)
    soft_max = shift + tau * torch.log(summed / count)  # (G,)
    return rewards - soft_max[index]


@register_advantage("gae", needs_critic=True)
def gae_advantages(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0, lam: float = 0.95,
    whiten: bool = True, eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation for PPO with a critic (Schulman et al. 2016, arXiv:1506.02438;
    veRL ``compute_gae_advantage_return``).

    δ_t = r_t + γ·V_{t+1} − V_t;  A_t = δ_t + γλ·A_{t+1} over the unmasked (model) tokens only: t+1
    is the next unmasked token, so an episode's environment and tool tokens (mask 0) between two
    turns pass A and V through unchanged, and V and A are zero past the last unmasked token; returns
    R_t = A_t + V_t (before whitening). With ``whiten``, A is then whitened over the unmasked tokens
    of the batch: (A − mean) / (std + eps), std unbiased. All tensors (B, T); returns (advantages,
    returns), masked.
    """
    mask = mask.to(values.dtype)  # (B, T)
    values = values * mask  # (B, T)
    advantages = torch.zeros_like(values)  # (B, T)
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    running = torch.zeros_like(values[:, 0])  # (B,)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]  # (B,)
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]  # (B,)
        running = m * (delta + gamma * lam * running) + (1 - m) * running  # (B,)
        advantages[:, t] = running * m
        next_value = m * values[:, t] + (1 - m) * next_value
    returns = (advantages + values) * mask  # (B, T)
    if whiten and mask.sum() > 1:
        picked = advantages[mask.bool()]  # (N_tokens,)
        advantages = (advantages - picked.mean()) / (picked.std() + eps) * mask
    return advantages, returns


def turn_returns(step_rewards: Sequence[float], turns: int, reward: float, gamma: float) -> list[float]:
    """An episode's discounted return from each of its ``turns`` model turns on:
    G_k = Σ_{j≥k} γ^{j−k} r_j, r_j the step reward after turn j (0 where none), and what the
    episode's reward adds beyond its step rewards (a verifier's final score) at the last turn."""
    r = [float(x) for x in step_rewards[:turns]] + [0.0] * max(0, turns - len(step_rewards))
    if turns:
        r[-1] += float(reward) - sum(float(x) for x in step_rewards)
    returns, running = [0.0] * turns, 0.0
    for k in range(turns - 1, -1, -1):
        running = r[k] + gamma * running
        returns[k] = running
    return returns


def discounted_turn_advantages(returns: Sequence[Sequence[float]], spans: Sequence[Sequence[tuple[int, int]]],
                               group_ids: Sequence, width: int, *, eps: float = 1e-6) -> torch.Tensor:
    """Token-level advantages of episodes from their turns' discounted returns (``turn_returns``):
    A_{i,t} = (G_{i,k} − mean_g(G_{·,0})) / (std_g(G_{·,0}) + eps) on the tokens [start, end) of
    model turn k, 0 elsewhere: GRPO's group baseline and scale on the episode returns G_0, each
    turn credited with what followed it. With γ = 1 and one final reward this is GRPO's A_i on
    every model token. returns/spans: per episode, per model turn. Returns (B, width)."""
    episode_returns = torch.tensor([float(g[0]) if g else 0.0 for g in returns])  # (B,)
    index, n_groups = _group_index(group_ids)
    count, mean = _group_stats(episode_returns, index, n_groups)  # (G,), (G,)
    sq = torch.zeros(n_groups).index_add_(0, index, (episode_returns - mean[index]) ** 2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1.0))  # (G,)
    out = torch.zeros(len(returns), width)
    for i, (g, turn_spans) in enumerate(zip(returns, spans)):
        for value, (start, end) in zip(g, turn_spans):
            out[i, start:end] = (value - mean[index[i]]) / (std[index[i]] + eps)
    return out
