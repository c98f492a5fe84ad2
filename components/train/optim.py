"""The optimizer (the policy's and the critic's) and the learning-rate curve of the trainer."""

from __future__ import annotations

import math

import torch
from torch.autograd.graph import increment_version


def adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel (one pass over all parameters, CPU and CUDA): the same
    update as the default per-tensor loop, without its per-tensor overhead. The fused kernel
    does not bump the version counters of the tensors it updates, as the loop's in-place ops do;
    a hook after each step does, so what is keyed on them (the decoder's fused weights of the
    model a trainer steps) sees the update."""
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=True)
    optimizer.register_step_post_hook(
        lambda opt, args, kwargs: increment_version([p for group in opt.param_groups for p in group["params"]]))
    return optimizer


def cosine(start: float, end: float, progress: float) -> float:
    """Cosine interpolation from ``start`` (progress 0) to ``end`` (progress 1)."""
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * progress))
