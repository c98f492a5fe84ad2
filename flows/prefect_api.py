"""The Prefect API a ``rftflow run`` talks to when ``PREFECT_API_URL`` names none.

Prefect's own ephemeral API is a uvicorn process started from this one; killed with SIGKILL, this
process leaves it running for good. ``embedded_prefect_api`` starts the same server (Prefect's
``SubprocessASGIServer``, on ``PREFECT_HOME``'s database, so ``prefect server start`` later shows
every run) with the kernel told to end it when this process ends, whatever ends it (Linux's
``PR_SET_PDEATHSIG``; elsewhere it is stopped at exit, as Prefect's is), at nice 10: recording a
task run's events costs the server CPU, which at normal priority is taken from the campaign's
compute on a small machine; lowered, it catches up when the cores are free.

Its task-run recorder writes events in batches (``RECORDER_BATCHING``) rather than Prefect's
default of one transaction per event: measured on 2 cores, a task run then costs the server
~12 ms of CPU instead of ~25 ms (most of it SQLAlchemy compiling each insert). A task run reaches
the database at most 2 s after its events; the queue is written out when the server stops.
Stopped during a periodic write, the recorder logs that write's cancellation as an ERROR, though
every event is queued again and written by its final flush: ``quiet_retried_flush`` says so at
DEBUG instead (an event dropped is still an ERROR).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import prefect
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

# Run in the server process before uvicorn: ask for SIGTERM when the parent (this process) dies
# (PR_SET_PDEATHSIG = 1), and leave at once if it died already. Done in the child itself, not in a
# preexec_fn, which is unsafe in a process with threads.
_BOOT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):  # not Linux: Prefect's atexit stop is what remains
    pass
if os.getppid() != int(os.environ["RFTFLOW_PREFECT_PARENT"]):
    sys.exit(0)
os.nice(10)
from flows.prefect_api import quiet_retried_flush
quiet_retried_flush()
from uvicorn.main import main
main()
"""


# defaults only: the environment wins
RECORDER_BATCHING = {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "50",
                     "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL": "2"}


_RETRIED_FLUSH = re.compile(r"Error flushing (\d+) events \(\1 to retry, 0 dropped\)")


class _RetriedFlushAtDebug(logging.Filter):
    """A recorder write cancelled with every event queued again (Prefect 3.8's ``consumer.flush``
    puts the batch back, logs this ERROR, and its final flush writes the batch when the server
    stops) becomes a DEBUG line without traceback; every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        cancelled = record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError)
        if not (record.levelno == logging.ERROR and cancelled and _RETRIED_FLUSH.fullmatch(record.getMessage())):
            return True
        record.levelno, record.levelname, record.exc_info, record.exc_text = logging.DEBUG, "DEBUG", None, None
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def quiet_retried_flush() -> None:
    """Install ``_RetriedFlushAtDebug`` on the task-run recorder's logger (in the server process)."""
    logging.getLogger("prefect.server.services.task_run_recorder").addFilter(_RetriedFlushAtDebug())


def _server_ending_with_us():
    """Prefect's ephemeral API server, its uvicorn process bound to this one's life. Prefect's server
    modules are imported here, not at the top: 2.5 s that a run against a named API does not need."""
    from prefect.server.api.server import SubprocessASGIServer

    class ServerEndingWithUs(SubprocessASGIServer):
        def _run_uvicorn_command(self) -> subprocess.Popen[Any]:
            # the command and environment of SubprocessASGIServer._run_uvicorn_command, started by _BOOT
            return subprocess.Popen(
                args=[sys.executable, "-c", _BOOT, "--app-dir", str(prefect.__module_path__.parent), "--factory",
                      "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                      "--log-level", "error", "--lifespan", "on"],
                env={**RECORDER_BATCHING, **os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                     "PREFECT__SERVER_FINAL": "1", "RFTFLOW_PREFECT_PARENT": str(os.getpid()),
                     **get_current_settings().to_environment_variables(exclude_unset=True)},
            )

    return ServerEndingWithUs()


@contextmanager
def embedded_prefect_api() -> Iterator[str | None]:
    """Within: ``PREFECT_API_URL`` set to a server that ends with this process (None and no server
    when the environment already names an API)."""
    if PREFECT_API_URL.value():
        yield None
        return
    server = _server_ending_with_us()
    server.start()
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            try:
                yield server.api_url
            finally:
                APILogWorker.drain_all(timeout=10)  # the last log lines and events reach the server before it stops
                EventsWorker.drain_all(timeout=10)
    finally:
        server.stop()
