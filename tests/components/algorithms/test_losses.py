"""Losses and advantages against values computed by hand (in the comments)."""

import math

import pytest
import torch
from torch.testing import assert_close

from rftflow.components.algorithms import (
    aggregate, dpo_loss, get_advantage, get_loss, grpo_advantages, kl_penalty, mix_loss, ppo_clip_loss,
    register_advantage, sft_loss, value_loss,
)

S = 0.5 / math.sqrt(0.5)  # 0.70711: |r − mean| / unbiased std for a group of two distinct rewards


def test_grpo_advantages_normalise_within_each_group():
    # group a: [1, 0] mean .5 std .7071; group b: [1, .5] mean .75 std .3536 → ±0.7071 each
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.5]), ["a", "a", "b", "b"], eps=0.0)
    assert_close(adv, torch.tensor([S, -S, S, -S]))


def test_grpo_without_std_is_mean_centred_only():  # Dr. GRPO
    adv = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 0.5]), ["a", "a", "b", "b"], std_normalize=False)
    assert_close(adv, torch.tensor([0.5, -0.5, 0.25, -0.25]))


def test_grpo_group_of_one_and_all_equal_rewards_give_zero_not_nan():
    adv = grpo_advantages(torch.tensor([0.3, 1.0, 1.0, 1.0]), [7, 8, 8, 8])
    assert torch.isfinite(adv).all()
    assert_close(adv, torch.zeros(4))


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert_close(aggregate(loss, mask, "token-mean"), torch.tensor(7 / 3))  # (1+2+4)/3
    assert_close(aggregate(loss, mask, "seq-mean-token-mean"), torch.tensor(2.75))  # (1.5 + 4)/2
    assert_close(aggregate(loss, mask, "seq-mean-token-sum"), torch.tensor(3.5))  # (3 + 4)/2
    assert_close(aggregate(loss, mask, "seq-mean-token-sum-norm"), torch.tensor(7 / 6))  # (3/3 + 4/3)/2
    with pytest.raises(ValueError, match="known: token-mean"):
        aggregate(loss, mask, "mean")


def test_aggregation_of_a_fully_masked_row_is_zero_not_nan():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    assert_close(aggregate(loss, mask, "seq-mean-token-mean"), torch.tensor(0.75))  # (1.5 + 0)/2
    assert_close(aggregate(loss, torch.zeros_like(mask), "token-mean"), torch.tensor(0.0))


RATIOS = torch.tensor([[0.5, 1.0, 1.5, 1.1]])


def _ppo(advantage: float, **kw):
    old = torch.zeros(1, 4)
    return ppo_clip_loss(torch.log(RATIOS), old, torch.tensor([advantage]), torch.ones(1, 4), **kw)


def test_ppo_clip_positive_advantage_clips_the_gain():
    # l = −min(r, clip(r, .8, 1.2)) = −[.5, 1, 1.2, 1.1] → mean −0.95
    loss, metrics = _ppo(1.0)
    assert_close(loss, torch.tensor(-0.95))
    assert metrics["update/clip_frac"] == pytest.approx(0.25)  # only r = 1.5 is clipped


def test_ppo_clip_negative_advantage_and_dual_clip():
    # l = max(r, clip(r)) = [.8, 1, 1.5, 1.1] → 1.1 ; dual clip c=1.3 caps 1.5 → 1.3: 4.2/4
    assert_close(_ppo(-1.0)[0], torch.tensor(1.1))
    assert_close(_ppo(-1.0, dual_clip=1.3)[0], torch.tensor(1.05))


def test_ppo_clip_higher_widens_the_upper_bound():  # DAPO
    # clip_high .6: r = 1.5 is no longer clipped: −(.5 + 1 + 1.5 + 1.1)/4
    assert_close(_ppo(1.0, clip_high=0.6)[0], torch.tensor(-1.025))


def test_ppo_extreme_log_ratios_stay_finite():
    logprobs = torch.tensor([[0.0, -200.0]], requires_grad=True)
    loss, _ = ppo_clip_loss(logprobs, torch.tensor([[-200.0, 0.0]]), torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logprobs.grad).all()


def test_sft_loss_is_masked_negative_log_likelihood():
    logprobs = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]])
    assert_close(sft_loss(logprobs, torch.tensor([[1, 1], [1, 0]])), torch.tensor(2.0))  # (1+2+3)/3


