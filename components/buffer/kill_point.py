"""A pause inside a store write, for crash tests only: with ``RFTFLOW_KILL_POINT=<point>:<key part>``
set, the process that reaches write ``point`` (``shard``: a Parquet shard's bytes are in the store,
its commit marker not yet; ``checkpoint``: a checkpoint's files are in, its manifest not yet) for a
key that contains ``<key part>`` writes that key to the file ``RFTFLOW_KILL_READY`` names and waits
there to be killed, so that a test knows where its SIGKILL lands. Without the variable: nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path


def kill_point(point: str, key: str) -> None:
    """Wait here forever when ``RFTFLOW_KILL_POINT`` names ``point`` and a part of ``key`` (see above)."""
    wanted = os.environ.get("RFTFLOW_KILL_POINT")
    if not wanted:
        return
    name, _, part = wanted.partition(":")
    if name != point or part not in key:
        return
    Path(os.environ["RFTFLOW_KILL_READY"]).write_text(f"{point} {key}\n")
    while True:
        time.sleep(60)
