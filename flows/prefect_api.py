"""The Prefect API a ``rftflow run`` talks to when ``PREFECT_API_URL`` names none.

Prefect's own ephemeral API is a uvicorn process started from this one; killed with SIGKILL, this
process leaves it running for good, and in the terminal's process group Ctrl-C kills it before the
campaign can record that it stopped. ``booting_prefect_api`` starts the same server (the uvicorn
command of Prefect's ``SubprocessASGIServer``, on ``PREFECT_HOME``'s database, so ``prefect server
start`` later shows every run) in a session of its own (``setsid``: signals to the terminal's
group do not reach it; this process stops it when done), with the kernel told to end it when this
process ends, whatever ends it (Linux's ``PR_SET_PDEATHSIG``; elsewhere it is stopped at exit, as Prefect's is).
It boots at normal priority and, once it answers, runs under Linux's ``SCHED_IDLE`` policy (elsewhere
at nice 10): recording a task run's events costs the server CPU, which at normal priority is taken
from the campaign's compute on a small machine. Even at nice 10 or 19 a busy neighbour slows a
multi-threaded torch step on a small machine; under ``SCHED_IDLE`` it gives way as soon as a
campaign thread wakes, and catches up when the cores are free. Booted under ``SCHED_IDLE``, it got no
CPU at all while other work kept both cores busy, and missed its startup deadline.

It boots in the background (seconds; longer on a new ``PREFECT_HOME``) while this process does its
own start-up (preflight, model), and is waited for when the flow starts: Prefect's
``SubprocessASGIServer.start`` boots and waits in one call, and importing it means importing the
whole server app, so the launch, health wait and stop are written here (a few lines each).

Its task-run recorder writes events in batches (``RECORDER_BATCHING``) rather than Prefect's
default of one transaction per event, which roughly halves the server's CPU per task run (most of
it SQLAlchemy compiling each insert). A task run reaches
the database at most 2 s after its events; the queue is written out when the server stops.
Stopped during a periodic write, the recorder logs that write's cancellation as an ERROR, though
every event is queued again and written by its final flush: ``quiet_retried_flush`` says so at
DEBUG instead (an event dropped is still an ERROR).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import cache

import prefect
from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import (PREFECT_API_URL, PREFECT_HOME, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
                              get_current_settings, temporary_settings)

from rftflow.flows.servers import answers
from rftflow.infra.ports import free_port

# Run in the server process before uvicorn: ask for SIGTERM when the parent (this process) dies
# (PR_SET_PDEATHSIG = 1), and leave at once if it died already. Done in the child itself, not in a
# preexec_fn, which is unsafe in a process with threads.
_BOOT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
except (OSError, AttributeError):  # not Linux: the atexit stop is what remains
    pass
if os.getppid() != int(os.environ["RFTFLOW_PREFECT_PARENT"]):
    sys.exit(0)
from rftflow.flows.prefect_api import quiet_retried_flush
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


PORT_IN_USE = 3  # uvicorn's exit status when its port was taken meanwhile


class PrefectAPIUnavailable(RuntimeError):
    """The embedded Prefect API server exited or did not answer in time; the message says which."""


class EmbeddedServer:
    """The uvicorn process of the embedded API, launched at construction; ``ready`` waits for it."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        self.answered = False  # whether ``ready`` saw it answer: only then may a client have sent it anything
        self._launch()
        atexit.register(self.stop)

    def _launch(self) -> None:
        self.port = free_port()
        # the server's database lives there; one whose folder is missing fails at boot with a traceback of its own
        PREFECT_HOME.value().mkdir(parents=True, exist_ok=True)
        # the command and environment of Prefect's SubprocessASGIServer._run_uvicorn_command, started by _BOOT
        self.process = subprocess.Popen(
            args=[sys.executable, "-c", _BOOT, "--app-dir", str(prefect.__module_path__.parent), "--factory",
                  "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
                  "--log-level", "error", "--lifespan", "on"],
            env={**RECORDER_BATCHING, **os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                 "PREFECT__SERVER_FINAL": "1", "RFTFLOW_PREFECT_PARENT": str(os.getpid()),
                 **get_current_settings().to_environment_variables(exclude_unset=True)},
            # its own session, outside the terminal's process group: Ctrl-C (or a supervisor signalling
            # the group) reaches the campaign, which stops at a safe point and records that here
            # before it stops this server; the kernel still ends it with this process (above)
            start_new_session=True,
        )

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def ready(self) -> str:
        """Wait until the server answers ``/health`` (at most ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``);
        its API URL. A server that exits first, or that does not answer in time, raises ``PrefectAPIUnavailable``."""
        deadline = time.monotonic() + PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        while time.monotonic() < deadline:
            if self.process.poll() == PORT_IN_USE:
                self._launch()
            elif self.process.poll() is not None:
                raise PrefectAPIUnavailable(
                    f"the embedded Prefect API server exited with status {self.process.returncode}")
            elif answers(f"{self.api_url}/health"):
                self.answered = True
                self._yield_the_cores()
                return self.api_url
            time.sleep(0.1)
        waited = PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        raise PrefectAPIUnavailable(
            f"the embedded Prefect API server did not answer within {waited} s "
            "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: a busy machine may need more; or set PREFECT_API_URL "
            "to a running server)")

    def _yield_the_cores(self) -> None:
        """Every thread of the booted server under ``SCHED_IDLE`` (the threads it starts later inherit
        it), run only on a core the campaign leaves idle; where that policy is missing, nice 10."""
        pid = self.process.pid
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):  # not Linux, or a thread that ended meanwhile
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 10)
            except OSError:
                pass  # the server exited: the next API call says so

    def stop(self) -> None:
        """SIGTERM (the recorder writes out its queue), SIGKILL after 5 s. A server never waited for
        (a refusal before the flow) has nothing to write out and gets SIGKILL at once: SIGTERM while
        it still boots fails Prefect 3.8's shutdown of services not yet started ("Reactive triggers
        not started"), a traceback on this command's stderr."""
        if self.process is None:
            return
        if self.answered:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.process.kill()  # a no-op once it has exited
        self.process.wait()
        self.process = None


@contextmanager
def booting_prefect_api() -> Iterator[Callable[[], str | None]]:
    """Within: the embedded API server boots in the background; the function yielded waits for it,
    sets ``PREFECT_API_URL`` to it for the rest of the block and returns that URL. None, and no
    server, when the environment already names an API. Left, the server stops (the last log lines
    and events sent to it first, when it was waited for)."""
    if PREFECT_API_URL.value():
        yield lambda: None
        return
    server = EmbeddedServer()
    with ExitStack() as settings:
        @cache  # the first call waits and sets; later ones return the URL
        def ready() -> str:
            url = server.ready()
            settings.enter_context(temporary_settings({PREFECT_API_URL: url}))
            settings.callback(EventsWorker.drain_all, timeout=10)  # LIFO: logs first, then events
            settings.callback(APILogWorker.drain_all, timeout=10)
            return url

        try:
            yield ready
        finally:
            settings.close()
            server.stop()


@contextmanager
def embedded_prefect_api() -> Iterator[str | None]:
    """Within: ``PREFECT_API_URL`` set to a server that ends with this process (None and no server
    when the environment already names an API)."""
    with booting_prefect_api() as ready:
        yield ready()
