"""Object storage: one small contract, ``file://`` and ``s3://`` with the same semantics.

Contract of an ``ObjectStore`` (keys are ``/``-separated, no leading slash, no empty, ``.`` or
``..`` segments; a bad key raises ``ValueError``):

- ``put(key, data, if_absent=False) -> bool``: write atomically (readers see all or nothing);
  with ``if_absent`` the write happens only if the key does not exist, and exactly one of several
  racing writers wins (returns True; the others False).
- ``get(key) -> bytes`` (``KeyError`` naming the key if missing), ``exists(key)``,
  ``delete(key)`` (idempotent).
- ``list(prefix) -> list[str]``: every key under ``prefix`` (all pages), sorted
  lexicographically, relative to the store's own root/prefix.
- ``url``: where the store is, never with credentials in it.

``open_store(url, **options)``:

- ``file:///abs/path`` or a plain directory path → ``FileStore`` (atomic via temp file + rename,
  put-if-absent via an atomic hard link).
- ``s3://bucket/prefix`` → ``S3Store`` (boto3; any S3-compatible endpoint: AWS, MinIO, Ceph, R2).
  Put is a single ``PutObject`` (atomic in S3), or a managed multipart upload at and above
  ``multipart_threshold`` (the object appears only when the upload completes); put-if-absent is
  ``PutObject`` with ``If-None-Match: *``. Keyword options, each ``None`` = botocore's own
  environment/config chain:

  ``endpoint_url``       e.g. ``http://minio:9000``; chain: ``AWS_ENDPOINT_URL_S3``,
                         ``AWS_ENDPOINT_URL``, ``endpoint_url`` in the profile.
  ``region``             chain: ``AWS_REGION``, ``AWS_DEFAULT_REGION``, the profile's ``region``.
  ``addressing_style``   ``"auto"`` | ``"path"`` | ``"virtual"`` (MinIO/Ceph usually need ``path``);
                         chain: the profile's ``s3.addressing_style``.
  ``checksum``           ``"when_supported"`` | ``"when_required"``: botocore's
                         ``request_checksum_calculation`` and ``response_checksum_validation``.
                         boto3 >= 1.36 sends CRC checksums by default, which some S3-compatible
                         servers reject: use ``"when_required"`` there. Chain:
                         ``AWS_REQUEST_CHECKSUM_CALCULATION``, ``AWS_RESPONSE_CHECKSUM_VALIDATION``.
  ``max_attempts``       botocore's attempts per try (its own retries of throttling, 5xx and
                         connection errors, within one try of ``outage_seconds``'s loop); chain:
                         ``AWS_MAX_ATTEMPTS``.
  ``retry_mode``         ``"standard"`` | ``"adaptive"``; chain: ``AWS_RETRY_MODE`` (botocore's
                         ``legacy`` mode is replaced by ``standard``).
  ``outage_seconds``     how long an operation keeps trying while the store refuses, resets,
                         hangs, throttles or fails with 5xx (backoff up to 10 s between tries; each
                         try waits at most a twelfth of it to connect and for each answer), counted
                         from the first failed try; past it ``StoreUnavailable`` says so in one line,
                         with the time waited (120 s).
  ``multipart_threshold`` bytes at and above which a put is a multipart upload (64 MiB);
  ``multipart_chunksize`` part size (8 MiB, at least 5 MiB); ``max_concurrency`` parallel parts (8).

  Credentials come only from the standard chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
  ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, ``AWS_SHARED_CREDENTIALS_FILE``, ``AWS_CONFIG_FILE``,
  SSO, web identity, container/instance metadata); URLs with credentials in them are refused.
  Nothing here puts a credential into ``url``, ``repr``, pickles, exceptions or logs (the session
  token that botocore's own DEBUG logs print with each request is masked).
"""

from __future__ import annotations

import io
import logging
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse
from urllib.request import url2pathname

from rftflow.components.secrets import redact_url

MiB = 1024 * 1024
SCHEMES = ("file://", "s3://")
log = logging.getLogger("rftflow.store")


class StoreUnavailable(ConnectionError):
    """The store did not answer (connection refused, throttling, 5xx) for longer than the store's
    outage budget; the message is one line naming the store and the last error."""


class ObjectStore(Protocol):
    url: str

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def exists(self, key: str) -> bool: ...
    def list(self, prefix: str = "") -> list[str]: ...
    def delete(self, key: str) -> None: ...


def check_key(key: str) -> str:
    """``key`` if it is a valid object key, else ``ValueError`` (same rule for every backend)."""
    if not isinstance(key, str) or not key or key.startswith("/") or {"", ".", ".."} & set(key.split("/")):
        raise ValueError(f"invalid object key {key!r}")
    return key


class FileStore:
    """Objects as files under a root directory; atomic via temp file + rename/link."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def __repr__(self) -> str:
        return f"FileStore({self.url!r})"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

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
        """Keys under ``prefix``, sorted. Another process may delete keys meanwhile (an old weight
        version): what vanishes during the walk is left out, as an S3 listing would (``os.walk``
        skips a folder removed under it, where ``Path.rglob`` raises ``FileNotFoundError``)."""
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        keys = (
            Path(folder, name).relative_to(self.root).as_posix()
            for folder, _, names in os.walk(base)
            for name in names
            if not name.startswith(".tmp-")
        )
        return sorted(k for k in keys if k.startswith(prefix))

    def delete(self, key: str) -> None:
        """Remove the object, and the directories it leaves empty (as S3 has no empty folders)."""
        path = self._path(key)
        path.unlink(missing_ok=True)
        for parent in path.parents:
            if parent == self.root:
                break
            try:
                parent.rmdir()
            except OSError:  # not empty (or already gone)
                break

    def close(self) -> None:
        """Nothing to release (here for symmetry with ``S3Store``)."""


class _RedactSessionTokens(logging.Filter):
    """botocore's DEBUG records print request headers, session token included: mask its value."""

    PATTERN = re.compile(r"""(x-amz-security-token['"]?\s*[:=]\s*b?['"]?)[^\s'",&}]+""", re.IGNORECASE)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "security-token" in message.lower():
            record.msg, record.args = self.PATTERN.sub(r"\1***", message), ()
        return True


def _redact_botocore_logs() -> None:
    for name in ("botocore.auth", "botocore.endpoint"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactSessionTokens) for f in logger.filters):
            logger.addFilter(_RedactSessionTokens())


_LOADER: Any = None  # botocore's data loader, shared by the clients of all S3Stores
_LOADER_LOCK = threading.Lock()
_ADDRESSING_STYLES = ("auto", "path", "virtual")
_CHECKSUM_MODES = ("when_supported", "when_required")
_RETRY_MODES = ("standard", "adaptive")


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    if value is not None and value not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return value


