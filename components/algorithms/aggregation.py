"""Loss aggregation: how per-token losses l (B, T) under a mask m (B, T) become one scalar.

The modes and their biases (see Dr. GRPO, Liu et al. 2025, arXiv:2503.20783; veRL `agg_loss`):

- ``token-mean``: Σ l·m / Σ m. Every token weighs the same; long answers weigh more per row.
- ``seq-mean-token-mean``: mean over rows of (Σ_t l·m / Σ_t m). Every row weighs the same
  (the original GRPO); favours short correct answers and long wrong ones.
- ``seq-mean-token-sum``: mean over rows of Σ_t l·m. Grows with length.
- ``seq-mean-token-sum-norm``: mean over rows of (Σ_t l·m) / T with T the padded length
  (Dr. GRPO): a length-unbiased constant normaliser.

Under ``shared_batch(P)`` a micro-batch is split over P data-parallel processes (DDP averages
their gradients): each process returns P · (its rows' share of the numerator) / (the whole
micro-batch's normaliser — Σ m, the row count, the padded length — summed or maxed over the
processes), so the averaged gradient is the one-process gradient of the whole micro-batch.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Literal

import torch
import torch.distributed as dist

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = AggMode.__args__  # type: ignore[attr-defined]


_SHARED: ContextVar[int | None] = ContextVar("rftflow_shared_batch", default=None)


@contextlib.contextmanager
def shared_batch(processes: int):
    """Aggregate as one share of a micro-batch split over ``processes`` data-parallel processes
    (module docstring); every process must make the same ``aggregate``/``batch_mean`` calls."""
    token = _SHARED.set(processes)
    try:
        yield
    finally:
        _SHARED.reset(token)


def shared_processes() -> int | None:
    """P under ``shared_batch(P)``, else None."""
    return _SHARED.get()


def over_processes(value: torch.Tensor | float, like: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """``value`` summed (or ``op``) over the processes sharing the micro-batch, on ``like``'s device
    (NCCL reduces GPU tensors only); a constant to autograd."""
    total = torch.as_tensor(value, dtype=torch.float64, device=like.device).detach().clone()
    dist.all_reduce(total, op=op)
    return total


def _shared_aggregate(masked: torch.Tensor, mask: torch.Tensor, agg: str, processes: int) -> torch.Tensor:
    """``aggregate`` of this process's rows as its share of the whole micro-batch (module docstring)."""
    if agg == "token-mean":
        numerator, normaliser = masked.sum(), over_processes(mask.sum(), masked)
    elif agg == "seq-mean-token-mean":
        numerator = (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).sum()
        normaliser = over_processes(len(masked), masked)
    elif agg == "seq-mean-token-sum":
        numerator, normaliser = masked.sum(), over_processes(len(masked), masked)
    elif agg == "seq-mean-token-sum-norm":
        width = over_processes(masked.shape[-1], masked, dist.ReduceOp.MAX)  # the whole micro-batch's padded length
        numerator, normaliser = masked.sum() / width.to(masked.dtype), over_processes(len(masked), masked)
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}; known: {', '.join(AGG_MODES)}")
    return numerator * processes / normaliser.clamp(min=1.0).to(masked.dtype)


def batch_mean(values: torch.Tensor) -> torch.Tensor:
    """The mean of ``values`` (n,) over the micro-batch (under ``shared_batch``, this process's
    share of the mean over all processes' values); 0 when there are none."""
    processes = _SHARED.get()
    if processes is None:
        return values.mean() if values.numel() else values.sum()
    return values.sum() * processes / over_processes(values.numel(), values).clamp(min=1.0).to(values.dtype)


def aggregate(loss: torch.Tensor, mask: torch.Tensor, agg: str = "token-mean") -> torch.Tensor:
    """Reduce per-token ``loss`` (B, T) under ``mask`` (B, T) to a scalar with mode ``agg``.

    The formulas of the four modes are in the module docstring (veRL ``agg_loss``). Rows whose
    mask is all zero contribute zero (never NaN); an empty batch gives 0.
    """
    mask = mask.to(loss.dtype)  # (B, T)
    masked = loss * mask  # (B, T)
    processes = _SHARED.get()
    if processes is not None:
        return _shared_aggregate(masked, mask, agg, processes)
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
