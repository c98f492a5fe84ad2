"""``rftflow`` run as a person runs it: a process group of its own (a terminal's foreground job),
optionally on a pseudo-terminal (progress bars on), its output followed line by line.

    run = UserRun(["run", "--run-dir", d, "--set", "rounds=4"], env=env, tty=True)
    run.wait_for("warm start")        # the text appeared in its output (ANSI codes stripped)
    run.interrupt()                   # Ctrl-C: SIGINT to the whole process group, as a terminal sends it
    code, out = run.finish()          # exit code and the whole output
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


def cli(*args: str) -> list[str]:
    """The command line of ``rftflow ARGS`` in this interpreter."""
    return [sys.executable, "-m", "rftflow.flows.cli", *args]


def sets(*assignments: str) -> list[str]:
    return [a for s in assignments for a in ("--set", s)]


class UserRun:
    def __init__(self, args: list[str], *, env: dict, cwd: str | Path = ROOT, tty: bool = False):
        self.started = time.monotonic()
        self._chunks: list[str] = []
        self._lock = threading.Lock()
        if tty:  # a terminal of 200 columns: rich draws its bars
            leader, follower = pty.openpty()
            env = {**env, "COLUMNS": "200", "LINES": "50", "TERM": "xterm"}
            self.proc = subprocess.Popen(cli(*args), cwd=cwd, env=env, stdin=follower, stdout=follower,
                                         stderr=follower, start_new_session=True)
            os.close(follower)
            reader = lambda: os.read(leader, 65536)  # noqa: E731
        else:
            self.proc = subprocess.Popen(cli(*args), cwd=cwd, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            leader = None
            reader = lambda: os.read(self.proc.stdout.fileno(), 65536)  # noqa: E731
        self._thread = threading.Thread(target=self._follow, args=(reader, leader), daemon=True)
        self._thread.start()

    def _follow(self, read, leader) -> None:
        while True:
            try:
                data = read()
            except OSError:  # the pty closes with its last writer
                break
            if not data:
                break
            with self._lock:
                self._chunks.append(data.decode(errors="replace"))
        if leader is not None:
            os.close(leader)

    @property
    def output(self) -> str:
        """What it printed so far, terminal control codes stripped."""
        with self._lock:
            return ANSI.sub("", "".join(self._chunks))

    def wait_for(self, text: str, timeout: float = 300.0) -> float:
        """Seconds since the start when ``text`` first appeared; ``AssertionError`` if it exits or
        ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.proc.poll() is not None:
                self._thread.join(timeout=5)
                if text in self.output:
                    break
                raise AssertionError(f"exited {self.proc.returncode} before {text!r}:\n{self.output[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in {timeout:.0f} s:\n{self.output[-3000:]}")
            time.sleep(0.05)
        return time.monotonic() - self.started

    def interrupt(self, sig: int = signal.SIGINT) -> float:
        """Signal the whole process group, as a terminal's Ctrl-C (or a supervisor) does; when."""
        os.killpg(self.proc.pid, sig)
        return time.monotonic()

    def finish(self, timeout: float = 600.0) -> tuple[int, str]:
        """Wait for the exit: (exit code, output)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise AssertionError(f"still running after {timeout:.0f} s:\n{self.output[-3000:]}") from None
        self._thread.join(timeout=10)
        return self.proc.returncode, self.output


def run_to_end(args: list[str], *, env: dict, cwd: str | Path = ROOT, tty: bool = False,
               timeout: float = 600.0) -> tuple[int, str]:
    """``rftflow ARGS`` from start to exit: (exit code, output)."""
    return UserRun(args, env=env, cwd=cwd, tty=tty).finish(timeout)


def lines_with(output: str, text: str) -> list[str]:
    return [line for line in output.splitlines() if text in line]


def clean(output: str) -> None:
    """A healthy or cleanly stopped run: no traceback, no ERROR line."""
    assert "Traceback" not in output, output[-4000:]
    assert not lines_with(output, "| ERROR"), lines_with(output, "| ERROR")
