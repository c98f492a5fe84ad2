"""A pool of OpenAI-compatible rollout servers (``vllm serve`` replicas) behind one engine.

Requests go to the live replica with the fewest outstanding requests (ties: the one that has
served fewest), so a slow or busy replica gets less work than blind round-robin would give it.
A replica that fails at the transport level (refused, reset, closed mid-answer: the server died)
is marked down and the request is sent again to another: each request's answer is kept once, so
nothing is lost or duplicated. A replica that hangs (accepts, never answers: a frozen server) is
found by its ``/health``: while a request or sync waits on it, the replica is asked every
``HEALTH_SECONDS``, and one that does not answer within ``HEALTH_TIMEOUT`` is marked down the same
way (the request is sent again; its late answer, if one comes, is dropped). vLLM answers
``/health`` while it generates, so a busy replica is not a hung one.

A sync goes to every live replica; a replica that is down is asked ``/health`` again at most
every ``REVIVE_SECONDS`` and, once it answers, gets the newest sync again before it serves (a
restarted server starts from the model directory's weights).

vLLM's own data-parallel serving (``--data-parallel-size``) is one server with several engine
processes on one node: it dies as a whole, and its ``/collective_rpc`` weight reload reaches
them together. Independent servers behind this pool fail one at a time and may run on other
machines, which is what failover and scale-out need.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import httpx

from rftflow.components.secrets import redact_url

log = logging.getLogger("rftflow")
REVIVE_SECONDS = 5.0  # how often a replica that is down is asked whether it is back
HEALTH_SECONDS = 10.0  # how long a request waits on a replica before the replica is asked /health (and again)
HEALTH_TIMEOUT = 5.0  # a replica that does not answer /health in this long is hung: marked down
REQUESTS_PER_REPLICA = 2  # a round's prompts are cut into this many requests per live replica (with several)

T = TypeVar("T")
Sync = Callable[["Replica"], None]  # brings one replica to the newest weights (the last sync, replayed)


class ServersDown(RuntimeError):
    """No replica of the pool answers; the message names each and why, in one line."""


class Hung(httpx.TransportError):
    """A replica that accepted a request and answers neither it nor ``/health``."""


class Replica:
    """One server of the pool: its client, outstanding requests, and whether it is up."""

    def __init__(self, url: str, timeout: float):
        self.client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self.url = redact_url(url.rstrip("/"))  # for messages: never a user:password@ part
        self.outstanding = 0  # requests sent and not answered
        self.served = 0  # requests answered
        self.up = True
        self.failure: str | None = None  # why it is down
        self.probed_at = 0.0  # monotonic time of the last /health asked while down

    def post(self, path: str, body: dict) -> httpx.Response:
        return self.client.post(path, json=body)

    def unhealthy(self, timeout: float) -> str | None:
        """Why ``/health`` does not say this replica is up within ``timeout`` s; None if it does."""
        try:
            status = self.client.get("/health", timeout=timeout).status_code
        except httpx.TransportError as e:
            return f"no answer to /health within {timeout:.0f} s ({type(e).__name__})"
        return None if status == 200 else f"/health answered HTTP {status}"

    def watched(self, call: Callable[[], T]) -> T:
        """``call()`` (a request to this replica), in a thread of its own while this one asks
        ``/health`` every ``HEALTH_SECONDS`` it waits; ``Hung`` when the health check gets no 200
        answer (the call is left behind: whatever it returns later is dropped)."""
        done, outcome = threading.Event(), {}

        def run() -> None:
            try:
                outcome["value"] = call()
            except BaseException as e:  # handed to the waiting thread
                outcome["error"] = e
            done.set()

        threading.Thread(target=run, name="rftflow-request", daemon=True).start()
        waited = 0.0
        while not done.wait(HEALTH_SECONDS):
            waited += HEALTH_SECONDS
            failed = self.unhealthy(HEALTH_TIMEOUT)
            if failed and not done.is_set():  # (the request may have been answered meanwhile)
                raise Hung(f"{failed} after a request waited {waited:.0f} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


class ServerPool:
    """Replicas at ``urls``: ``complete`` spreads requests, ``sync`` reaches every live replica."""

    def __init__(self, urls: Sequence[str], timeout: float = 600.0):
        if not urls:
            raise ValueError("a server pool needs at least one URL")
        self.replicas = [Replica(u, timeout) for u in urls]
        self._lock = threading.Lock()
        self._last_sync: Sync | None = None  # replayed on a replica that comes back
        self._threads: ThreadPoolExecutor | None = None

    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.up]

    def requests_for(self, prompts: int, most: int) -> int:
        """Prompts per request: at most ``most``; with several live replicas, small enough that each
        gets ``REQUESTS_PER_REPLICA`` (one replica: as before, one request per ``most`` prompts)."""
        live = max(1, len(self.live))
        if len(self.replicas) == 1:
            return max(1, most)
        return max(1, min(most, math.ceil(prompts / (live * REQUESTS_PER_REPLICA))))

    def complete(self, path: str, bodies: list[dict], only: Replica | None = None) -> list[dict]:
        """The JSON answers to ``bodies`` posted to ``path``, in order, each answered once by some
        live replica (or by ``only``)."""
        self.revive()
        if len(bodies) == 1 or len(self.replicas) == 1:
            return [self._answer(path, body, only) for body in bodies]
        if self._threads is None:
            self._threads = ThreadPoolExecutor(4 * len(self.replicas), thread_name_prefix="rftflow-rollout")
        return list(self._threads.map(lambda body: self._answer(path, body, only), bodies))

    def _answer(self, path: str, body: dict, only: Replica | None) -> dict:
        """``body``'s answer from the least-loaded live replica; a replica that fails in transit is
        marked down and the body goes to another."""
        while True:
            replica = self._take(only)
            try:
                response = replica.watched(functools.partial(replica.post, path, body))
            except httpx.TransportError as e:
                self._down(replica, e)
                if only is not None:
                    raise ServersDown(f"rollout server {replica.url} is down ({replica.failure})") from None
                continue
            finally:
                with self._lock:
                    replica.outstanding -= 1
            if response.status_code != 200:
                raise RuntimeError(f"{replica.url}{path}: HTTP {response.status_code}: {response.text[:300]}")
            with self._lock:
                replica.served += 1
            return response.json() if response.content else {}

    def _take(self, only: Replica | None) -> Replica:
        """``only``, or the live replica with the fewest outstanding requests; counted outstanding."""
        with self._lock:
            live = self.live if only is None else [only] if only.up else []
            if not live:
                raise self._all_down()
            replica = min(live, key=lambda r: (r.outstanding, r.served))
            replica.outstanding += 1
            return replica

    def _down(self, replica: Replica, error: BaseException) -> None:
        with self._lock:
            if not replica.up:  # another request to it failed first
                return
            detail = (str(error).splitlines() or [""])[0][:120]  # a reset connection's error may say nothing
            replica.up, replica.failure = False, f"{type(error).__name__}: {detail}" if detail else type(error).__name__
            replica.probed_at = time.monotonic()
            left = len(self.live)
        if left:
            log.warning("rollout server %s is down (%s); its requests go to the %d other(s)", replica.url,
                        replica.failure, left)

    def _all_down(self) -> ServersDown:
        return ServersDown("every rollout server is down: " + "; ".join(f"{r.url} ({r.failure})"
                                                                         for r in self.replicas))

    def revive(self) -> None:
        """Ask each replica that is down (at most every ``REVIVE_SECONDS``) whether it is back; one
        that is gets the newest sync again, then serves."""
        for replica in self.replicas:
            if replica.up or time.monotonic() - replica.probed_at < REVIVE_SECONDS:
                continue
            replica.probed_at = time.monotonic()
            if replica.unhealthy(timeout=2.0):
                continue
            try:
                if self._last_sync is not None:
                    replica.watched(functools.partial(self._last_sync, replica))
            except httpx.TransportError:
                continue
            with self._lock:
                replica.up, replica.failure = True, None
            log.info("rollout server %s is back, synced to the newest weights", replica.url)

    def sync(self, each: Sync) -> None:
        """``each(replica)`` on every live replica (a replica that fails in transit is marked
        down, and gets it again when it is back); kept to replay on a replica that comes back.
        ``ServersDown`` if none took it."""
        self._last_sync = each
        for replica in self.live:
            try:
                replica.watched(functools.partial(each, replica))
            except httpx.TransportError as e:  # Hung too
                self._down(replica, e)
        if not self.live:
            raise self._all_down()
