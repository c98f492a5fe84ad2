"""A campaign's durable state in its store: what it is, how far it got, where to resume.

``CampaignState`` is one JSON document: the config (and its fingerprint), the status, the last
completed round and stage, the weight version, the last checkpoint, held-out accuracies, the
MLflow run id, and every attempt (Prefect flow-run id, process, start, end, error).

It is written with the commit protocol of the store: every update is a new generation
``state/campaign/gNNNNNNNN.json`` (``state/explorer/`` for an explorer process of its own)
created put-if-absent, so a reader sees whole documents only,
and two processes updating one campaign at once cannot both win a generation (the loser gets
``StateConflict``). Readers take the highest generation; older ones are pruned to the last few.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rftflow.components.buffer.store import ObjectStore
from rftflow.components.config import ConfigError, Mode, flatten
from rftflow.components.version import VERSION

STATUSES = ("running", "finished", "failed", "interrupted")
KEEP_GENERATIONS = 20
# Keys that say how to reach or keep things, not what the campaign computes: changing them on a
# run dir does not make it another campaign.
OPERATIONAL_KEYS = ("storage.max_attempts", "storage.checksum", "storage.outage_seconds", "storage.write_behind",
                    "checkpoint.keep_last", "checkpoint.keep_best", "sync.timeout_seconds", "sync.check",
                    "sync.check_logprobs_every", "sync.logprob_tolerance", "explorer.base_url",
                    "explorer.lease_seconds", "bench.models", "threads", "bench.tasksets", "promotion.margin", "promotion.alpha",
                    "promotion.min_accuracy", "retention.keep_rounds", "retention.after_campaign",
                    "trainer.warmup_checkpoint_every", "trainer.warmup_checkpoint_minutes")
OPERATIONAL_SECTIONS = ("orchestration",)  # how the steps are run: every key in it


def operational(key: str) -> bool:
    return key in OPERATIONAL_KEYS or key.split(".")[0] in OPERATIONAL_SECTIONS


class StateConflict(RuntimeError):
    """Another process wrote the campaign's state since this one last read it."""


class AlreadyRunning(ConfigError):
    """Another live attempt holds the campaign: refused before any work (exit 2)."""


class FinishedMeanwhile(Exception):
    """The campaign finished in another process between this one's preflight and its claim (two
    starts at once): nothing to do, as for a start on a finished campaign."""

    def __init__(self, state: CampaignState):
        super().__init__(f"campaign {state.campaign!r} finished in another process")
        self.state = state


def running_line(state: CampaignState) -> str:
    """Why a start is refused while ``state``'s last attempt is alive, in one line."""
    last = state.attempt
    return (f"campaign {state.campaign!r} is running now (pid {last.pid} on {last.host}, last written "
            f"{time.time() - state.heartbeat:.0f} s ago): wait for it, or stop it first")