def test_kl_estimators():
    d = torch.tensor([[0.5, -1.0, 30.0, -30.0]])
    ref = torch.zeros_like(d)
    assert_close(kl_penalty(d, ref, "k1"), d)
    assert_close(kl_penalty(d, ref, "k2"), torch.tensor([[0.125, 0.5, 450.0, 450.0]]))
    k3 = kl_penalty(d, ref, "k3")  # exp(−d) + d − 1, d clamped to ±20
    assert_close(k3[0, :2], torch.tensor([math.exp(-0.5) - 0.5, math.e - 2.0]))
    assert torch.isfinite(k3).all()
    assert_close(kl_penalty(d, ref, "low_var_kl"), torch.tensor([[math.exp(-0.5) - 0.5, math.e - 2.0, 10.0, 10.0]]))
    with pytest.raises(ValueError, match="known: k1"):
        kl_penalty(d, ref, "k4")


def test_mix_loss_weights_policy_and_sft_terms():
    # row 0 usual, ratio 1, A=1 → PPO term −1; row 1 expert, logprobs −2 → SFT term 2
    logprobs = torch.tensor([[-0.7, -0.7], [-2.0, -2.0]])
    loss, metrics = mix_loss(logprobs, logprobs.clone(), torch.tensor([1.0, 0.0]), torch.ones(2, 2),
                             torch.tensor([False, True]), mu=0.1)
    assert_close(loss, torch.tensor(0.9 * -1.0 + 0.1 * 2.0))
    assert metrics["loss/policy"] == pytest.approx(-1.0) and metrics["loss/sft"] == pytest.approx(2.0)
    # its PPO term takes the PPO options too: a sequence-level ratio (GSPO) on the usual row
    logprobs = torch.log(torch.tensor([[1.5, 0.5], [0.5, 0.5]]))
    seq, _ = mix_loss(logprobs, torch.zeros(2, 2), torch.tensor([1.0, 0.0]), torch.ones(2, 2),
                      torch.tensor([False, True]), mu=0.1, ratio_level="sequence", agg="seq-mean-token-mean")
    assert_close(seq, torch.tensor(0.9 * -math.sqrt(0.75) + 0.1 * -math.log(0.5)))


def test_mix_loss_reads_a_0_1_tensor_or_a_list_as_is_expert():
    # ~tensor([0, 1]) is [-1, -2] (bitwise not), which would index the wrong rows
    logprobs = torch.tensor([[-0.7, -0.7], [-2.0, -2.0]])
    args = (logprobs, logprobs.clone(), torch.tensor([1.0, 0.0]), torch.ones(2, 2))
    expected, _ = mix_loss(*args, torch.tensor([False, True]), mu=0.1)
    for is_expert in (torch.tensor([0, 1]), [False, True], [0, 1]):
        assert_close(mix_loss(*args, is_expert, mu=0.1)[0], expected)
    with pytest.raises(ValueError, match=r"is_expert must be \(B,\) = \(2,\), got shape \(3,\)"):
        mix_loss(*args, [0, 1, 0])


def test_sequence_ratio_and_mix_stay_finite_at_extreme_log_ratios():
    logprobs = torch.tensor([[0.0, -300.0], [-300.0, 0.0]], requires_grad=True)
    old, advantages, mask = torch.tensor([[-300.0, 0.0], [0.0, -300.0]]), torch.tensor([-1.0, 1.0]), torch.ones(2, 2)
    for loss, _ in (ppo_clip_loss(logprobs, old, advantages, mask, ratio_level="sequence"),
                    mix_loss(logprobs, old, advantages, mask, torch.tensor([False, True]), dual_clip=3.0)):
        (grad,) = torch.autograd.grad(loss, logprobs)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()


def test_registry_finds_registered_functions_and_lists_known_names():
    @register_advantage("constant_one")
    def constant_one(rewards, group_ids, **_):
        return torch.ones_like(rewards)

    assert_close(get_advantage("constant_one")(torch.zeros(3), [0, 0, 1]), torch.ones(3))
    assert get_loss("mix") is not None
    with pytest.raises(KeyError, match="known: .*grpo"):
        get_advantage("nope")


def test_gspo_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    # row ratios 1.5 and 0.5 → s = exp((ln 1.5 + ln 0.5)/2) = sqrt(.75) = .8660, inside [.8, 1.2]: l = −s
    logprobs = torch.log(torch.tensor([[1.5, 0.5]]))
    loss, _ = ppo_clip_loss(logprobs, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2),
                            ratio_level="sequence", agg="seq-mean-token-mean")
    assert_close(loss, torch.tensor(-math.sqrt(0.75)))
    # the same ratios token by token: −(1.2 + .5)/2 (1.5 is clipped to 1.2)
    token, _ = ppo_clip_loss(logprobs, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2))
    assert_close(token, torch.tensor(-0.85))


