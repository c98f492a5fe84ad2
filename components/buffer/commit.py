"""Buffer's stage of a round: verified rows committed — accepted ones (``reason`` null) as usual
experiences, rejected ones to quarantine, the same rows — and, with several explorer processes,
each shard a process holds as its own part of the round, its lease then released.

Explicit values in, counts out: the store, the round, the verified rows (verify's, with ``reason``).
``buffer_round`` is the stage of a single explorer (pass rates kept in the store's state);
``commit_shards`` commits one of several explorer processes' shards (each sees only its own rows:
no pass rates), called by ``explore.round.ExploreRound``, which holds the leases.
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.buffer.leases import Lease, ShardLeases, shard_of_groups
from rftflow.components.buffer.selectors import PassRates, measured_rewards

log = logging.getLogger("rftflow")


def split_verified(verified: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(accepted rows without ``reason``, rejected rows with it)."""
    rejected = pc.is_valid(verified.column("reason"))
    return verified.filter(pc.invert(rejected)).drop_columns(["reason"]), verified.filter(rejected)


def commit_round(store, round_no: int, verified: pa.Table, *, keep: bool) -> int:
    """``verified`` committed to ``store``'s round ``round_no`` (usual and quarantine); ``keep``:
    the usual rows stay in memory for this process's trainer. The rows accepted."""
    accepted, rejected = split_verified(verified)
    store.write_usual(round_no, accepted, keep=keep)
    store.write_quarantine(round_no, rejected)
    return accepted.num_rows


def buffer_round(store, round_no: int, verified: pa.Table, *, trains: bool) -> dict[str, float]:
    """Buffer's stage with one explorer: ``verified`` committed (``commit_round``; ``trains``: this
    process's trainer keeps the usual rows in memory), the round's measured rewards added to the
    pass rates (``state/pass_rates.json``); an explorer process flushes, so the trainer process can
    take the round at once. Its metrics."""
    accepted = commit_round(store, round_no, verified, keep=trains)
    rates = PassRates(store.read_state("pass_rates"))
    if rates.add_round(round_no, measured_rewards(verified)):
        store.write_state("pass_rates", rates.to_state())
    if not trains:  # an explorer process: the round is the trainer process's to take now
        store.flush()
    return {"buffer/usual_rows": accepted, "tasks/mean_pass_rate": rates.mean()}


def commit_shards(store, leases: ShardLeases, held: list[Lease], round_no: int, verified: pa.Table | None,
                  *, tasks_per_round: int, shards: int) -> int:
    """Each shard of ``held`` committed as its own part of round ``round_no`` (a row's shard is its
    group's slot), unless another process took the shard over meanwhile (its rows here are then
    dropped); the leases released. The rows accepted."""
    accepted_rows = 0
    if verified is not None:
        of_row = shard_of_groups(verified.column("group_id").to_pylist(), tasks_per_round, shards)
        for lease in held:
            if not leases.still_held(lease):
                log.warning("round %d: shard %d was taken over by another explorer; its rows here are dropped",
                            round_no, lease.shard)
                continue
            accepted, rejected = split_verified(verified.filter(pa.array([s == lease.shard for s in of_row],
                                                                         pa.bool_())))
            store.write_usual(round_no, accepted, keep=False, part=lease.shard)
            store.write_quarantine(round_no, rejected, part=lease.shard)
            accepted_rows += accepted.num_rows
        store.flush()
    for lease in held:
        leases.release(lease)
    return accepted_rows