def fingerprint(config: dict[str, Any]) -> str:
    """sha256 of the config's keys and values that decide what the campaign computes."""
    kept = {k: v for k, v in flatten(config).items() if not operational(k)}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key (old → new)`` for each key whose value differs, operational keys aside, after the old
    config's moved keys are put in their new places (``config.migrated``). A key the old config
    lacks (added by a newer rftflow) that holds its default is no change, nor is a key this version
    no longer has: a campaign started before an upgrade resumes after it."""
    from rftflow.components.config import CampaignConfig, known_key, migrated

    a, b = flatten(migrated(old)), flatten(new)
    defaults = flatten(CampaignConfig().model_dump(mode="json"))
    return [f"{k} ({a.get(k)!r} → {b.get(k)!r})" for k in sorted(set(a) | set(b))
            if not operational(k) and a.get(k) != b.get(k)
            and not (k not in a and k in defaults and b.get(k) == defaults[k])
            and not (k not in b and not known_key(k))]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Attempt:
    """One process that worked on the campaign."""

    flow_run_id: str | None
    pid: int
    host: str
    started_at: str
    ended_at: str | None = None
    outcome: str | None = None  # finished | failed | interrupted | killed (seen by the next attempt); None: running
    error: str | None = None
    version: str | None = None  # the rftflow that ran it (rftflow.__version__; None: before 0.2)


@dataclass
class CampaignState:
    campaign: str
    fingerprint: str
    config: dict[str, Any]
    status: str = "running"
    round: int = 0  # the last round whose stage below completed (0: before the rounds)
    stage: str | None = None  # the last completed stage of that round (prepare, warm_start, explore, …)
    rounds_done: int = 0  # rounds whose every stage completed
    weight_version: int = 0
    checkpoint: str | None = None  # key prefix of the newest committed checkpoint
    checkpoint_round: int | None = None
    evals: dict[str, float] = field(default_factory=dict)  # held-out accuracy by round ("0" = before)
    mlflow_run_id: str | None = None
    model_version: str | None = None  # registered at the end
    attempts: list[Attempt] = field(default_factory=list)
    error: str | None = None  # the last error, one line
    heartbeat: float = 0.0  # time.time() of the last write
    updated_at: str = ""

    @property
    def attempt(self) -> Attempt:
        return self.attempts[-1]

    def alive_elsewhere(self, lease_seconds: float = 300.0) -> bool:
        """Whether the last attempt may still be running in another process: it has not ended, and
        its process is alive on this host, or it wrote within ``lease_seconds`` on another host."""
        if self.status != "running" or not self.attempts or self.attempt.ended_at:
            return False
        last = self.attempt
        if last.host == socket.gethostname():
            return last.pid != os.getpid() and _pid_alive(last.pid)
        return time.time() - self.heartbeat < lease_seconds

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CampaignState:
        data = dict(data)
        data["attempts"] = [Attempt(**a) for a in data.get("attempts", [])]
        return cls(**data)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


class StateStore:
    """Generations of one campaign's state under ``<campaign>/state/<role>/``: ``campaign`` for the
    process that trains (modes both, async, train), ``explorer`` for an explorer alone (mode explore)."""

    def __init__(self, store: ObjectStore, campaign: str, role: str = "campaign"):
        self.objects, self.prefix = store, f"{campaign}/state/{role}/"
        self.generation: int | None = None  # of the last document read or written here

    def _key(self, generation: int) -> str:
        return f"{self.prefix}g{generation:08d}.json"

    def _generations(self) -> list[int]:
        return sorted(int(k[len(self.prefix) + 1:-5]) for k in self.objects.list(self.prefix) if k.endswith(".json"))

    def read(self) -> CampaignState | None:
        """The newest state, or None for a campaign that never started."""
        generations = self._generations()
        self.generation = generations[-1] if generations else 0
        if not generations:
            return None
        return CampaignState.from_json(json.loads(self.objects.get(self._key(self.generation))))

    def write(self, state: CampaignState) -> None:
        """Commit ``state`` as the next generation; ``StateConflict`` if another process took it."""
        if self.generation is None:
            self.read()
        state.heartbeat, state.updated_at = time.time(), now()
        data = json.dumps(state.to_json(), sort_keys=True, indent=1).encode()
        key = self._key(self.generation + 1)
        if not self.objects.put(key, data, if_absent=True) and self.objects.get(key) != data:
            raise StateConflict(f"campaign {state.campaign}: another process wrote its state ({key}); "
                                "run one process per campaign (see `rftflow status`)")
        self.generation += 1
        old = self.generation - KEEP_GENERATIONS
        if old >= 1:
            self.objects.delete(self._key(old))


def claim(states: StateStore, campaign: str, config: dict[str, Any], flow_run_id: str | None
          ) -> tuple[CampaignState, list[Attempt]]:
    """Start an attempt: the newest state (a new one for a campaign that never ran) with this
    process's attempt appended, written as the next generation. Refused (``AlreadyRunning``, nothing
    written) while another attempt is alive, or when a rival's write took that generation first: of
    several processes started at once, one holds the campaign; ``FinishedMeanwhile`` when a rival
    finished it since the preflight read it. Returns (state, attempts found unfinished: their
    processes were killed)."""
    state = states.read() or CampaignState(campaign=campaign, fingerprint=fingerprint(config), config=config)
    if state.status == "finished":  # a restart moved a finished one aside before this
        raise FinishedMeanwhile(state)
    if state.alive_elsewhere():
        raise AlreadyRunning(running_line(state))
    killed = [a for a in state.attempts if a.outcome is None]  # they never recorded an end
    for attempt in killed:
        attempt.outcome = "killed"
    state.status, state.error = "running", None
    state.attempts.append(Attempt(flow_run_id, os.getpid(), socket.gethostname(), now(), version=VERSION))
    try:
        states.write(state)
    except StateConflict:
        rival = states.read()
        raise AlreadyRunning(running_line(rival) if rival and rival.attempts
                             else f"campaign {campaign!r} was started by another process at the same time") from None
    return state, killed


def tracked_attempts(tracking_uri: str, experiment: str, run_name: str) -> list[str]:
    """The MLflow runs of ``run_name`` in ``experiment`` (``tracking.campaign_runs``) that no restart
    moved aside (tag ``rftflow.moved_aside``), oldest first: the attempts a tracking store remembers
    of a campaign in one run dir. A run dir's own SQLite store that does not exist remembers none
    (nothing is made)."""
    if tracking_uri.startswith("sqlite:///") and not Path(tracking_uri.removeprefix("sqlite:///")).is_file():
        return []
    from mlflow import MlflowClient

    from rftflow.components.tracking import campaign_runs

    try:
        client = MlflowClient(tracking_uri)
        experiment_found = client.get_experiment_by_name(experiment)
        if experiment_found is None:
            return []
        runs = campaign_runs(client, experiment_found.experiment_id, run_name)
    except Exception as e:  # noqa: BLE001 — MLflow's errors, in one line naming the store
        from rftflow.components.secrets import redact_url

        raise ValueError(f"tracking store {redact_url(tracking_uri)}: cannot read its runs: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}") from None
    return [r.info.run_id for r in runs if "rftflow.moved_aside" not in r.data.tags]


def explorer_roles(store: ObjectStore, campaign: str) -> list[str]:
    """The roles of the explorer processes that kept state in ``campaign``: ``explorer`` (one) or
    ``explorer-<hash>`` each (several, ``explorer.shards`` > 1)."""
    prefix = f"{campaign}/state/"
    roles = {key[len(prefix):].split("/", 1)[0] for key in store.list(prefix) if "/" in key[len(prefix):]}
    return sorted(r for r in roles if r == "explorer" or r.startswith("explorer-"))


def state_role(cfg, run_dir) -> str:
    """Whose state a process of config ``cfg`` in ``run_dir`` keeps: ``campaign`` (it trains),
    ``explorer`` (mode explore), ``explorer-<run dir hash>`` (one of several explorer processes,
    ``explorer.shards`` > 1: each keeps its own, found again by its run dir)."""
    if cfg.mode != Mode.EXPLORE:
        return "campaign"
    if cfg.explorer.shards == 1:
        return "explorer"
    return f"explorer-{hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:8]}"
