"""The buffer's consumption (FIFO cursor, prioritised replay) and the task selectors."""

import random

import pyarrow as pa
import pytest

from components.buffer import ExperienceBuffer
from components.experience import make_experience, to_table
from components.selectors import PassRates, select_tasks
from components.storage import open_store
from components.tasksets import Task


def _round(round_no: int, groups: int = 3, size: int = 2, version: int | None = None) -> pa.Table:
    return to_table(
        make_experience(experience_id=f"{round_no}-{g}-{k}", campaign="c", round=round_no, task_id=f"t{g}",
                        group_id=f"r{round_no}-g{g}", source="explorer", reward=float(k), response_ids=[1],
                        prompt_ids=[2], model_version=round_no if version is None else version)
        for g in range(groups) for k in range(size)
    )


@pytest.fixture
def buffer(tmp_path):
    return ExperienceBuffer(open_store((tmp_path / "store").as_uri()), "c")


def test_fifo_serves_each_row_once_in_order_and_only_commit_moves_the_cursor(tmp_path, buffer):
    buffer.write_usual(1, _round(1))
    buffer.write_usual(2, _round(2))
    rows, commit = buffer.take_fifo(3)  # 3 rows → whole groups: 4 rows (2 groups of 2)
    assert rows.column("group_id").to_pylist() == ["r1-g0", "r1-g0", "r1-g1", "r1-g1"]
    again, _ = buffer.take_fifo(3)  # not committed (e.g. training crashed): the same rows again
    assert again.column("experience_id").to_pylist() == rows.column("experience_id").to_pylist()
    commit()
    rest, commit = buffer.take_fifo()
    assert rest.column("group_id").to_pylist() == ["r1-g2"] * 2 + [f"r2-g{g}" for g in range(3) for _ in range(2)]
    commit()
    # the cursor is in the store: a new process (new buffer object) continues where this one stopped
    fresh = ExperienceBuffer(open_store((tmp_path / "store").as_uri()), "c")
    assert fresh.take_fifo()[0].num_rows == 0
    fresh.write_usual(3, _round(3))
    assert fresh.take_fifo()[0].column("round").to_pylist() == [3] * 6


def test_replay_prefers_fresh_groups_decays_with_use_and_respects_the_reuse_limit(buffer):
    buffer.write_usual(1, _round(1, groups=2))
    buffer.write_usual(2, _round(2, groups=2))
    rng = random.Random(0)
    picks = []
    for _ in range(4):
        rows, commit = buffer.take_replay(4, current_version=2, rng=rng, decay=1.5, reuse_limit=2)
        picks.append(sorted(set(rows.column("group_id").to_pylist())))
        commit()
    # priority = version − 1.5·uses: round 2 (2) first; then round 1 (1) beats used round 2 (0.5);
    # then round 2 again (0.5 > −0.5); then round 1 again; then every group is at its limit
    assert picks == [["r2-g0", "r2-g1"], ["r1-g0", "r1-g1"], ["r2-g0", "r2-g1"], ["r1-g0", "r1-g1"]]
    assert buffer.take_replay(4, 2, rng, decay=1.5, reuse_limit=2)[0].num_rows == 0
    assert buffer.read_state("replay_uses") == {g: 2 for p in picks[:2] for g in p}


def test_replay_staleness_bound_excludes_old_versions(buffer):
    buffer.write_usual(1, _round(1, version=1))
    buffer.write_usual(5, _round(5, version=5))
    rows, _ = buffer.take_replay(100, current_version=6, rng=random.Random(0), max_staleness=2)
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