def _error(exc: Exception) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a botocore ``ClientError``."""
    response = getattr(exc, "response", {}) or {}
    return (str(response.get("Error", {}).get("Code", "")),
            int(response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0))


class S3Store:
    """Objects under ``s3://bucket/prefix`` (boto3). Same contract as ``FileStore``; see the module doc.

    The boto3 client is created on first use (thread-safe, shared by threads); a store pickles as
    its options only and is cheap to construct. ``close()`` releases the HTTP connections.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        addressing_style: str | None = None,
        checksum: str | None = None,
        max_attempts: int | None = None,
        retry_mode: str | None = None,
        outage_seconds: float | None = None,
        multipart_threshold: int = 64 * MiB,
        multipart_chunksize: int = 8 * MiB,
        max_concurrency: int = 8,
    ):
        if not bucket:
            raise ValueError("S3Store needs a bucket name")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if self.prefix:
            check_key(self.prefix)
        self._key_prefix = self.prefix + "/" if self.prefix else ""
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self.endpoint_url = endpoint_url
        self.region = region
        self.addressing_style = _choice("addressing_style", addressing_style, _ADDRESSING_STYLES)
        self.checksum = _choice("checksum", checksum, _CHECKSUM_MODES)
        self.retry_mode = _choice("retry_mode", retry_mode, _RETRY_MODES)
        if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
            raise ValueError(f"max_attempts={max_attempts!r}: expected an integer >= 1")
        self.max_attempts = max_attempts
        self.outage_seconds = 120.0 if outage_seconds is None else float(outage_seconds)
        if multipart_threshold < 1 or max_concurrency < 1:
            raise ValueError("multipart_threshold and max_concurrency must be positive")
        self.multipart_threshold = int(multipart_threshold)
        self.multipart_chunksize = max(5 * MiB, int(multipart_chunksize))  # S3's smallest part
        self.max_concurrency = int(max_concurrency)
        self._lock = threading.Lock()
        self._client: Any = None
        self._outage_since: float | None = None  # when the outage every thread is in began (monotonic)

    # -- construction, pickling, cleanup -------------------------------------------------------

    def __repr__(self) -> str:
        endpoint = f", endpoint_url={redact_url(self.endpoint_url)!r}" if self.endpoint_url else ""
        return f"S3Store({self.url!r}{endpoint})"

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_client", "_outage_since")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock, self._client, self._outage_since = threading.Lock(), None, None

    def close(self) -> None:
        """Close the HTTP connections; the store stays usable (a new client is made on next use)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def __enter__(self) -> S3Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def client(self) -> Any:
        """The boto3 S3 client (created on first use with this store's options)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _make_client(self) -> Any:
        import boto3
        import botocore.session
        from botocore.config import Config

        _redact_botocore_logs()
        core = botocore.session.get_session()  # a fresh one: reads the environment and profile chain
        global _LOADER
        with _LOADER_LOCK:  # the parsed service models (~80 ms per client otherwise); no credentials
            if _LOADER is None:
                _LOADER = core.get_component("data_loader")
            else:
                core.register_component("data_loader", _LOADER)
        retries: dict[str, Any] = {"mode": self.retry_mode or core.get_config_variable("retry_mode")}
        if retries["mode"] not in _RETRY_MODES:
            retries["mode"] = "standard"
        if self.max_attempts is not None:
            retries["total_max_attempts"] = self.max_attempts
        options: dict[str, Any] = {
            "retries": retries,
            # a server that accepts and never answers fails a try in seconds, not botocore's 60 s
            "connect_timeout": self.try_timeout,
            "read_timeout": self.try_timeout,
            "max_pool_connections": max(10, 2 * self.max_concurrency),
            "user_agent_extra": "rftflow",
        }
        if self.addressing_style:
            options["s3"] = {"addressing_style": self.addressing_style}
        if self.checksum:
            options["request_checksum_calculation"] = self.checksum
            options["response_checksum_validation"] = self.checksum
        region = self.region or os.environ.get("AWS_REGION") or None
        session = boto3.session.Session(botocore_session=core, region_name=region)
        return session.client("s3", endpoint_url=self.endpoint_url, config=Config(**options))

    def _transfer_config(self) -> Any:
        from boto3.s3.transfer import TransferConfig

        return TransferConfig(multipart_threshold=self.multipart_threshold,
                              multipart_chunksize=self.multipart_chunksize,
                              max_concurrency=self.max_concurrency,
                              preferred_transfer_client="classic")

    def _s3_key(self, key: str) -> str:
        return self._key_prefix + check_key(key)

    # -- the contract --------------------------------------------------------------------------

    @property
    def try_timeout(self) -> float:
        """Seconds one try may wait to connect, and then for each answer: a twelfth of the outage
        budget, between 1 and 60 s. A try that hangs past the budget's end overruns it by at most this."""
        return min(60.0, max(1.0, self.outage_seconds / 12))

    def _outlasting(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, tried again while the store refuses, resets, hangs (``try_timeout``),
        throttles or fails with 5xx, backing off up to 10 s, until ``outage_seconds`` have passed
        since the outage began (the last try starts early enough to end by then, so the wait is the
        budget within one ``try_timeout``); then ``StoreUnavailable`` with the time waited.

        One outage is shared by every thread using this store: it begins with the first failed try
        anywhere, is logged once, and ends with the next success; a call that fails during it has
        only the budget left. Every operation here is safe to repeat: puts write whole objects,
        and a put-if-absent repeated after a try that wrote the object but lost its answer finds
        its own bytes there and answers True (``put``)."""
        tries = 0
        while True:
            began = time.monotonic()
            try:
                result = call()
            except Exception as exc:  # noqa: BLE001 — sorted out by _transient
                if not _transient(exc):
                    raise
                with self._lock:
                    first = self._outage_since is None
                    if first:
                        self._outage_since = began
                    started = self._outage_since
                waited = time.monotonic() - started
                left = self.outage_seconds - waited
                if left <= self.try_timeout:  # a try that hangs from now on would end past the budget
                    raise StoreUnavailable(
                        f"store {self.url} unavailable for {waited:.0f} s ({what}: {_describe(exc)}); "
                        "run the same command again once it is back") from None
                if first:
                    log.warning("store %s: %s failed (%s); retrying for up to %.0f s", self.url, what,
                                _describe(exc), self.outage_seconds)
                pause = min(10.0, 0.5 * 2 ** tries) * (0.5 + random.random() / 2)
                time.sleep(min(pause, left - self.try_timeout))  # the last try ends by the budget's end
                tries += 1
            else:
                if self._outage_since is not None:
                    with self._lock:
                        self._outage_since = None
                return result

    def put(self, key: str, data: bytes, if_absent: bool = False) -> bool:
        """Write ``data`` at ``key`` atomically; with ``if_absent`` only if absent (False if present).

        A put-if-absent is a single ``PutObject`` with ``If-None-Match: *`` (so up to 5 GiB):
        412 PreconditionFailed → False. A 409 ConditionalRequestConflict (a concurrent write or
        delete of the key) → False if the key now exists, else the error is raised.
        """
        tries = 0

        def attempt() -> bool:
            nonlocal tries
            tries += 1
            # an earlier try may have written the object and lost its answer: then the object is this one
            return self._put(key, data, if_absent) or (tries > 1 and self._get(key) == data)

        return self._outlasting(f"put {key}", attempt)

    def _put(self, key: str, data: bytes, if_absent: bool) -> bool:
        from botocore.exceptions import ClientError

        s3_key = self._s3_key(key)
        if if_absent:
            try:
                self.client.put_object(Bucket=self.bucket, Key=s3_key, Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code, status = _error(exc)
                if status == 412 or code == "PreconditionFailed":
                    return False
                if (status == 409 or code == "ConditionalRequestConflict") and self.exists(key):
                    return False
                raise
        if len(data) >= self.multipart_threshold:
            self.client.upload_fileobj(io.BytesIO(data), self.bucket, s3_key, Config=self._transfer_config())
        else:
            self.client.put_object(Bucket=self.bucket, Key=s3_key, Body=data)
        return True

    def get(self, key: str) -> bytes:
        return self._outlasting(f"get {key}", lambda: self._get(key))

    def _get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._s3_key(key))
        except ClientError as exc:
            code, status = _error(exc)
            if status == 404 or code in ("NoSuchKey", "404"):
                raise KeyError(f"no object {key!r} in {self.url}") from None
            raise
        with response["Body"] as body:
            return body.read()

    def exists(self, key: str) -> bool:
        return self._outlasting(f"head {key}", lambda: self._exists(key))

    def _exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._s3_key(key))
            return True
        except ClientError as exc:
            code, status = _error(exc)
            if status == 404 or code in ("NoSuchKey", "404", "NotFound"):
                return False
            raise

    def list(self, prefix: str = "") -> list[str]:
        return self._outlasting(f"list {prefix or '/'}", lambda: self._list(prefix))

    def _list(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        n = len(self._key_prefix)
        keys = [
            obj["Key"][n:]
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key_prefix + prefix)
            for obj in page.get("Contents", ())
            if not obj["Key"].endswith("/")  # "folder" placeholders some tools create
        ]
        return sorted(keys)

    def delete(self, key: str) -> None:
        self._outlasting(f"delete {key}", lambda: self.client.delete_object(Bucket=self.bucket, Key=self._s3_key(key)))


_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "RequestTimeTooSkewed",
                    "ServiceUnavailable", "InternalError", "TooManyRequests"}


def _transient(exc: Exception) -> bool:
    """Whether ``exc`` says the store is away or overloaded (so trying again later may work)."""
    from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError, HTTPClientError

    if isinstance(exc, (BotoConnectionError, HTTPClientError)):  # refused, reset, timed out
        return True
    if isinstance(exc, ClientError):
        code, status = _error(exc)
        return status >= 500 or status == 429 or code in _TRANSIENT_CODES
    return False


def _describe(exc: Exception) -> str:
    """An exception in one short line: its type and the first line of its message."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def store_options(storage) -> dict[str, Any]:
    """``open_store`` options of an S3 store from a ``StorageConfig``. Credentials come from the AWS
    chain, never config. Unset checksum and attempts defer to the AWS environment
    (``AWS_REQUEST_CHECKSUM_CALCULATION``, ``AWS_MAX_ATTEMPTS``), then to ``when_required`` and 1:
    the store's own loop retries every transient failure within ``outage_seconds`` (botocore's
    retries inside a try would hide the first failure and stretch a try past its timeout)."""
    env = os.environ
    return {"endpoint_url": storage.endpoint_url, "region": storage.region,
            "addressing_style": storage.addressing_style,
            "checksum": storage.checksum or (None if env.get("AWS_REQUEST_CHECKSUM_CALCULATION") else "when_required"),
            "max_attempts": storage.max_attempts or (None if env.get("AWS_MAX_ATTEMPTS") else 1),
            "outage_seconds": storage.outage_seconds}


def parse_store_url(url: str) -> tuple[str, str, str]:
    """(scheme, location, prefix) of a store URL without touching the store: ``("file", path, "")``
    for ``file:///abs/path`` or a plain path, ``("s3", bucket, prefix)`` for ``s3://bucket[/prefix]``.
    Other schemes, URLs with credentials, queries or fragments raise ``ValueError`` naming the URL."""
    parsed = urlparse(url)
    if parsed.scheme in ("", "file"):
        if not parsed.scheme:
            return "file", url, ""
        if parsed.netloc not in ("", "localhost"):
            raise ValueError(f"storage.url {redact_url(url)!r}: a file URL names an absolute path, "
                             "file:///abs/path (a host part is not a directory)")
        return "file", url2pathname(parsed.path), ""  # undoes the %-quoting of Path.as_uri()
    if parsed.scheme == "s3":
        if "@" in parsed.netloc:
            raise ValueError(f"storage.url {redact_url(url)!r}: credentials do not belong in the URL; "
                             "use the AWS credential chain (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)")
        if parsed.query or parsed.fragment or parsed.params:
            raise ValueError(f"storage.url {url!r}: no query or fragment allowed; pass options instead")
        if not parsed.netloc:
            raise ValueError(f"storage.url {url!r}: expected s3://bucket[/prefix]")
        return "s3", parsed.netloc, parsed.path
    raise ValueError(f"storage.url {redact_url(url)!r}: unsupported scheme {parsed.scheme!r}; "
                     f"supported: {', '.join(SCHEMES)}")


def open_store(url: str, **options: Any) -> ObjectStore:
    """Open the object store at ``url`` (see ``parse_store_url``); ``options`` (S3 only) as in
    ``S3Store`` / the module doc."""
    scheme, location, prefix = parse_store_url(url)
    if scheme == "file":
        extra = sorted(k for k, v in options.items() if v is not None)
        if extra:
            raise TypeError(f"options {', '.join(extra)} apply to s3:// stores only, not {redact_url(url)!r}")
        return FileStore(location)
    return S3Store(location, prefix, **options)
