"""Checkpoints and published weights of a campaign in its store (keys: ``layout``).

A checkpoint ``checkpoints/vNNNNNN/`` is committed by its manifest ``checkpoint.json`` (each file's
size and sha256), written last; published weights ``weights/vNNNNNN/`` by ``weights.json``, then
the pointer ``weights/latest.json``. Readers trust a version only once its manifest is there, and
check every file against it. A checkpoint found corrupt is set aside under
``checkpoints/corrupt/vNNNNNN-<UTC time>/`` with ``corrupt.json`` (why), kept until ``buffer gc``.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from rftflow.components.buffer.kill_point import kill_point
from rftflow.components.buffer.layout import CHECKPOINT_MANIFEST, WEIGHTS_MANIFEST, checkpoint_prefix, weights_prefix
from rftflow.components.buffer.store import ObjectStore

CORRUPT_DIR = ("checkpoints", "corrupt")  # checkpoints set aside as corrupt, each under vNNNNNN-<UTC time>/
WARM_START_DIR = "warm_start"  # the warm start's own checkpoints, each under sNNNNNNNN/ (steps done)


class CorruptCheckpoint(ValueError):
    """A committed checkpoint whose files do not match its manifest (missing, truncated, altered)."""


class WeightStore:
    """The checkpoints and published weights of ``campaign`` in ``objects`` (an object store, or the
    ordered view of one behind an ``ExperienceStore``'s write queue)."""

    def __init__(self, objects: ObjectStore, campaign: str):
        self.objects, self.campaign = objects, campaign

    @property
    def url(self) -> str:
        return self.objects.url

    def key(self, *parts: str) -> str:
        return "/".join([self.campaign, *parts])

    # checkpoints ------------------------------------------------------------------------------
    def checkpoint_prefix(self, version: int) -> str:
        return checkpoint_prefix(self.campaign, version)

    def write_checkpoint(self, version: int, files: Path, meta: dict[str, Any]) -> str:
        """Upload every file under ``files`` to ``checkpoints/vNNNNNN/``, then commit it: the
        manifest ``checkpoint.json`` (``meta`` + each file's bytes and sha256) is written last,
        put-if-absent, so a checkpoint is visible only whole. Returns the prefix."""
        prefix = self.checkpoint_prefix(version)
        manifest = self._upload(prefix, files, {**meta, "version": version})
        kill_point("checkpoint", prefix)
        self.objects.put(f"{prefix}/{CHECKPOINT_MANIFEST}", manifest, if_absent=True)
        self.objects.delete(f"{prefix}/corrupt.json")  # a corrupt one set aside at this version is replaced
        return prefix

    def _upload(self, prefix: str, files: Path, meta: dict[str, Any]) -> bytes:
        """Every file under ``files`` to ``prefix/``; the manifest that commits them (``meta`` + each
        file's bytes and sha256), for the caller to write last."""
        listed = {}
        for path in sorted(p for p in files.rglob("*") if p.is_file()):
            data = path.read_bytes()
            name = path.relative_to(files).as_posix()
            self.objects.put(f"{prefix}/{name}", data)
            listed[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        return json.dumps({**meta, "files": listed}, sort_keys=True, indent=1).encode()

    def checkpoints(self) -> list[dict[str, Any]]:
        """The manifests of the committed checkpoints, oldest version first."""
        keys = [k for k in self.objects.list(self.key("checkpoints") + "/") if k.endswith("/" + CHECKPOINT_MANIFEST)]
        return [json.loads(self.objects.get(k)) for k in sorted(keys)]

    def read_checkpoint(self, version: int, into: Path) -> dict[str, Any]:
        """Download committed checkpoint ``version`` into ``into``, each file checked against the
        size and sha256 its manifest gives; ``CorruptCheckpoint`` names the first that differs or is
        missing. Returns its manifest."""
        prefix = self.checkpoint_prefix(version)
        manifest = json.loads(self.objects.get(f"{prefix}/{CHECKPOINT_MANIFEST}"))
        return self._download(prefix, manifest, into, f"checkpoint {prefix} (round {manifest.get('round')})")

    def _download(self, prefix: str, manifest: dict[str, Any], into: Path, what: str) -> dict[str, Any]:
        """The files ``manifest`` lists under ``prefix/`` into ``into``, each checked against it
        (``CorruptCheckpoint``: "``what`` is corrupt: …"); the manifest."""
        for name, meta in manifest["files"].items():
            try:
                data = self.objects.get(f"{prefix}/{name}")
            except KeyError:
                raise CorruptCheckpoint(f"{what} is corrupt: {name} is missing") from None
            if len(data) != meta["bytes"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                raise CorruptCheckpoint(f"{what} is corrupt: {name} has {len(data)} bytes of other content than the "
                                        f"{meta['bytes']} its manifest describes")
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            (into / name).write_bytes(data)
        return manifest

    def set_aside_checkpoint(self, version: int, reason: str) -> str:
        """Uncommit a corrupt checkpoint and keep it for a look: ``corrupt.json`` (its manifest and
        ``reason``) and its files go to ``checkpoints/corrupt/vNNNNNN-<UTC time>/``, out of the way of
        the checkpoint the redone round writes at this version; ``buffer gc`` lists them, ``--apply``
        deletes them. Returns that prefix."""
        prefix = self.checkpoint_prefix(version)
        manifest = json.loads(self.objects.get(f"{prefix}/{CHECKPOINT_MANIFEST}"))
        aside = self.key(*CORRUPT_DIR, f"v{version:06d}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}")
        self.objects.put(f"{aside}/corrupt.json", json.dumps({**manifest, "reason": reason}, indent=1).encode())
        self.objects.delete(f"{prefix}/{CHECKPOINT_MANIFEST}")  # uncommitted before anything moves
        for key in self.objects.list(prefix + "/"):
            self.objects.put(f"{aside}/{key[len(prefix) + 1:]}", self.objects.get(key))
            self.objects.delete(key)
        return aside

    def set_aside(self) -> list[dict[str, Any]]:
        """The ``corrupt.json`` of each checkpoint set aside as corrupt (with its ``prefix``), oldest first."""
        keys = [k for k in self.objects.list(self.key(*CORRUPT_DIR) + "/") if k.endswith("/corrupt.json")]
        return [{**json.loads(self.objects.get(k)), "prefix": k.rsplit("/", 1)[0]} for k in sorted(keys)]

    def delete_checkpoint(self, version: int) -> None:
        self._delete_committed(self.checkpoint_prefix(version), CHECKPOINT_MANIFEST)

    # the warm start's own checkpoints: warm_start/sNNNNNNNN/ (steps done), committed as checkpoints are
    def warm_start_prefix(self, step: int) -> str:
        return self.key(WARM_START_DIR, f"s{step:08d}")

    def write_warm_start(self, step: int, files: Path, meta: dict[str, Any]) -> str:
        """Commit the warm start after ``step`` steps (``files``: what resumes it) as
        ``warm_start/sNNNNNNNN/``, its manifest last; then the older ones go. Returns the prefix."""
        prefix = self.warm_start_prefix(step)
        if not self.objects.exists(f"{prefix}/{CHECKPOINT_MANIFEST}"):  # else committed already, the same state
            manifest = self._upload(prefix, files, {**meta, "step": step})
            self.objects.put(f"{prefix}/{CHECKPOINT_MANIFEST}", manifest, if_absent=True)
        self.delete_warm_starts(keep=step)
        return prefix

    def warm_starts(self) -> list[dict[str, Any]]:
        """The manifests of the committed warm-start checkpoints, fewest steps first."""
        keys = [k for k in self.objects.list(self.key(WARM_START_DIR) + "/") if k.endswith("/" + CHECKPOINT_MANIFEST)]
        return [json.loads(self.objects.get(k)) for k in sorted(keys)]

    def read_warm_start(self, step: int, into: Path) -> dict[str, Any]:
        """Download the warm-start checkpoint after ``step`` steps into ``into`` (checked as ``read_checkpoint``)."""
        prefix = self.warm_start_prefix(step)
        manifest = json.loads(self.objects.get(f"{prefix}/{CHECKPOINT_MANIFEST}"))
        return self._download(prefix, manifest, into, f"warm-start checkpoint {prefix} (step {step})")

    def delete_warm_starts(self, keep: int | None = None) -> None:
        """Every warm-start checkpoint but the one after ``keep`` steps (None: all of them)."""
        base = self.key(WARM_START_DIR) + "/"
        prefixes = {base + k[len(base):].split("/", 1)[0] for k in self.objects.list(base)}
        for prefix in sorted(prefixes - ({self.warm_start_prefix(keep)} if keep is not None else set())):
            self._delete_committed(prefix, CHECKPOINT_MANIFEST)

    def _delete_committed(self, prefix: str, manifest: str) -> None:
        """Uncommit (the manifest first, so no reader trusts what is left), then delete ``prefix``."""
        self.objects.delete(f"{prefix}/{manifest}")
        for key in self.objects.list(prefix + "/"):
            self.objects.delete(key)

    # published weights (sync.method=checkpoint) -----------------------------------------------
    def weights_prefix(self, version: int) -> str:
        return weights_prefix(self.campaign, version)

    def write_weights(self, version: int, safetensors: bytes) -> str:
        """Publish policy weights as ``version``: ``weights/vNNNNNN/model.safetensors``, then its
        manifest ``weights.json`` (put-if-absent: the commit), then the pointer
        ``weights/latest.json``. A reader trusts a version only once its manifest is there."""
        prefix = self.weights_prefix(version)
        self.objects.put(f"{prefix}/model.safetensors", safetensors)
        manifest = {"version": version, "bytes": len(safetensors), "sha256": hashlib.sha256(safetensors).hexdigest()}
        self.objects.put(f"{prefix}/{WEIGHTS_MANIFEST}", json.dumps(manifest, sort_keys=True).encode(), if_absent=True)
        self.objects.put(self.key("weights", "latest.json"), json.dumps({"version": version}).encode())
        return prefix

    def published_weights(self) -> list[int]:
        """Committed weight versions, oldest first."""
        keys = self.objects.list(self.key("weights") + "/")
        return sorted(int(k.split("/")[-2][1:]) for k in keys if k.endswith("/" + WEIGHTS_MANIFEST))

    def read_weights(self, version: int) -> bytes:
        """The safetensors bytes of committed version ``version`` (checked against its manifest)."""
        prefix = self.weights_prefix(version)
        manifest = json.loads(self.objects.get(f"{prefix}/{WEIGHTS_MANIFEST}"))
        data = self.objects.get(f"{prefix}/model.safetensors")
        if hashlib.sha256(data).hexdigest() != manifest["sha256"]:
            raise ValueError(f"{prefix}/model.safetensors: its bytes are not the ones its manifest describes")
        return data

    def delete_weights(self, version: int) -> None:
        self._delete_committed(self.weights_prefix(version), WEIGHTS_MANIFEST)
