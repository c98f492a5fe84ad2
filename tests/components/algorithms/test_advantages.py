"""Advantage estimators against hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rftflow.components.algorithms import (
    gae_advantages, get_advantage, grpo_advantages, opmd_advantages, reinforce_pp_advantages, rloo_advantages,
)

REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.5])
GROUPS = ["a", "a", "b", "b"]


def test_grpo_std_over_batch():
    # centred: [.5, -.5, .25, -.25]; batch std of rewards (mean .625): sqrt(.6875/3) = .478714
    adv = grpo_advantages(REWARDS, GROUPS, std_over="batch", eps=0.0)
    assert_close(adv, torch.tensor([0.5, -0.5, 0.25, -0.25]) / math.sqrt(0.6875 / 3))


def test_rloo_leaves_one_out():
    # group [1, 0, .5]: 1 − .25, 0 − .75, .5 − .5; a group of one → 0
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.5, 0.7]), [0, 0, 0, 1])
    assert_close(adv, torch.tensor([0.75, -0.75, 0.0, 0.0]))


def test_reinforce_pp_whitens_over_the_batch():
    # no baseline: (r − .625) / .478714
    assert_close(reinforce_pp_advantages(REWARDS, GROUPS, eps=0.0),
                 (REWARDS - 0.625) / math.sqrt(0.6875 / 3))
    # group baseline: [.5, -.5, .25, -.25] / sqrt(.625/3)
    assert_close(reinforce_pp_advantages(REWARDS, GROUPS, baseline=True, eps=0.0),
                 torch.tensor([0.5, -0.5, 0.25, -0.25]) / math.sqrt(0.625 / 3))


def test_opmd_baselines_are_the_group_mean_or_its_soft_max():
    # group mean by default (Trinity-RFT's): [1, 0] → [.5, −.5]; unnormalised
    assert_close(opmd_advantages(torch.tensor([1.0, 0.0, 2.0, 2.0, 0.0, 0.0]), [0, 0, 1, 1, 1, 1]),
                 torch.tensor([0.5, -0.5, 1.0, 1.0, -1.0, -1.0]))
    # logavgexp, group [1, 0], τ = 1: baseline log((e + 1)/2) = .620115
    b = math.log((math.e + 1) / 2)
    assert_close(opmd_advantages(torch.tensor([1.0, 0.0]), [0, 0], baseline="logavgexp"), torch.tensor([1 - b, -b]))
    # equal rewards → 0; huge rewards stay finite
    assert_close(opmd_advantages(torch.tensor([3.0, 3.0]), [0, 0], baseline="logavgexp"), torch.zeros(2))
    assert torch.isfinite(opmd_advantages(torch.tensor([1e4, -1e4]), [0, 0], baseline="logavgexp", tau=0.1)).all()
    # a group far below the batch's best reward: its baseline is its own (no exp underflow to log 0)
    assert_close(opmd_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), ["a", "a", "b", "b"], baseline="logavgexp",
                                 tau=0.005), torch.zeros(4))
    with pytest.raises(ValueError, match="opmd baseline 'median'"):
        opmd_advantages(torch.tensor([1.0, 0.0]), [0, 0], baseline="median")


def test_gae_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])  # the 4th token is padding: its value must not leak
    mask = torch.tensor([[1, 1, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    assert_close(adv, torch.tensor([[0.5, 0.4, 0.3, 0.0]]))  # A_t = Σ r − V_t
    assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    # whitened over the 3 unmasked tokens: (A − 0.4) / std([.5, .4, .3]) = [1, 0, −1]; returns unchanged
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert_close(adv, torch.tensor([[1.0, 0.0, -1.0, 0.0]]), atol=1e-5, rtol=0)
    assert_close(ret, torch.tensor([[1.0, 1.0, 1.0, 0.0]]))
    adv, _ = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.95, whiten=False)
    # δ = [.04, .03, .3]; A_2 = .3, A_1 = .03 + .855·.3, A_0 = .04 + .855·A_1
    a1 = 0.03 + 0.855 * 0.3
    assert_close(adv, torch.tensor([[0.04 + 0.855 * a1, a1, 0.3, 0.0]]))


def test_gae_passes_through_an_episodes_environment_tokens():
    """Two model turns with an environment observation between them (mask 0): the final reward
    reaches the first turn, and the first turn bootstraps from the second turn's value, as if the
    observation's tokens were not there; their own advantage is 0 and their value never leaks."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 7.0, 8.0, 0.7, 9.0]])  # tokens 2-3: the environment's; 5: padding
    mask = torch.tensor([[1, 1, 0, 0, 1, 0]])
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0, whiten=False)
    assert_close(adv, torch.tensor([[0.5, 0.4, 0.0, 0.0, 0.3, 0.0]]))
    assert_close(ret, torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0, 0.0]]))
    turns, _ = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.95, whiten=False)
    plain, _ = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.6, 0.7]]),
                              torch.tensor([[1, 1, 1]]), gamma=0.9, lam=0.95, whiten=False)
    assert_close(turns[:, [0, 1, 4]], plain)  # the same as the model's tokens alone


