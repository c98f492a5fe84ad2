"""A campaign's durable state: generations committed put-if-absent, conflicts, config changes."""

import os
import socket

import pytest

from rftflow.components.campaign.state import (
    Attempt, CampaignState, FinishedMeanwhile, StateConflict, StateStore, claim, config_changes, fingerprint, now,
)
from rftflow.components.buffer.store import open_store


def _state(**config) -> CampaignState:
    config = {"name": "c", "trainer": {"lr": 0.1}, **config}
    return CampaignState(campaign="c", fingerprint=fingerprint(config), config=config)


def test_each_write_is_a_new_generation_and_readers_see_the_newest(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    writer = StateStore(store, "c")
    assert writer.read() is None
    state = _state()
    for r in range(1, 4):
        state.round = r
        writer.write(state)
    again = StateStore(store, "c").read()
    assert again.round == 3 and again.config == state.config and writer.generation == 3
    assert store.list("c/state/campaign/") == [f"c/state/campaign/g{g:08d}.json" for g in (1, 2, 3)]


def test_two_writers_of_one_campaign_cannot_both_win_a_generation(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    first, second = StateStore(store, "c"), StateStore(store, "c")
    first.read(), second.read()
    first.write(_state())
    with pytest.raises(StateConflict, match="another process wrote its state"):
        second.write(_state(seed=1))


def test_a_claim_on_a_campaign_finished_since_its_preflight_adds_no_attempt(tmp_path):
    """Two starts at once: both preflights saw it unfinished, and the first finished it before the
    second (still loading) claimed it; that one has nothing to do."""
    store = open_store((tmp_path / "store").as_uri())
    state, _ = claim(StateStore(store, "c"), "c", {"name": "c"}, None)
    state.status, state.attempt.outcome, state.attempt.ended_at = "finished", "finished", now()
    StateStore(store, "c").write(state)
    late = StateStore(store, "c")
    with pytest.raises(FinishedMeanwhile, match="finished in another process"):
        claim(late, "c", {"name": "c"}, None)
    assert len(StateStore(store, "c").read().attempts) == 1


def test_old_generations_are_pruned(tmp_path):
    store = open_store((tmp_path / "store").as_uri())
    writer, state = StateStore(store, "c"), _state()
    for _ in range(30):
        writer.write(state)
    kept = store.list("c/state/campaign/")
    assert len(kept) == 20 and kept[-1].endswith("g00000030.json")


def test_config_changes_name_the_keys_and_ignore_operational_ones():
    old = {"trainer": {"lr": 0.1}, "rounds": 5, "storage": {"max_attempts": 3}}
    new = {"trainer": {"lr": 0.2}, "rounds": 5, "storage": {"max_attempts": 9}}
    assert config_changes(old, new) == ["trainer.lr (0.1 → 0.2)"]
    assert fingerprint(old) != fingerprint(new)
    assert fingerprint(old) == fingerprint({**old, "storage": {"max_attempts": 1}})


def test_a_key_added_by_a_newer_version_is_a_change_only_off_its_default():
    from rftflow.components.config import CampaignConfig

    new = CampaignConfig().model_dump(mode="json")
    old = {**new, "promotion": {k: v for k, v in new["promotion"].items() if k != "after_campaign"}}
    assert config_changes(old, new) == []  # a campaign from before the key existed resumes
    off = {**new, "promotion": {**new["promotion"], "after_campaign": False}}
    assert config_changes(old, off) == ["promotion.after_campaign (None → False)"]


def test_a_running_attempt_is_alive_only_while_its_process_is(tmp_path):
    state = _state()
    state.attempts.append(Attempt(None, os.getpid(), socket.gethostname(), now()))
    assert not state.alive_elsewhere()  # this process
    parent = os.getppid()
    state.attempts.append(Attempt(None, parent, socket.gethostname(), now()))
    assert state.alive_elsewhere()  # another live process on this host
    state.attempts[-1].pid = 2 ** 22 + 12345  # no such process
    assert not state.alive_elsewhere()
    state.status = "finished"
    state.attempts[-1].pid = parent
    assert not state.alive_elsewhere()
