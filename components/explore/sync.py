"""Weight sync from trainer to explorer, with a weight-version counter.

``memory``: both models live in this process; the explorer's copy is overwritten in place
from the trainer's state dict. The version counts syncs: experiences record the version
that produced them, so staleness is measurable.
"""

from __future__ import annotations

import torch
from torch import nn


class MemoryWeightSync:
    """Copies ``source`` (the trainer's policy) into ``target`` (the explorer's) in memory."""

    def __init__(self, source: nn.Module, target: nn.Module, version: int = 0):
        self.source, self.target, self.version = source, target, version

    @torch.no_grad()
    def sync(self) -> int:
        """Push the current weights; returns the new weight version."""
        self.target.load_state_dict(self.source.state_dict())
        self.version += 1
        return self.version

    @torch.no_grad()
    def restore(self, version: int) -> None:
        """After the trainer was restored from a checkpoint: the explorer gets its weights, and the
        version is the checkpoint's (not bumped)."""
        self.target.load_state_dict(self.source.state_dict())
        self.version = version