def test_group_of_one_and_all_equal_rewards_never_nan():
    for name in ("grpo", "rloo", "reinforce_pp", "opmd"):
        adv = get_advantage(name)(torch.tensor([0.3, 1.0, 1.0]), [0, 1, 1])
        assert torch.isfinite(adv).all(), name
    assert_close(reinforce_pp_advantages(torch.ones(3), [0, 0, 0]), torch.zeros(3))


def test_group_ids_as_a_tensor_an_array_or_a_list_give_the_same_advantages():
    # tensor elements hash by identity: read naively, every row would be its own group (all zeros)
    import numpy as np

    rewards, ids = torch.tensor([1.0, 0.0, 1.0, 0.5]), [7, 7, 3, 3]
    expected = grpo_advantages(rewards, ids)
    assert expected.abs().sum() > 0
    for fn in (grpo_advantages, rloo_advantages, reinforce_pp_advantages, opmd_advantages):
        reference = fn(rewards, ids)
        for same in (torch.tensor(ids), np.array(ids), torch.tensor(ids, dtype=torch.int32)):
            assert_close(fn(rewards, same), reference)
    assert_close(grpo_advantages([1.0, 0.0, 1.0, 0.5], ids), expected)  # rewards as a list too


def test_group_ids_of_the_wrong_shape_are_refused_in_one_line():
    import pytest

    with pytest.raises(ValueError, match=r"group_ids must be one-dimensional, got shape \(2, 2\)"):
        grpo_advantages(torch.zeros(4), torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"rewards must be \(B,\) with B = len\(group_ids\) = 3, got shape \(4,\)"):
        rloo_advantages(torch.zeros(4), [0, 0, 1])


def test_discounted_turn_returns_credit_each_turn_with_what_followed_it():
    from rftflow.components.algorithms.advantages import turn_returns

    # step rewards after turns 0..2, γ = 0.5: G_2 = 1, G_1 = 0 + 0.5·1, G_0 = 0.25 + 0.5·0.5
    assert turn_returns([0.25, 0.0, 1.0], 3, reward=1.25, gamma=0.5) == [0.5, 0.5, 1.0]
    # a verifier's score beyond the step rewards lands on the last turn; missing steps are 0
    assert turn_returns([], 2, reward=1.0, gamma=1.0) == [1.0, 1.0]


def test_discounted_turn_advantages_with_one_final_reward_and_no_discount_are_grpos_on_every_model_token():
    import torch

    from rftflow.components.algorithms.advantages import discounted_turn_advantages, grpo_advantages, turn_returns

    rewards, groups = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0], ["a", "a", "a", "b", "b", "b"]
    spans = [[(0, 2), (5, 7)], [(0, 3)], [(0, 1), (4, 6), (8, 9)], [(0, 2)], [(0, 2), (3, 4)], [(0, 5)]]
    returns = [turn_returns([], len(s), r, 1.0) for s, r in zip(spans, rewards)]
    out = discounted_turn_advantages(returns, spans, groups, width=10)
    grpo = grpo_advantages(torch.tensor(rewards), groups)
    for i, turn_spans in enumerate(spans):
        model = torch.zeros(10, dtype=torch.bool)
        for start, end in turn_spans:
            model[start:end] = True
        assert torch.allclose(out[i][model], grpo[i].expand(int(model.sum())))
        assert (out[i][~model] == 0).all()  # the environment's tokens get nothing
    # with a discount, an earlier turn of a winning episode gets less than its last turn
    discounted = discounted_turn_advantages([turn_returns([], 2, 1.0, 0.5), [0.0]], [[(0, 1), (2, 3)], [(0, 1)]],
                                            ["g", "g"], width=3)
    assert discounted[0, 0] < discounted[0, 2]
