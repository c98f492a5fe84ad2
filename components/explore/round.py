"""``ExploreRound``: explore's stage of a round — which tasks (the task selector, a mixture's quotas),
each task's workflow, the groups of responses staged in the store (``staging/round=N/rollouts``),
dynamic sampling (DAPO: more task batches while too few groups are informative) and, with several
explorer processes (``explorer.shards`` > 1), shard leases, the commit of the shards this process
holds and the take-over of dead explorers' shards. An explorer alone waits here for the weights a
round needs. The expert demonstrations of ``prepare`` come from the same workflows (``expert_rows``).

Its dependencies come in explicitly (``campaign.stages`` wires them): the store, the engine, the
workflows, the train tasks and pass rates (as callables: they are read lazily), the scorer that
dynamic sampling needs (verify's, passed in: explore does not import verify) and ``settle``, which
verifies and commits a shard taken over. Waits take ``wait(ready, what, most=...)``
(``stopping.wait_until`` with the campaign's stop flag and timeout).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from rftflow.components.buffer.commit import commit_shards
from rftflow.components.buffer.leases import Lease, ShardLeases, shard_slice
from rftflow.components.buffer.selectors import PassRates, mixture_quotas, select_tasks
from rftflow.components.config import CampaignConfig
from rftflow.components.data.groups import informative_groups
from rftflow.components.data.tasksets import Task, by_part
from rftflow.components.explore.workflows import table_episode_metrics


class ExploreRound:
    """Explore's stage, for one campaign. ``workflow`` runs the tasks of a campaign without a
    mixture, ``workflows`` each mixture part's (by part name, with ``parts`` their weights)."""

    def __init__(self, cfg: CampaignConfig, store, engine, workflow, workflows: dict[str, Any],
                 parts: dict[str, float], *, train_tasks: Callable[[], list[Task]],
                 pass_rates: Callable[[], PassRates], score: Callable[[pa.Table], pa.Table],
                 dynamic_sampling: bool, leases: ShardLeases | None,
                 settle: Callable[[int], None] | None = None):
        self.cfg, self.store, self.engine = cfg, store, engine
        self.workflow, self.workflows, self.parts = workflow, workflows, parts
        self.train_tasks, self.pass_rates, self.score = train_tasks, pass_rates, score
        self.dynamic_sampling, self.leases, self.settle = dynamic_sampling, leases, settle
        self.held: dict[int, list[Lease]] = {}  # the shards this process explored in each round
        self.first_open = 1  # the oldest round that may have shards left to commit (``take_over``)

    def explore(self, round_no: int, version: int) -> dict[str, float]:
        """Sample the round's tasks and generate ``repeat_times`` responses each with the explorer's
        weights of ``version`` → staging/rollouts; its metrics.

        With dynamic sampling (DAPO), further task batches are explored while fewer than
        ``tasks_per_round`` groups have unequal rewards (at most ``explorer.max_explore_batches``).
        """
        if self.leases is not None:
            return self._explore_shards(round_no, version)
        ex = self.cfg.explorer
        torch.manual_seed(self.cfg.seed * 1_000_003 + round_no)
        tables, batches, in_env = [], 0, 0.0
        rates = self.pass_rates() if ex.task_selector == "curriculum" else None
        while True:
            batch_tables, batch_env = self._generate(self.select(round_no, batches, rates), round_no, version,
                                                     batches * ex.tasks_per_round)
            tables, in_env, batches = tables + batch_tables, in_env + batch_env, batches + 1
            if not self.dynamic_sampling or batches == ex.max_explore_batches:
                break
            if informative_groups(self.score(pa.concat_tables(tables))) >= ex.tasks_per_round:
                break
        table = pa.concat_tables(tables)
        self.store.write_staging(round_no, "rollouts", table)
        lengths = pc.list_value_length(table.column("response_ids"))
        batched = {"rollout/batches": batches} if self.dynamic_sampling else {}  # else always 1
        return {"explore/rows": table.num_rows, **batched,
                "rollout/response_len": pc.mean(lengths).as_py() or 0.0, **table_episode_metrics(table),
                **({"time/environment_s": in_env} if self.cfg.workflows() != {"single_turn"} else {})}

    def await_weights(self, weights, needed: int, round_no: int, wait: Callable[..., None]) -> None:
        """An explorer alone: wait until ``weights`` (an ``explore.sync.StoreWeightSync``) pulls
        version ``needed``; meanwhile take over earlier shards whose explorer died (the trainer waits
        for them)."""
        def arrived() -> bool:
            if self.leases is not None:
                self.take_over(round_no - 1, weights.version)
            return weights.pull() >= needed

        wait(arrived, f"weights of version >= {needed} (the trainer's)")

    def staged(self, round_no: int) -> pa.Table | None:
        """The rollouts this process staged in ``round_no`` (with several explorer processes, of the
        shards it holds; None when the others hold every shard)."""
        if self.leases is None:
            return self.store.read_staging(round_no, "rollouts")
        if held := self.held.get(round_no):
            return pa.concat_tables([self.store.read_staging(round_no, "rollouts", lease.shard) for lease in held])
        return None

    def _explore_shards(self, round_no: int, version: int) -> dict[str, float]:
        """One of several explorer processes: each shard of the round that nobody holds is leased,
        explored and staged (``staging`` part = the shard), until none is left for this process;
        the shards it holds go on to verify and buffer. Shards of earlier rounds whose explorer died
        (their lease expired) are redone first (``take_over``)."""
        taken = self.take_over(round_no - 1, version)
        tasks = self.select(round_no, 0, None)
        held, rows = self.held.setdefault(round_no, []), 0
        for shard in range(self.cfg.explorer.shards):
            if self.store.round_committed(round_no, shard) or any(lease.shard == shard for lease in held):
                continue
            lease = self.leases.acquire(round_no, shard)
            if lease is not None:
                rows += self._explore_shard(round_no, shard, tasks, version).num_rows
                held.append(lease)
        return {"explore/rows": rows, "explore/shards": len(held), "explore/shards_taken_over": taken}

    def buffer_shards(self, round_no: int, verified: pa.Table | None, version: int, *, last: bool,
                      wait: Callable[..., None]) -> dict[str, float]:
        """Buffer's stage for one of several explorer processes: the shards it holds committed
        (``commit_held``). The round's other shards are not waited for (the next round's free shards
        go to whichever explorer is free first), except after the ``last`` round: then every round's
        shards are waited for, and any whose explorer died is redone here (``explorer.lease_seconds``).
        Pass rates are not kept (each process sees only its shards)."""
        accepted, taken = self.commit_held(round_no, verified), 0
        if last:
            def all_committed() -> bool:
                nonlocal taken
                taken += self.take_over(round_no, version)
                return self.first_open > round_no

            # looked at often: the other shards end about when this one did
            wait(all_committed, "the other explorer processes' last shards", most=0.05)
        return {"buffer/usual_rows": accepted, "buffer/shards_taken_over": taken}

    def commit_held(self, round_no: int, verified: pa.Table | None) -> int:
        """The shards this process holds in ``round_no`` committed (``buffer.commit.commit_shards``)
        with their ``verified`` rows; the rows accepted."""
        return commit_shards(self.store, self.leases, self.held.pop(round_no, []), round_no, verified,
                             tasks_per_round=self.cfg.explorer.tasks_per_round, shards=self.cfg.explorer.shards)

    def take_over(self, last_round: int, version: int) -> int:
        """Redo here — explore, then ``settle`` (verify, commit) — each shard of rounds up to
        ``last_round`` that is not committed and whose lease expired (its explorer died) or was never
        taken; how many. Rounds known to be whole are not looked at again."""
        taken = 0
        while self.first_open <= last_round and self.store.round_committed(self.first_open):
            self.first_open += 1
        for round_no in range(self.first_open, last_round + 1):
            for shard in range(self.cfg.explorer.shards):
                if self.store.round_committed(round_no, shard):
                    continue
                lease = self.leases.acquire(round_no, shard)
                if lease is None:  # its explorer is alive
                    continue
                self._explore_shard(round_no, shard, self.select(round_no, 0, None), version)
                self.held[round_no] = [lease]
                self.settle(round_no)
                taken += 1
        return taken

    def _explore_shard(self, round_no: int, shard: int, tasks: list[Task], version: int) -> pa.Table:
        """Shard ``shard``'s slice of the round's ``tasks`` explored (seeded by round and shard) → staging."""
        ex = self.cfg.explorer
        torch.manual_seed(self.cfg.seed * 1_000_003 + round_no + 7_919 * shard)
        part = shard_slice(len(tasks), ex.shards, shard)
        table = pa.concat_tables(self._generate(tasks[part.start:part.stop], round_no, version, part.start)[0])
        self.store.write_staging(round_no, "rollouts", table, part=shard)
        return table

    def _generate(self, tasks: list[Task], round_no: int, version: int,
                  first_slot: int) -> tuple[list[pa.Table], float]:
        """``tasks`` explored by their workflows with weights of ``version``, the groups numbered from
        slot ``first_slot`` in order; the workflows' tables and their seconds in environments."""
        ex, tables, slot, in_env = self.cfg.explorer, [], first_slot, 0.0
        for workflow, some in self.by_workflow(tasks):
            tables.append(workflow.explore(
                self.engine, some, campaign=self.cfg.name, round_no=round_no, repeat_times=ex.repeat_times,
                temperature=ex.temperature, max_new_tokens=ex.max_new_tokens, model_version=version,
                first_slot=slot))
            slot, in_env = slot + len(some), in_env + workflow.env_wall_seconds
        return tables, in_env

    def select(self, round_no: int, batch: int, rates: PassRates | None) -> list[Task]:
        """The round's tasks (refill ``batch``): ``explorer.tasks_per_round`` by the task selector; in a
        mixture each part's share by its weight (``mixture_quotas``), each part selected on its own."""
        ex = self.cfg.explorer
        pick = functools.partial(select_tasks, selector=ex.task_selector, batch=batch, pass_rates=rates,
                                 target=ex.curriculum_target)
        if not self.parts:
            return pick(self.train_tasks(), round_no, ex.tasks_per_round, self.cfg.seed)
        quotas = mixture_quotas(self.parts, ex.tasks_per_round)
        return [t for name, k in quotas.items() if k
                for t in pick(self.part_train[name], round_no, k, f"{self.cfg.seed}:{name}")]

    @functools.cached_property
    def part_train(self) -> dict[str, list[Task]]:
        """A mixture's train tasks by part."""
        train = self.train_tasks()
        return {name: [train[i] for i in rows] for name, rows in by_part(train).items()}

    def expert_rows(self, tasks: list[Task]) -> pa.Table:
        """The expert demonstrations of ``tasks`` (``taskset.expert_tasks`` of them; 0: all), each by
        its workflow."""
        limit = self.cfg.taskset.expert_tasks or None
        return pa.concat_tables([workflow.expert_table(self.engine, some, campaign=self.cfg.name, limit=limit)
                                 for workflow, some in self.by_workflow(tasks)])

    def by_workflow(self, tasks: list[Task]) -> list[tuple[Any, list[Task]]]:
        """``tasks`` grouped by the workflow that runs them (a mixture part's, else the campaign's), in order."""
        return [(self.workflows[name] if self.parts else self.workflow, [tasks[i] for i in rows])
                for name, rows in by_part(tasks).items()]
