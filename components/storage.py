"""Object storage: one small contract, ``file://`` now (``s3://`` keeps the same semantics).

Contract of an ``ObjectStore`` (keys are ``/``-separated, no leading slash):

- ``put(key, data, if_absent=False) -> bool``: write atomically (readers see all or nothing);
  with ``if_absent`` the write happens only if the key does not exist, and exactly one of several
  racing writers wins (returns True; the others False).
- ``get(key) -> bytes`` (``KeyError`` if missing), ``exists(key)``, ``delete(key)`` (idempotent).
- ``list(prefix) -> list[str]``: every key under ``prefix``, sorted lexicographically.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse


class ObjectStore(Protocol):
    url: str

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, key: str) -> None: ...


class FileStore:
    """Objects as files under a root directory; atomic via temp file + rename/link."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid object key {key!r}")
        return self.root / key

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if not if_absent:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)  # atomic create: fails if the key exists
                return True
            except FileExistsError:
                return False
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(f"no object {key!r} in {self.url}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return []
        keys = (
            p.relative_to(self.root).as_posix()
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")
        )
        return sorted(k for k in keys if k.startswith(prefix))

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def open_store(url: str) -> ObjectStore:
    """Open the object store at ``url``: ``file:///abs/path`` or a plain directory path."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        return FileStore(parsed.path if parsed.scheme else url)
    raise ValueError(f"storage.url {url!r}: unsupported scheme {parsed.scheme!r}; supported: file://")
