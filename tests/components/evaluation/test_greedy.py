"""Greedy evaluation's figures (components/evaluation): accuracy reads a reward's verdict (``is_correct``),
never its total; a mixture's metrics weigh each part by its held-out tasks."""

from __future__ import annotations

import pytest

from rftflow.components.evaluation.greedy import accuracy, mixture_metrics
from rftflow.components.evaluation.verdicts import Graded, is_correct


def test_accuracy_counts_the_task_s_own_verdict_not_the_total():
    right_but_long = Graded(0.8, True, {"exact_match": 1.0, "length": -0.2})  # correct, total under 1
    wrong_but_shaped = Graded(1.2, False, {"exact_match": 0.0, "format": 1.2})  # total over 1, wrong
    scores, finished = [right_but_long, wrong_but_shaped, 1.0, 0.5], [True, True, False, True]
    assert [is_correct(s) for s in scores] == [True, False, True, False]
    assert accuracy(scores, finished) == {
        "accuracy/held_out": 2 / 4, "accuracy/reward_mean": pytest.approx((0.8 + 1.2 + 1.0 + 0.5) / 4),
        "accuracy/finished": 3 / 4, "accuracy/of_finished": 1 / 3}


def test_no_task_finished_gives_zero_accuracy_of_finished():
    assert accuracy([1.0, 1.0], [False, False])["accuracy/of_finished"] == 0.0


def test_a_mixture_weighs_each_part_by_its_held_out_tasks():
    metrics = mixture_metrics({"arith": (10, {"accuracy/held_out": 1.0, "accuracy/finished": 1.0}),
                               "code": (30, {"accuracy/held_out": 0.2, "accuracy/finished": 0.5})})
    assert metrics == {"accuracy/arith/held_out": 1.0, "accuracy/arith/finished": 1.0,
                       "accuracy/code/held_out": 0.2, "accuracy/code/finished": 0.5,
                       "accuracy/held_out": pytest.approx(0.4), "accuracy/finished": pytest.approx(0.625)}
