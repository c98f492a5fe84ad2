"""Sampling: FIFO cursor, prioritised replay, the filters on explorer rows, the order of a
round's batch; and the task selectors."""

import random

import pyarrow as pa
import pytest

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.sampling import (
    drop_stale, first_groups, preference_pairs, stratified_order, take_fifo, take_replay,
)
from rftflow.components.data.groups import drop_zero_variance_groups, informative_groups
from rftflow.components.buffer.selectors import PassRates, select_tasks
from rftflow.components.buffer.store import open_store
from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.data.tasksets import Task


def _round(round_no: int, groups: int = 3, size: int = 2, version: int | None = None) -> pa.Table:
    return to_table(
        make_experience(experience_id=f"{round_no}-{g}-{k}", campaign="c", round=round_no, task_id=f"t{g}",
                        group_id=f"r{round_no}-g{g}", source="explorer", reward=float(k), response_ids=[1],
                        prompt_ids=[2], model_version=round_no if version is None else version)
        for g in range(groups) for k in range(size)
    )


@pytest.fixture
def store(tmp_path):
    return ExperienceStore(open_store((tmp_path / "store").as_uri()), "c")


def test_fifo_serves_each_row_once_in_order_and_only_commit_moves_the_cursor(tmp_path, store):
    store.write_usual(1, _round(1))
    store.write_usual(2, _round(2))
    rows, commit = take_fifo(store, 3)  # 3 rows → whole groups: 4 rows (2 groups of 2)
    assert rows.column("group_id").to_pylist() == ["r1-g0", "r1-g0", "r1-g1", "r1-g1"]
    again, _ = take_fifo(store, 3)  # not committed (e.g. training crashed): the same rows again
    assert again.column("experience_id").to_pylist() == rows.column("experience_id").to_pylist()
    commit()
    rest, commit = take_fifo(store)
    assert rest.column("group_id").to_pylist() == ["r1-g2"] * 2 + [f"r2-g{g}" for g in range(3) for _ in range(2)]
    commit()
    # the cursor is in the store: a new process (new store object) continues where this one stopped
    fresh = ExperienceStore(open_store((tmp_path / "store").as_uri()), "c")
    assert take_fifo(fresh)[0].num_rows == 0
    fresh.write_usual(3, _round(3))
    assert take_fifo(fresh)[0].column("round").to_pylist() == [3] * 6


def test_fifo_goes_by_round_number_past_round_9(store):
    for r in (1, 2, 9, 10, 11):  # "round=10" sorts before "round=2" as text
        store.write_usual(r, _round(r, groups=1))
    rows, _ = take_fifo(store)
    assert rows.column("round").to_pylist() == [1, 1, 2, 2, 9, 9, 10, 10, 11, 11]


class CountingLists:
    """A store that counts its listings."""

    def __init__(self, inner):
        self.inner, self.lists = inner, 0

    def list(self, prefix: str = "") -> list[str]:
        self.lists += 1
        return self.inner.list(prefix)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("write_behind", [False, True])
def test_fifo_lists_the_store_only_for_rounds_written_elsewhere(tmp_path, write_behind):
    # given a trainer's store and an explorer's, apart, on one campaign
    trainer = ExperienceStore(counted := CountingLists(open_store((tmp_path / "store").as_uri())), "c",
                            write_behind=write_behind)
    explorer = ExperienceStore(open_store((tmp_path / "store").as_uri()), "c")
    # when the rounds are written where they are read, no read lists the store
    for r in (1, 2, 3):
        trainer.write_usual(r, _round(r, groups=1))
        rows, commit = take_fifo(trainer, max_round=r)
        assert rows.column("round").to_pylist() == [r, r]
        commit()
    assert counted.lists == 0
    # and a round written by the other process is found by listing
    trainer.flush()
    explorer.write_usual(4, _round(4, groups=1))
    rows, _ = take_fifo(trainer, max_round=4)
    assert rows.column("round").to_pylist() == [4, 4] and counted.lists == 1


def test_replay_prefers_fresh_groups_decays_with_use_and_respects_the_reuse_limit(store):
    store.write_usual(1, _round(1, groups=2))
    store.write_usual(2, _round(2, groups=2))
    rng = random.Random(0)
    picks = []
    for _ in range(4):
        rows, commit = take_replay(store, 4, current_version=2, rng=rng, decay=1.5, reuse_limit=2)
        picks.append(sorted(set(rows.column("group_id").to_pylist())))
        commit()
    # priority = version − 1.5·uses: round 2 (2) first; then round 1 (1) beats used round 2 (0.5);
    # then round 2 again (0.5 > −0.5); then round 1 again; then every group is at its limit
    assert picks == [["r2-g0", "r2-g1"], ["r1-g0", "r1-g1"], ["r2-g0", "r2-g1"], ["r1-g0", "r1-g1"]]
    assert take_replay(store, 4, 2, rng, decay=1.5, reuse_limit=2)[0].num_rows == 0
    assert store.read_state("replay_uses") == {g: 2 for p in picks[:2] for g in p}


