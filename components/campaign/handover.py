"""Verify's stage and buffer's, joined: a round's verified rows go from one to the other in memory,
kept until buffer has stored them (so a retried buffer still has them), and a shard taken over from
a dead explorer process is settled — verified, then committed — in one call.

Verify's work is ``verify.stage.verify_round``, buffer's ``buffer.commit.buffer_round`` (one
explorer) or ``ExploreRound.buffer_shards`` (several explorer processes, which hold the leases).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from rftflow.components.buffer.commit import buffer_round
from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.config import CampaignConfig
from rftflow.components.data.report import ValidationLog
from rftflow.components.data.tasksets import Task
from rftflow.components.explore.round import ExploreRound
from rftflow.components.verify.rewards import RewardFn
from rftflow.components.verify.stage import verify_round


class Handover:
    """``verify(r)`` then ``buffer(r)``; ``verified[r]`` holds the rows between them (None: the
    other explorer processes hold every shard of round ``r``). ``version()`` is the explorer's
    weight version (rows of a newer model are bad); ``trains``: this process's trainer keeps the
    usual rows in memory."""

    def __init__(self, cfg: CampaignConfig, store: ExperienceStore, validation: ValidationLog,
                 explorer: ExploreRound, *, tasks_by_id: Callable[[], dict[str, Task]], reward_fn: RewardFn,
                 version: Callable[[], int], trains: bool, wait: Callable[..., None]):
        self.cfg, self.store, self.validation, self.explorer = cfg, store, validation, explorer
        self.tasks_by_id, self.reward_fn, self.version, self.trains, self.wait = (tasks_by_id, reward_fn, version,
                                                                                   trains, wait)
        self.verified: dict[int, pa.Table | None] = {}

    def verify(self, round_no: int) -> dict[str, float]:
        """``verify_round`` on the rollouts this process staged; their verified rows kept for buffer."""
        rollouts = self.explorer.staged(round_no)
        if rollouts is None:
            self.verified[round_no] = None
            return {}
        self.verified[round_no], metrics = verify_round(self.cfg, self.store, self.validation, round_no, rollouts,
                                                        self.tasks_by_id(), self.reward_fn, self.version())
        return metrics

    def buffer(self, round_no: int) -> dict[str, float]:
        """``buffer_round``, or with several explorer processes ``ExploreRound.buffer_shards``; verify's
        rows let go once stored."""
        verified = self.verified.get(round_no)
        if self.explorer.leases is not None:
            self.verified.pop(round_no, None)
            return self.explorer.buffer_shards(round_no, verified, self.version(),
                                               last=round_no == self.cfg.rounds, wait=self.wait)
        if verified is None:
            raise RuntimeError(f"round {round_no}: buffer runs after verify in the same process (its verified rows "
                               "are handed over in memory)")
        metrics = buffer_round(self.store, round_no, verified, trains=self.trains)
        del self.verified[round_no]
        return metrics

    def settle(self, round_no: int) -> None:
        """A shard taken over (``ExploreRound.take_over``), verified and committed here."""
        self.verify(round_no)
        self.explorer.commit_held(round_no, self.verified.pop(round_no, None))
