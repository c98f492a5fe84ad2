"""A real S3 HTTP server on 127.0.0.1 for tests and benchmarks: moto's server mode, quiet.

    with S3TestServer() as server:          # fake credentials + AWS_ENDPOINT_URL in os.environ
        bucket = server.new_bucket()
        store = open_store(f"s3://{bucket}/prefix", endpoint_url=server.endpoint_url)

``S3TestServer`` runs ``moto.server.ThreadedMotoServer`` (on a free port) in a child process by
default, so the server's Python work does not share a GIL with the client under test (about
1.6x the request rate on 2 cores); ``in_process=True`` runs it in a thread of this process. The
child exits when this process closes its stdin or dies. Two things are added in front of moto,
at the HTTP (WSGI) layer:

- Writes to one key are serialized. moto 5.2.5 implements ``PutObject`` with ``If-None-Match: *``
  as check-then-write with no lock, so under concurrent requests two conditional writers can both
  succeed (seen: 2 races in 100 with 8 writers), and concurrent overwrites of one key can fail
  with a 500 (``I/O operation on closed file``). Real S3 makes the conditional write atomic; the
  per-key lock gives moto that guarantee, nothing more (reads and other keys run in parallel).
- ``fail_next(n, status)`` makes the next ``n`` requests answer ``status`` (503 SlowDown, 500
  InternalError) without reaching moto, to check that clients retry.

Run it by hand with ``python tests/s3server.py [PORT]`` (prints the endpoint URL).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import urllib.request
import uuid
import zlib
from typing import Any
from urllib.parse import parse_qs

from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,  # never read the developer's real profile
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask instance metadata for credentials
}
CLEARED_ENV = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
               "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
               "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI")
CONTROL_PATH = "/_s3server/fail"  # "_s3server" is not a valid bucket name: no clash with S3 calls

_ERRORS = {503: "SlowDown", 500: "InternalError", 502: "BadGateway", 429: "TooManyRequests"}


def quiet_logs() -> None:
    """Silence werkzeug's per-request log lines and moto's chatter."""
    for name in ("werkzeug", "moto"):
        logging.getLogger(name).setLevel(logging.ERROR)


class _Guard:
    """WSGI middleware in front of moto: per-key write lock, injected failures (module doc)."""

    def __init__(self, app: Any, stripes: int = 64):
        self.app = app
        self._locks = [threading.Lock() for _ in range(stripes)]
        self._fail_lock = threading.Lock()
        self._fail: list[int] = []

    def _respond(self, start_response: Any, status: int, code: str) -> list[bytes]:
        body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        start_response(f"{status} {code}", [("Content-Type", "application/xml"),
                                             ("Content-Length", str(len(body)))])
        return [body]

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == CONTROL_PATH:
            query = parse_qs(environ.get("QUERY_STRING", ""))
            with self._fail_lock:
                self._fail.extend([int(query["status"][0])] * int(query["n"][0]))
            return self._respond(start_response, 200, "OK")
        with self._fail_lock:
            status = self._fail.pop(0) if self._fail else None
        if status is not None:
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            return self._respond(start_response, status, _ERRORS.get(status, "ServiceUnavailable"))
        if environ.get("REQUEST_METHOD") not in ("PUT", "POST", "DELETE"):
            return self.app(environ, start_response)
        target = f"{environ.get('HTTP_HOST', '')}{environ.get('PATH_INFO', '')}"  # path or virtual style
        with self._locks[zlib.crc32(target.encode("utf-8", "surrogateescape")) % len(self._locks)]:
            result = self.app(environ, start_response)  # moto does all the work inside this call
            try:
                return list(result)
            finally:
                if hasattr(result, "close"):
                    result.close()


class MotoS3Server(ThreadedMotoServer):
    """``ThreadedMotoServer`` on 127.0.0.1 (port 0: a free one) with the guard in front."""

    def __init__(self, ip_address: str = "127.0.0.1", port: int = 0):
        super().__init__(ip_address=ip_address, port=port, verbose=False)

    def _server_entry(self) -> None:  # as in ThreadedMotoServer, with the guard around the app
        app = _Guard(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
        self._server_ready_event.set()
        self._server.serve_forever()

    @property
    def endpoint_url(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"


class S3TestServer:
    """A ``MotoS3Server`` in a child process (or in this one), plus test helpers; a context manager.

    On enter it starts the server and puts ``env`` (fake credentials, ``AWS_ENDPOINT_URL``, no
    profile files, no instance metadata) into ``os.environ``; on exit it restores both.
    """

    def __init__(self, in_process: bool = False):
        self.in_process = in_process
        self.endpoint_url = ""
        self._thread_server: MotoS3Server | None = None
        self._child: subprocess.Popen | None = None
        self._saved_env: dict[str, str | None] = {}
        self._admin: Any = None  # the client new_bucket uses

    def start(self) -> None:
        quiet_logs()
        if self.in_process:
            self._thread_server = MotoS3Server()
            self._thread_server.start()
            self.endpoint_url = self._thread_server.endpoint_url
            return
        self._child = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, env={**os.environ, **FAKE_ENV})
        line = self._child.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"moto S3 server did not start (said {line!r})")
        self.endpoint_url = line

    def stop(self) -> None:
        if self._admin is not None:
            self._admin.close()
            self._admin = None
        if self._thread_server is not None:
            self._thread_server.stop()
            self._thread_server = None
        if self._child is not None:
            self._child.stdin.close()  # the child's signal to stop
            try:
                self._child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
            self._child.stdout.close()
            self._child = None

    @property
    def env(self) -> dict[str, str]:
        """Environment for clients (and subprocesses): fake credentials, this endpoint."""
        return {**FAKE_ENV, "AWS_ENDPOINT_URL": self.endpoint_url}

    def apply_env(self) -> None:
        """Put ``env`` into ``os.environ`` and drop other credential sources (see ``restore_env``)."""
        for name in (*self.env, *CLEARED_ENV):
            self._saved_env.setdefault(name, os.environ.get(name))
        for name in CLEARED_ENV:
            os.environ.pop(name, None)
        os.environ.update(self.env)

    def restore_env(self) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()

    def client(self) -> Any:
        """A raw boto3 client for this server (for set-up and inspection); close it after use."""
        import boto3

        return boto3.session.Session(
            aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
        ).client("s3", endpoint_url=self.endpoint_url)

    def new_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh random name by default) and return its name."""
        name = name or f"test-{uuid.uuid4().hex[:16]}"
        if self._admin is None:
            self._admin = self.client()
        self._admin.create_bucket(Bucket=name)
        return name

    def fail_next(self, n: int, status: int = 503) -> None:
        """The next ``n`` requests (any client) get HTTP ``status`` with an S3 error body."""
        url = f"{self.endpoint_url}{CONTROL_PATH}?n={n}&status={status}"
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as response:
            assert response.status == 200

    def __enter__(self) -> S3TestServer:
        self.start()
        self.apply_env()
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore_env()
        self.stop()


def serve(port: int = 0) -> None:
    """Run a ``MotoS3Server``, print its endpoint URL, stop when stdin closes (the parent is gone)."""
    quiet_logs()
    server = MotoS3Server(port=port)
    server.start()
    print(server.endpoint_url, flush=True)
    try:
        sys.stdin.read()
    except KeyboardInterrupt:
        pass
    server.stop()


if __name__ == "__main__":
    serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