def test_replay_staleness_bound_excludes_old_versions(store):
    store.write_usual(1, _round(1, version=1))
    store.write_usual(5, _round(5, version=5))
    rows, _ = take_replay(store, 100, current_version=6, rng=random.Random(0), max_staleness=2)
    assert set(rows.column("model_version").to_pylist()) == {5}


TASKS = [Task(task_id=f"t{i}", question=str(i), answer=str(i), prompt=str(i), metadata={}) for i in range(10)]


def test_selectors_sequential_shuffle_random():
    ids = lambda ts: [t.task_id for t in ts]  # noqa: E731
    assert ids(select_tasks(TASKS, 1, 4, 0, selector="sequential")) == ["t0", "t1", "t2", "t3"]
    assert ids(select_tasks(TASKS, 3, 4, 0, selector="sequential")) == ["t8", "t9", "t0", "t1"]
    one_pass = [t for r in (1, 2) for t in select_tasks(TASKS, r, 5, 0, selector="shuffle")]
    assert sorted(ids(one_pass)) == sorted(ids(TASKS))  # each task once per pass
    a, b = (ids(select_tasks(TASKS, r, 5, 0, selector="random")) for r in (1, 2))
    assert len(set(a)) == 5 and a == ids(select_tasks(TASKS, 1, 5, 0, selector="random")) and a != b
    with pytest.raises(ValueError, match="known: sequential, shuffle, random, curriculum"):
        select_tasks(TASKS, 1, 2, 0, selector="nope")


def test_curriculum_picks_tasks_nearest_the_target_pass_rate():
    rates = PassRates()
    # t0 always solved, t1 never, t2 half the time; the rest unseen (they count as the mean, 0.5)
    assert rates.add_round(1, [("t0", 1.0)] * 4 + [("t1", 0.0)] * 4 + [("t2", 1.0), ("t2", 0.0)] * 2)
    assert not rates.add_round(1, [("t0", 0.0)])  # a re-run round is not counted twice
    assert rates.mean() == pytest.approx(0.5) and rates.estimate("t0") == pytest.approx(5 / 6)
    hard = [t.task_id for t in select_tasks(TASKS, 2, 3, 0, selector="curriculum", pass_rates=rates, target=0.1)]
    assert hard[0] == "t1"
    easy = [t.task_id for t in select_tasks(TASKS, 2, 1, 0, selector="curriculum", pass_rates=rates, target=0.9)]
    assert easy == ["t0"]
    mid = {t.task_id for t in select_tasks(TASKS, 2, 8, 0, selector="curriculum", pass_rates=rates, target=0.5)}
    assert not {"t0", "t1"} & mid  # the 8 tasks estimated at 0.5 come first
    restored = PassRates(rates.to_state())
    assert restored.estimate("t1") == rates.estimate("t1") and restored.rounds == {1}


def test_dynamic_sampling_drops_groups_with_equal_rewards():
    table = pa.table({"group_id": ["a", "a", "b", "b", "c"], "reward": [1.0, 1.0, 0.0, 1.0, 0.5]})
    kept, dropped = drop_zero_variance_groups(table)
    assert dropped == 2  # a (all 1) and c (a group of one)
    assert kept.column("group_id").to_pylist() == ["b", "b"]


def test_stratified_order_gives_every_micro_batch_the_expert_share():
    is_expert = [i % 4 == 0 for i in range(64)]  # 16 of 64
    order = stratified_order(is_expert, 16, random.Random(0))
    assert sorted(order) == list(range(64))  # a permutation: nothing dropped or repeated
    assert [sum(is_expert[i] for i in order[k:k + 16]) for k in range(0, 64, 16)] == [4, 4, 4, 4]
    assert order != stratified_order(is_expert, 16, random.Random(1))  # shuffled within each kind
    uneven = [i < 13 for i in range(50)]  # 13 of 50: cumulative round(13·e/50) at e = 16, 32, 48, 50
    order = stratified_order(uneven, 16, random.Random(0))
    assert [sum(uneven[i] for i in order[k:k + 16]) for k in range(0, 50, 16)] == [4, 4, 4, 1]


