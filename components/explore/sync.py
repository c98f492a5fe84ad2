"""Weight sync from the trainer to the explorer, with weight versions.

The trainer's policy has a version: 0 as loaded, +1 after the warm start, +1 per trained round.
``publish(version)`` hands the trainer's weights to the explorer under that version; the
explorer records the version it sampled with in every row (``model_version``), so staleness —
the trainer's version minus a row's — is measurable and bounded (``algorithm.max_staleness``).

- ``memory``: both models live in this process; ``publish`` copies the state dict in place.
- ``checkpoint``: ``publish`` commits the weights to the store as ``weights/vNNNNNN/`` (safetensors,
  then its manifest, then the ``weights/latest.json`` pointer; see ``ExperienceStore.write_weights``);
  ``pull`` loads a newer committed version into the explorer's model. The trainer and explorer
  may be two processes on two machines that share nothing but the store.
"""

from __future__ import annotations

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from rftflow.components.buffer.weights import WeightStore
from rftflow.components.explore.engines import cpu_copies

KEEP_PUBLISHED = 3  # published versions kept in the store (a reader may still be loading the one before)


class MemoryWeightSync:
    """Copies ``source`` (the trainer's policy) into ``target`` (the explorer's engine) in memory."""

    method = "memory"

    def __init__(self, source: nn.Module, target: nn.Module, version: int = 0):
        self.source, self.target, self.version = source, target, version
        # the trainer's own tensors (updated in place by its optimizer), listed once
        self._weights = source.state_dict(keep_vars=True)

    @torch.no_grad()
    def publish(self, version: int) -> int:
        """The explorer gets the trainer's weights as ``version``; returns it."""
        self.target.load_state_dict(self._weights)
        self.version = version
        return version

    def pull(self) -> int:
        return self.version


class StoreWeightSync:
    """Weights through the store: the trainer side (``source``) publishes, the explorer side
    (``target``, its engine) pulls; a process that is both (one process, ``sync.method=checkpoint``) has both."""

    method = "checkpoint"

    def __init__(self, store: WeightStore, source: nn.Module | None = None, target: nn.Module | None = None):
        self.store, self.source, self.target = store, source, target
        self.version = 0 if source is not None else -1  # an explorer alone holds nothing published yet

    @torch.no_grad()
    def publish(self, version: int) -> int:
        """Commit the trainer's weights as ``version`` (a no-op if that version is committed: a
        resumed trainer publishes again what it published before), drop old versions; then the
        explorer side, if any, loads them."""
        published = self.store.published_weights()
        if version not in published:
            self.store.write_weights(version, save_safetensors(cpu_copies(self.source.state_dict())))
            published.append(version)
        for old in published[:-KEEP_PUBLISHED]:
            self.store.delete_weights(old)
        if self.target is None:
            self.version = version
            return version
        return self.pull()

    def newest(self) -> int | None:
        versions = self.store.published_weights()
        return versions[-1] if versions else None

    @torch.no_grad()
    def pull(self) -> int:
        """Load the newest committed version into the explorer's model if it is newer; its version."""
        newest = self.newest()
        if newest is not None and newest > self.version:
            self.target.load_state_dict(load_safetensors(self.store.read_weights(newest)))
            self.version = newest
        return self.version
