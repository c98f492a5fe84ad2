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

With LoRA the trainer publishes the base's weights with its adapter merged in, so every engine
loads what it loads for full weights; a server that loads LoRA adapters at run time gets the
adapter instead (``memory``). ``check_sync`` runs after each sync where trainer and
explorer share a process: a sync that did not arrive fails the round in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors
from torch import nn

from rftflow.components.buffer.weights import WeightStore
from rftflow.components.config import SyncConfig
from rftflow.components.data.images import task_images
from rftflow.components.data.tasksets import Task
from rftflow.components.explore.engines import cpu_copies, weights_digest

KEEP_PUBLISHED = 3  # published versions kept in the store (a reader may still be loading the one before)
PROBE_TOKENS = 16  # tokens the explorer samples for the log-prob check

Weights = Callable[[], Mapping[str, torch.Tensor]]  # the trainer's weights to publish (``Trainer.policy_weights``)


class SyncMismatch(RuntimeError):
    """After a sync the explorer does not hold the weights the trainer published."""


class MemoryWeightSync:
    """Copies ``source()`` (the trainer's policy weights) into ``target`` (the explorer's engine) in memory."""

    method = "memory"

    def __init__(self, source: Weights, target: nn.Module, version: int = 0,
                 adapter: Callable[[Path], None] | None = None):
        self.source, self.target, self.version, self.adapter = source, target, version, adapter

    @torch.no_grad()
    def publish(self, version: int) -> int:
        """The explorer gets the trainer's weights as ``version``; returns it. With ``adapter`` (a
        LoRA trainer's: writes its adapter's files) an engine that loads adapters itself gets those."""
        loader = getattr(self.target, "load_adapter", None)
        if not (self.adapter is not None and loader is not None and loader(self.adapter)):
            self.target.load_state_dict(self.source())
        self.version = version
        return version

    def pull(self) -> int:
        return self.version


class StoreWeightSync:
    """Weights through the store: the trainer side (``source``) publishes, the explorer side
    (``target``, its engine) pulls; a process that is both (one process, ``sync.method=checkpoint``) has both."""

    method = "checkpoint"

    def __init__(self, store: WeightStore, source: Weights | None = None, target: nn.Module | None = None):
        self.store, self.source, self.target = store, source, target
        self.version = 0 if source is not None else -1  # an explorer alone holds nothing published yet

    @torch.no_grad()
    def publish(self, version: int) -> int:
        """Commit the trainer's weights as ``version`` (a no-op if that version is committed: a
        resumed trainer publishes again what it published before), drop old versions; then the
        explorer side, if any, loads them."""
        published = self.store.published_weights()
        if version not in published:
            self.store.write_weights(version, save_safetensors(cpu_copies(self.source())))
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


def check_sync(trainer, engine, version: int, explorer_version: int, probe: Sequence[int], *,
               logprobs: bool, tolerance: float, temperature: float, images: Sequence = ()) -> dict[str, float]:
    """After a sync, that the explorer holds what the trainer published, or ``SyncMismatch`` in one
    line: the weight version both report; the trained tensors' bytes the same on both sides (engines
    that hold them in this process: ``hf``; a server cannot), else the sha256 of each side's; and,
    with ``logprobs``, the explorer's log-probs of ``PROBE_TOKENS`` tokens it samples after
    ``probe`` equal the trainer's for the same tokens, max |Δ| ≤ ``tolerance`` nats (on each live
    replica of a server pool); ``images``: the probe's (PIL images, whose tokens ``probe`` holds),
    which both sides read. Returns the check's metrics."""
    if explorer_version != version:
        raise SyncMismatch(f"weight sync: the explorer holds version {explorer_version}, the trainer published "
                           f"{version}")
    names = trainer.trained_names()
    # an engine that holds the weights compares them (None: it cannot say, as a server cannot)
    if hasattr(engine, "holds") and engine.holds(published := trainer.policy_weights(), names) is False:
        raise SyncMismatch(f"weight sync of version {version} did not arrive: the explorer's weights have sha256 "
                           f"{engine.weights_digest(names)[:12]}, the trainer published "
                           f"{weights_digest(published, names)[:12]}")
    metrics = {"sync/checked": 1.0}
    if logprobs:
        worst = 0.0
        for view in engine.pinned() if hasattr(engine, "pinned") else [engine]:  # each replica of a server pool
            with torch.random.fork_rng():  # the probe's draw leaves the campaign's random state as it was
                [[rollout]] = view.generate_ids([list(probe)], images=[list(images)] if images else None, n=1,
                                                max_new_tokens=PROBE_TOKENS, temperature=temperature)
            ours = trainer.logprobs_of(rollout.prompt_ids, rollout.response_ids, images)
            diff = float((ours - torch.tensor(rollout.logprobs)).abs().max())
            if diff > tolerance:
                where = f" (server {view.base_url})" if hasattr(engine, "pinned") else ""
                raise SyncMismatch(f"weight sync of version {version}: the explorer's log-probs differ from the "
                                   f"trainer's by up to {diff:.4f} nats (tolerance {tolerance}) on the same "
                                   f"{len(rollout.response_ids)} tokens{where}: it samples from other weights")
            worst = max(worst, diff)
        metrics["sync/logprob_max_diff"] = worst
    return metrics


class SyncCheck:
    """``check_sync`` after each publish where trainer and explorer share a process (``sync.check``),
    probed on a task (its images, if any, read by both sides); the log-probs every
    ``sync.check_logprobs_every``-th time, the first included. ``done``: checks made."""

    def __init__(self, settings: SyncConfig, temperature: float):
        self.settings, self.temperature, self.done = settings, temperature, 0

    def __call__(self, trainer, engine, task: Task, version: int, explorer_version: int) -> dict[str, float]:
        every, self.done = self.settings.check_logprobs_every, self.done + 1
        images = task_images(task)
        probe = engine.encode(task.prompt, images) if images else engine.encode(task.prompt)
        return check_sync(trainer, engine, version, explorer_version, probe,
                          logprobs=bool(every) and (self.done - 1) % every == 0,
                          tolerance=self.settings.logprob_tolerance, temperature=self.temperature, images=images)
