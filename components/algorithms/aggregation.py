"""Loss aggregation: how per-token losses l (B, T) under a mask m (B, T) become one scalar.

The modes and their biases (see Dr. GRPO, Liu et al. 2025, arXiv:2503.20783; veRL `agg_loss`):

- ``token-mean``: Σ l·m / Σ m. Every token weighs the same; long answers weigh more per row.
- ``seq-mean-token-mean``: mean over rows of (Σ_t l·m / Σ_t m). Every row weighs the same
  (the original GRPO); favours short correct answers and long wrong ones.
- ``seq-mean-token-sum``: mean over rows of Σ_t l·m. Grows with length.
- ``seq-mean-token-sum-norm``: mean over rows of (Σ_t l·m) / T with T the padded length
  (Dr. GRPO): a length-unbiased constant normaliser.
"""

from __future__ import annotations

from typing import Literal

import torch

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = AggMode.__args__  # type: ignore[attr-defined]


def aggregate(loss: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean") -> torch.Tensor:
    """Reduce per-token ``loss`` (B, T) under ``mask`` (B, T) to a scalar with mode ``agg``.

    The formulas of the four modes are in the module docstring (veRL ``agg_loss``). Rows whose
    mask is all zero contribute zero (never NaN); an empty batch gives 0.
    """
    mask = mask.to(loss.dtype)  # (B, T)
    masked = loss * mask  # (B, T)
    if agg == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss.shape[0] == 0:
        return masked.sum()
    if agg == "seq-mean-token-mean":
        per_row = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)  # (B,)
        return per_row.mean()
    if agg == "seq-mean-token-sum":
        return masked.sum(-1).mean()
    if agg == "seq-mean-token-sum-norm":
        return (masked.sum(-1) / loss.shape[-1]).mean()
    raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGG_MODES)}")
