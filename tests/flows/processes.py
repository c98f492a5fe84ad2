"""The processes of a run, read from ``/proc``: its process group and its descendants (the
embedded Prefect server runs in a session of its own), and whether they are gone.

    pids = family(run.proc.pid)          # before the signal: the CLI, its Prefect server, trainer ranks, ...
    run.interrupt()
    assert not outliving(pids)           # after the exit: none of them still runs
"""

from __future__ import annotations

import time
from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, process group) of ``pid``, None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2])


def group_pids(pgid: int) -> set[int]:
    """The live processes whose process group is ``pgid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[1] == pgid and stat[0] != "Z":
            found.add(int(entry.name))
    return found


def family(pid: int) -> set[int]:
    """``pid``, the live processes of its process group (``pid`` leads it) and all its descendants."""
    import psutil

    try:
        descendants = {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        descendants = set()
    return {pid} | group_pids(pid) | descendants


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an ended process nobody reaped yet)."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def outliving(pids: set[int], bound: float = 120.0) -> set[int]:
    """Those of ``pids`` still running once all are gone or ``bound`` seconds passed (a generous
    bound: the assert is on the pids, not on how fast they went)."""
    deadline = time.monotonic() + bound
    while (alive := {p for p in pids if running(p)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive
