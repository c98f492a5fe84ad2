"""A stop asked for, and the waits that heed it.

``StopFlag`` carries why a campaign should stop at its next safe point (a signal handler or a
watcher thread sets it); stages look at it between their steps and raise ``StopRequested``.
``wait_until`` polls for the other process of a campaign (an explorer's round, a trainer's weights)
with back-off, ends at a stop, and times out in one line. Every room may import this one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_MAX_SECONDS = 0.5  # the longest pause between two looks at the store while waiting for the other process


class StopRequested(Exception):
    """The campaign was asked to stop (a signal, a cancel in Prefect) and stopped at a safe point;
    the message says where."""


class StopFlag:
    """Why the campaign should stop at its next safe point: a signal's name or a cancel (set by a
    signal handler or a watcher thread); None: go on. Checked between stages, between warm-start
    steps and while waiting for the other process."""

    def __init__(self) -> None:
        self.reason: str | None = None


def wait_until(ready: Callable[[], bool], what: str, *, stop: StopFlag, timeout: float, where: str,
               most: float = POLL_MAX_SECONDS) -> None:
    """Poll ``ready()`` until true, every 2 ms at first and then twice as long each time up to
    ``most`` seconds (a round of the other process can take milliseconds; a long wait should not
    hammer the store); ``StopRequested`` when ``stop`` is set; ``TimeoutError`` naming ``what`` and
    ``where`` (the store) after ``timeout`` seconds."""
    start, pause = time.monotonic(), 0.002
    while not ready():
        if stop.reason:
            raise StopRequested(f"stopped ({stop.reason}) while waiting for {what}")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"waited {timeout:.0f} s for {what} in {where}: "
                               "is the other process (`rftflow run --mode explore|train`) running?")
        time.sleep(pause)
        pause = min(2 * pause, most)
