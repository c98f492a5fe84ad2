"""Running untrusted programs (a policy's code) in a sandbox: bubblewrap, one process per execution.

Each execution is a fresh ``bwrap`` process (bubblewrap, the Debian package, as Flatpak uses it):

- its own user, pid, mount, network, IPC, UTS and cgroup namespaces (``--unshare-all``): it sees
  only its own processes in ``/proc``, no network but its own loopback, and a root file system
  made of the interpreter's files (read-only) and a throw-away working directory (``/work``,
  deleted afterwards) and ``/tmp`` (a tmpfs);
- started as an unprivileged user (``nobody``) when the caller is root, as CI and many users are:
  root is exempt from ``RLIMIT_NPROC``, and a root-owned process could read other processes'
  ``/proc/<pid>/environ`` were the pid namespace ever shared;
- a scrubbed environment (``--clearenv``: PATH, HOME and nothing of the caller's);
- rlimits: CPU seconds, address space, file size and open files set by ``prlimit`` before bwrap
  starts, processes by the interpreter inside the sandbox (``LAUNCHER``); a wall-clock timeout
  kills its whole session, and bubblewrap's ``--die-with-parent`` and the pid namespace take every
  process it started with it;
- no descriptor of the caller's but the ones it names (``Sandbox.start(..., fds=...)``: the
  private pipes of ``relay.py``, which runs a program and its tests in two sandboxes).

Python's interpreter runs isolated (``-I -S``: no user site, no site-packages, no PYTHON*
variables). ``Sandbox.check()`` runs a trivial program and raises ``SandboxUnavailable`` (one line
saying why) where bubblewrap is missing or cannot create its namespaces; ``kind="none"`` is the
explicit opt-out (a bare subprocess with the same rlimits, which is not a sandbox).

``run`` runs a program to its end; ``start`` starts one, ``Running.finish`` waits for it and
cleans up. An ``Execution`` says what the program did (exit code, output, a timeout or a limit
hit); a failure of the sandbox itself (bubblewrap could not set the sandbox up) raises
``SandboxUnavailable``: the caller must not score it as the program's fault.
"""

from __future__ import annotations

import os
import pwd
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

OUTPUT_BYTES = 64 * 1024  # of stdout and of stderr kept per execution
T, R = TypeVar("T"), TypeVar("R")

# The interpreter says it started (one byte on the descriptor it is given, which it then closes),
# limits its processes, and runs main.py as __main__: a run without that byte failed before the
# program could run, in the sandbox's set-up. The process limit is set here, inside the sandbox's
# own user namespace, where it counts this execution's processes only; set before bubblewrap it
# would count the sandbox user's processes everywhere (and stop bubblewrap's own forks).
# The arguments after those two (the numbers of descriptors the caller passed) are main.py's.
LAUNCHER = ("import os, resource, sys; fd, n = int(sys.argv[1]), int(sys.argv[2]); os.write(fd, b'+'); os.close(fd); "
            "resource.setrlimit(resource.RLIMIT_NPROC, (n, n)); sys.argv = ['main.py', *sys.argv[3:]]; "
            "exec(compile(open('main.py').read(), 'main.py', 'exec'), {'__name__': '__main__'})")


class SandboxUnavailable(RuntimeError):
    """The sandbox could not run a program (missing, not permitted, failed to set up): an
    infrastructure failure, never the program's. The message is one line."""


@dataclass(frozen=True)
class Limits:
    """What one execution may use."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    memory_mb: int = 512  # address space
    processes: int = 16  # at once, of this execution (RLIMIT_NPROC in its own user namespace)
    file_mb: int = 16  # largest file it may write (its output included)
    open_files: int = 64


@dataclass(frozen=True)
class Execution:
    """What a program did: ``returncode`` (negative: killed by that signal), its output (the first
    ``OUTPUT_BYTES`` of each), and whether the wall-clock timeout ended it."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def reason(self, limits: Limits) -> str | None:
        """Why the program failed, in one line (None if it exited 0 in time)."""
        if self.timed_out:
            return f"timed out after {limits.wall_seconds:g} s"
        if self.returncode == 0:
            return None
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = f"signal {-self.returncode}"
            limit = {"SIGXCPU": f" (CPU limit, {limits.cpu_seconds} s)",
                     "SIGXFSZ": f" (file size limit, {limits.file_mb} MB)"}
            return f"killed by {name}{limit.get(name, '')}"
        last = [line for line in self.stderr.strip().splitlines() if line.strip()]
        return f"exit {self.returncode}: {last[-1][:200]}" if last else f"exit {self.returncode}"


def _open_to_others(path: str) -> bool:
    """Whether a user other than its owner may run ``path`` (every folder above it searchable)."""
    real = Path(os.path.realpath(path))
    if not real.is_file() or not real.stat().st_mode & stat.S_IXOTH:
        return False
    return all(p.stat().st_mode & stat.S_IXOTH for p in real.parents)


def _interpreter(as_other_user: bool) -> str:
    """The Python the sandbox runs: this one's base interpreter, or, when the sandbox runs as
    another user who cannot reach it (it lies under root's home), the system's ``python3``."""
    ours = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    candidates = [str(ours), os.path.realpath(sys.executable), shutil.which("python3", path="/usr/bin:/bin") or ""]
    for candidate in candidates:
        if candidate and os.path.exists(candidate) and (not as_other_user or _open_to_others(candidate)):
            return os.path.realpath(candidate)
    raise SandboxUnavailable("the code sandbox found no Python its user may run (set reward.code.python)")


def _scratch_parent(as_other_user: bool) -> str | None:
    """Where a program's folder is made: the temp dir, or — when the program runs as another user
    who cannot reach that one (a private ``TMPDIR``: some folder above it closed to others) — /tmp."""
    temp = Path(os.path.realpath(tempfile.gettempdir()))
    if not as_other_user or all(p.stat().st_mode & stat.S_IXOTH for p in (temp, *temp.parents)):
        return None
    return "/tmp"


def _nobody() -> tuple[int, int] | None:
    """The unprivileged user to run as when we are root; None when we are not (we already are one)."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


class Sandbox:
    """Runs programs (Python source) one process each; see the module docstring."""

    def __init__(self, limits: Limits | None = None, kind: str = "bwrap", python: str | None = None):
        if kind not in ("bwrap", "none"):
            raise ValueError(f"sandbox kind {kind!r}: expected 'bwrap' or 'none'")
        self.limits, self.kind = limits or Limits(), kind
        self.user = _nobody()
        # the tools, found once on the caller's PATH: the sandbox's own PATH (/usr/bin:/bin) is not
        # the one they were checked on, so the command names them by their absolute paths
        names = ("bwrap",) * (kind == "bwrap") + ("setpriv",) * (self.user is not None) + ("prlimit",)
        self.tools = {name: shutil.which(name) for name in names}
        self.python = python or _interpreter(self.user is not None)

    def check(self) -> None:
        """Raise ``SandboxUnavailable`` if a trivial program does not run in the sandbox."""
        if "bwrap" in self.tools and self.tools["bwrap"] is None:
            raise SandboxUnavailable("the code sandbox needs bubblewrap (`bwrap`), which is not installed: "
                                     "`apt-get install bubblewrap` (or reward.code.sandbox: none to run code "
                                     "without a sandbox, at your own risk)")
        for tool, path in self.tools.items():
            if path is None:
                raise SandboxUnavailable(f"the code sandbox needs `{tool}` (util-linux), which is not installed")
        run = self.run("print(6 * 7)")
        if not run.ok or run.stdout.strip() != "42":
            raise SandboxUnavailable(f"the code sandbox does not run programs: "
                                     f"{run.reason(self.limits) or run.stdout!r}")

    def _command(self, work: Path, started_fd: int, fds: tuple[int, ...] = ()) -> list[str]:
        lim = self.limits
        tool = {name: path or name for name, path in self.tools.items()}  # a missing one fails at Popen
        prlimit = [tool["prlimit"], f"--cpu={lim.cpu_seconds}:{lim.cpu_seconds + 1}", f"--as={lim.memory_mb * 2**20}",
                   f"--fsize={lim.file_mb * 2**20}", f"--nofile={lim.open_files}", "--core=0", "--"]
        python = [self.python, "-I", "-S", "-c", LAUNCHER, str(started_fd), str(lim.processes), *map(str, fds)]
        if self.user:
            prlimit = [tool["setpriv"], f"--reuid={self.user[0]}", f"--regid={self.user[1]}", "--clear-groups",
                       *prlimit]
        if self.kind == "none":
            return prlimit + python
        prefix = str(Path(self.python).parents[1])  # the interpreter's installation, read-only
        mounts = ["--ro-bind", "/usr", "/usr", "--ro-bind-try", "/bin", "/bin", "--ro-bind-try", "/lib", "/lib",
                  "--ro-bind-try", "/lib64", "/lib64", "--ro-bind-try", prefix, prefix]
        return prlimit + [tool["bwrap"], "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                          "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/work",
                          "--setenv", "LANG", "C.UTF-8", "--hostname", "sandbox",
                          *mounts, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
                          "--bind", str(work), "/work", "--chdir", "/work", "--", *python]

    def run(self, program: str, stdin: str = "") -> Execution:
        """Run Python source ``program`` with ``stdin``; what it did (``SandboxUnavailable`` if the
        sandbox itself failed)."""
        running = self.start(program, stdin)
        return running.finish(running.began + self.limits.wall_seconds)

    def start(self, program: str, stdin: str = "", fds: tuple[int, ...] = ()) -> Running:
        """Start ``program`` as ``run`` does, without waiting for it: the caller's descriptors
        ``fds`` stay open in it under the same numbers, which main.py reads from ``sys.argv[1:]``
        (the caller closes its own copies). ``Running.finish`` ends it."""
        root = Path(tempfile.mkdtemp(prefix="rftflow-sandbox-", dir=_scratch_parent(self.user is not None)))
        try:
            work = root / "work"
            work.mkdir()
            (work / "main.py").write_text(program)
            if self.user:
                os.chown(root, *self.user)
                os.chown(work, *self.user)
                os.chown(work / "main.py", *self.user)
            (root / "stdin").write_text(stdin)
            return self._start(root, work, fds)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    def _start(self, root: Path, work: Path, fds: tuple[int, ...]) -> Running:
        read_started, write_started = os.pipe()
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(work)}
        began = time.monotonic()
        try:
            with open(root / "stdin", "rb") as sin, open(root / "stdout", "wb") as out, \
                    open(root / "stderr", "wb") as err:
                # the user is dropped by setpriv, not by Popen(user=...): that would make Python fork
                # this whole process (vfork is not used with a uid change)
                proc = subprocess.Popen(self._command(work, write_started, fds), stdin=sin, stdout=out, stderr=err,
                                        cwd=work, env=env, start_new_session=True, pass_fds=(write_started, *fds))
        except OSError as e:
            os.close(read_started)
            raise SandboxUnavailable(f"the code sandbox could not start: {e}") from None
        finally:
            os.close(write_started)
        return Running(self, proc, root, read_started, began)


class Running:
    """One execution under way (``Sandbox.start``); ``finish`` waits for it and cleans up."""

    def __init__(self, sandbox: Sandbox, proc: subprocess.Popen, root: Path, read_started: int, began: float):
        self.sandbox, self.proc, self.root, self.began = sandbox, proc, root, began
        self._read_started = read_started
        self._result: Execution | SandboxUnavailable | None = None

    def finish(self, deadline: float) -> Execution:
        """What it did, once it exits or at ``deadline`` (``time.monotonic()``), when its session is
        killed (``timed_out``); ``SandboxUnavailable`` if the sandbox never started the program.
        The same answer on every call; its folder is gone after the first."""
        if self._result is None:
            try:
                self._result = self._finish(deadline)
            except SandboxUnavailable as e:
                self._result = e
            finally:
                shutil.rmtree(self.root, ignore_errors=True)
        if isinstance(self._result, SandboxUnavailable):
            raise self._result
        return self._result

    def _finish(self, deadline: float) -> Execution:
        proc, limits, kind = self.proc, self.sandbox.limits, self.sandbox.kind
        try:
            timed_out = not _exited_within(proc, max(0.0, deadline - time.monotonic()))
        finally:
            _kill_session(proc)  # whatever it left behind (a daemonised child with kind none)
            proc.wait()
            started = _read_all(self._read_started)
        stdout, stderr = (_head(self.root / name) for name in ("stdout", "stderr"))
        if not started and not timed_out:
            detail = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"
            raise SandboxUnavailable(f"the code sandbox could not set up ({kind}): {detail}")
        returncode = proc.returncode
        if kind == "bwrap" and returncode > 128:
            returncode = 128 - returncode  # bwrap exits 128 + s for a program killed by signal s
        return Execution(returncode, stdout, stderr, timed_out, time.monotonic() - self.began)


def _exited_within(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether ``proc`` exits within ``seconds``: waits on its pidfd, so the answer comes the moment
    it exits (``Popen.wait(timeout)`` polls with sleeps of up to 50 ms)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (an old kernel): Popen's own polling
        try:
            proc.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _read_all(fd: int) -> bytes:
    chunks = []
    try:
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(OUTPUT_BYTES).decode("utf-8", errors="replace")


class SandboxPool:
    """Runs many programs on ``workers`` sandboxes at once (default: one per core): each is its own
    process, so threads only wait on them."""

    def __init__(self, sandbox: Sandbox, workers: int | None = None):
        self.sandbox = sandbox
        self.workers = workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="rftflow-sandbox")

    def map(self, programs: list[str], stdins: list[str] | None = None) -> list[Execution | SandboxUnavailable]:
        """Each program's ``Execution``, in order; a program the sandbox failed to run gets its
        ``SandboxUnavailable`` instead (returned, not raised: the others' results stand)."""
        stdins = stdins or [""] * len(programs)
        return self.each(lambda args: self.sandbox.run(*args), list(zip(programs, stdins)))

    def each(self, run: Callable[[T], R], items: list[T]) -> list[R | SandboxUnavailable]:
        """``run(item)`` for each item on the pool's workers, in order; where the sandbox failed,
        its ``SandboxUnavailable`` (returned, not raised)."""

        def one(item: T) -> R | SandboxUnavailable:
            try:
                return run(item)
            except SandboxUnavailable as e:
                return e

        return list(self._pool.map(one, items))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
