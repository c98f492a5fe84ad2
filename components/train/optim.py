"""The optimizer (the policy's and the critic's) and the learning-rate curve of the trainer."""

from __future__ import annotations

import math

import torch


def adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel (one pass over all parameters, CPU and CUDA): the same
    update as the default per-tensor loop, without its per-tensor overhead."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)


def cosine(start: float, end: float, progress: float) -> float:
    """Cosine interpolation from ``start`` (progress 0) to ``end`` (progress 1)."""
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * progress))
