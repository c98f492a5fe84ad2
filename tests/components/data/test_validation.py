import math

from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.data.contracts import ContractBounds, check_experiences


def _row(i, **overrides):
    fields = dict(experience_id=f"e{i}", campaign="c", round=1, task_id="t", group_id="g", source="explorer",
                  prompt="1+1=", response="2", prompt_ids=[1, 2, 3], response_ids=[4, 5],
                  response_logprobs=[-0.1, -0.2], response_mask=[1, 1], reward=1.0, model_version=0)
    return make_experience(**{**fields, **overrides})


def test_bad_rows_are_quarantined_with_their_reasons_and_nothing_is_lost():
    rows = [
        _row(0),
        _row(1, reward=math.nan),
        _row(2, reward=7.0),
        _row(3, response_logprobs=[-0.1]),
        _row(4, source="robot"),
        _row(5, task_id=None),
        _row(6, model_version=5),
        _row(7, response_ids=[]),
    ]
    verdict = check_experiences(to_table(rows), ContractBounds(max_model_version=1))
    assert verdict.counts == {"rows": 8, "accepted": 1, "quarantined": 7}
    reasons = dict(zip(verdict.quarantined.column("experience_id").to_pylist(),
                       verdict.quarantined.column("reason").to_pylist()))
    assert verdict.accepted.column("experience_id").to_pylist() == ["e0"]
    assert "reward_is_finite" in reasons["e1"]
    assert "within_bounds(reward)" in reasons["e2"]
    assert "token_lengths_consistent" in reasons["e3"] and "token_lengths_consistent" in reasons["e7"]
    assert "within_bounds(source_matches)" in reasons["e4"]
    assert "within_bounds(task_id_present)" in reasons["e5"]  # null counts as length 0
    assert "within_bounds(model_version)" in reasons["e6"]


def test_a_repeated_row_is_quarantined_alone_not_with_its_group():
    rows = [_row(0), _row(1), _row(1)]  # group g: e0, e1, and a second copy of e1
    verdict = check_experiences(to_table(rows), ContractBounds(group_size=2))
    assert verdict.accepted.column("experience_id").to_pylist() == ["e0", "e1"]
    assert verdict.quarantined.column("reason").to_pylist() == ["expect_multicolumn_values_within_bounds(experience_id_is_first)"]