def test_entropy_of_uniform_logits_is_log_vocab():
    from rftflow.components.algorithms import entropy_from_logits

    assert_close(entropy_from_logits(torch.zeros(2, 3, 7)), torch.full((2, 3), math.log(7)))


def test_regularized_adds_kl_and_subtracts_entropy_bonus():
    from rftflow.components.algorithms import regularized

    logprobs = torch.tensor([[0.0, -1.0]])
    ref = torch.tensor([[0.5, -1.0]])  # d = [−.5, 0]; k1 token-mean = −.25
    entropy = torch.tensor([[1.0, 3.0]])  # token-mean 2
    loss, metrics = regularized(torch.tensor(1.0), logprobs, torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1,
                                kl_kind="k1", entropy=entropy, entropy_coef=0.01)
    assert_close(loss, torch.tensor(1.0 + 0.1 * -0.25 - 0.01 * 2.0))
    assert metrics == {"kl/k1": pytest.approx(-0.25), "update/entropy": pytest.approx(2.0)}
    untouched, _ = regularized(torch.tensor(1.0), logprobs, torch.ones(1, 2), ref_logprobs=ref, kl_kind="k2")
    assert_close(untouched, torch.tensor(1.0))  # coefficient 0: reported, not added


def test_opmd_loss_is_advantage_weighted_nll_shrunk_by_tau():
    from rftflow.components.algorithms import opmd_loss

    # l = −A·logprobs = [1, 2] → token-mean 1.5, / (1 + τ) with τ = 1
    loss = opmd_loss(torch.tensor([[-1.0, -2.0]]), torch.tensor([1.0]), torch.ones(1, 2), tau=1.0)
    assert_close(loss, torch.tensor(0.75))


def test_dpo_loss_by_hand():
    # pair 1: ρ_c = (−1 − −2) = 1 over 2 tokens → 2; ρ_r = −1; z = β·3 = 0.3
    # pair 2 (the second token of each row masked): ρ_c = 0, ρ_r = 0.5 → z = −0.05
    logprobs = torch.tensor([[-1.0, -1.0], [-2.0, -2.0], [-1.0, -9.0], [-0.5, 7.0]])
    ref = torch.tensor([[-2.0, -2.0], [-1.5, -1.5], [-1.0, 0.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 0]])
    loss, metrics = dpo_loss(logprobs, ref, mask, beta=0.1)
    expected = (-math.log(1 / (1 + math.exp(-0.3))) - math.log(1 / (1 + math.exp(0.05)))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["update/dpo_reward_accuracy"] == 0.5 and metrics["update/dpo_margin"] == pytest.approx((3 - 0.5) / 2, rel=1e-5)
    # label smoothing ε: −(1−ε)·log σ(z) − ε·log σ(−z)
    smooth, _ = dpo_loss(logprobs[:2], ref[:2], mask[:2], beta=0.1, label_smoothing=0.2)
    assert smooth.item() == pytest.approx(0.8 * math.log1p(math.exp(-0.3)) + 0.2 * math.log1p(math.exp(0.3)), rel=1e-5)
    # extreme log-ratios: finite loss and gradient
    big = torch.tensor([[-1e4], [1e4]], requires_grad=True)
    out, _ = dpo_loss(big, torch.zeros(2, 1), torch.ones(2, 1))
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(big.grad).all()
    with pytest.raises(ValueError, match="pairs"):
        dpo_loss(logprobs[:3], ref[:3], mask[:3])


def test_value_loss_clips_the_move_away_from_old_values():
    old = torch.tensor([[0.0, 0.0, 5.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 2.0, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    # token 0: V_clip = 0.2; max((.5−1)², (.2−1)²) = .64; token 1: V_clip = .2; max(1, .64) = 1; token 2 masked
    assert value_loss(values, old, returns, mask, clip=0.2).item() == pytest.approx(0.5 * (0.64 + 1.0) / 2)
    assert value_loss(values, old, returns, mask, clip=None).item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)


def test_registered_traits_tell_the_trainer_what_a_part_needs():
    assert get_loss("dpo").pairwise and get_loss("dpo").needs_reference
    assert not getattr(get_loss("ppo_clip"), "pairwise", False)
    assert get_advantage("gae").needs_critic and not get_advantage("grpo").needs_critic