def test_staleness_limit_drops_old_experiences():
    table = pa.table({"model_version": [1, 2, 3, 4, 5]})
    kept, dropped = drop_stale(table, current_version=5, max_staleness=2)
    assert kept.column("model_version").to_pylist() == [3, 4, 5] and dropped == 2


def test_dynamic_sampling_counts_informative_groups_and_fills_to_exactly_n():
    table = pa.table({"group_id": ["a", "a", "b", "b", "c", "c", "d", "d"],
                      "reward": [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.0]})
    assert informative_groups(table) == 3  # b, c, d
    kept, _ = drop_zero_variance_groups(table)
    assert first_groups(kept, 2).column("group_id").to_pylist() == ["b", "b", "c", "c"]
    assert first_groups(kept, 5).num_rows == 6


def test_preference_pairs_match_best_with_worst_and_skip_ties():
    table = pa.table({"group_id": ["a"] * 5 + ["b"] * 2 + ["c"] * 2,
                      "reward": [0.0, 1.0, 0.0, 1.0, 0.5, 1.0, 1.0, 0.0, 0.2],
                      "i": list(range(9))})
    pairs, n = preference_pairs(table)
    # a ranked: 1, 3 (1.0), 4 (0.5), 0, 2 (0.0) → (1, 2), (3, 0); 4 is the middle. b: tie → none. c: (8, 7)
    assert n == 3 and pairs.column("i").to_pylist() == [1, 2, 3, 0, 8, 7]
    rewards = pairs.column("reward").to_pylist()
    assert all(c > r for c, r in zip(rewards[0::2], rewards[1::2]))


def _expert(n: int) -> pa.Table:
    return to_table(make_experience(experience_id=f"e{i}", campaign="c", round=0, task_id=f"t{i}", group_id=f"e{i}",
                                    source="expert", reward=1.0, response_ids=[1], prompt_ids=[2], model_version=0)
                    for i in range(n))


def _sampler(store, *, micro_batch_size=4, epochs=1, algorithm="mix", **buffer):
    from rftflow.components.algorithms import resolve
    from rftflow.components.buffer.sampling import Sampler
    from rftflow.components.config import BufferConfig

    return Sampler(store, BufferConfig(**buffer), resolve(algorithm), micro_batch_size=micro_batch_size,
                   epochs=epochs, round_rows=6, groups_per_round=3, seed=0)


def test_the_round_batch_comes_mixed_and_ordered_in_micro_batches(store):
    store.write_usual(1, _round(1, groups=6, size=2))  # 12 explorer rows
    store.write_expert(_expert(20))
    # expert ratio 0.25: 12 · .25/.75 = 4 expert rows; 16 rows in micro-batches of 4 → 1 expert in each
    batch = _sampler(store, expert_ratio=0.25).round_batch(current_version=1)
    sources = [r["source"] for r in batch.rows]
    assert sources.count("explorer") == 12 and sources.count("expert") == 4
    assert sorted(i for step in batch.steps for i in step) == list(range(16))  # every row once
    assert [sum(sources[i] == "expert" for i in step) for step in batch.steps] == [1, 1, 1, 1]
    assert batch.metrics["sample/usual_rows"] == 12 and batch.metrics["sample/expert_rows"] == 4
    assert take_fifo(store)[0].num_rows == 12  # not consumed until the batch's commit runs
    batch.commit()
    assert take_fifo(store)[0].num_rows == 0
    two = _sampler(store, epochs=2, expert_per_round=3)
    store.write_usual(2, _round(2, groups=1, size=2))
    steps = two.round_batch(current_version=2).steps  # 2 explorer + 3 expert rows, two passes
    assert len(steps) == 4 and sorted(i for s in steps for i in s) == sorted(list(range(5)) * 2)


def test_pairwise_batches_keep_each_pair_in_one_micro_batch(store):
    table = to_table(make_experience(experience_id=f"{g}-{k}", campaign="c", round=1, task_id=f"t{g}",
                                     group_id=f"g{g}", source="explorer", reward=float(k % 2), response_ids=[1],
                                     prompt_ids=[2], model_version=1) for g in range(5) for k in range(4))
    store.write_usual(1, table)
    batch = _sampler(store, micro_batch_size=5, algorithm="dpo").round_batch(current_version=1)
    assert batch.metrics["sample/pairs"] == 10 and all(len(step) == 4 for step in batch.steps[:-1])
    for step in batch.steps:  # micro-batches of 5 → 4 rows: whole (chosen, rejected) pairs, chosen first
        for chosen, rejected in zip(step[0::2], step[1::2]):
            assert rejected == chosen + 1 and batch.rows[chosen]["reward"] > batch.rows[rejected]["reward"]
