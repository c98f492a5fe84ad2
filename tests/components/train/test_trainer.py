import copy

import pytest
import torch

from rftflow.components.algorithms import resolve
from rftflow.components.config import TrainerConfig
from rftflow.components.train.trainer import Trainer


def whole(rows) -> list[list[int]]:
    """One micro-batch of all ``rows``, in order."""
    return [list(range(len(rows)))]


def _expert_row(tokenizer, prompt: str, answer: str) -> dict:
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return {"prompt_ids": ids, "response_ids": response, "source": "expert", "reward": 1.0, "group_id": prompt}


def test_round_learning_rate_follows_a_cosine_to_min_lr(tiny):
    model, tokenizer = tiny
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=1e-3, min_lr=1e-5),
                      resolve("sft"))
    assert trainer.round_lr(1, 11) == pytest.approx(1e-3)
    assert trainer.round_lr(6, 11) == pytest.approx((1e-3 + 1e-5) / 2)
    assert trainer.round_lr(11, 11) == pytest.approx(1e-5)
    constant = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=1e-3), resolve())
    assert constant.round_lr(7, 11) == pytest.approx(1e-3)


def test_policy_gradient_presets_step_at_their_lr_scale(tiny):
    model, tokenizer = tiny
    config = TrainerConfig(lr=1e-3, min_lr=1e-5)
    grpo = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, resolve("grpo"))
    assert grpo.round_lr(1, 11) == pytest.approx(1e-4)
    assert grpo.round_lr(11, 11) == pytest.approx(1e-6)
    chosen = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, resolve("grpo", lr_scale=0.5))
    assert chosen.round_lr(1, 11) == pytest.approx(5e-4)
    assert Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, resolve("mix")).round_lr(1, 11) == \
        pytest.approx(1e-3)


def test_sft_steps_change_the_weights_and_lower_the_loss(tiny):
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    before = [p.detach().clone() for p in policy.parameters()]
    trainer = Trainer(policy, tokenizer.pad_token_id, TrainerConfig(lr=3e-3, micro_batch_size=4),
                      resolve("sft"))
    rows = [_expert_row(tokenizer, f"{a} + {a} =", str(2 * a)) for a in range(4)]
    first = trainer.train(rows, whole(rows))["loss/sft"]
    for _ in range(20):
        last = trainer.train(rows, whole(rows))["loss/sft"]
    assert last < first / 2
    assert any(not torch.equal(a, b.cpu()) for a, b in zip(before, policy.parameters()))


def _explorer_rows(model, tokenizer):
    """Two groups of two sampled responses with their behaviour log-probs and mixed rewards."""
    from rftflow.components.train.batching import batch_tensors, response_logprobs

    rows = []
    for g, prompt in enumerate(["1 + 1 =", "2 + 5 ="]):
        for k, answer in enumerate(["2", "7"]):
            row = _expert_row(tokenizer, prompt, answer)
            row.update(source="explorer", group_id=f"g{g}", reward=float(k == g))
            rows.append(row)
    with torch.no_grad():
        lp = response_logprobs(model, batch_tensors(rows, tokenizer.pad_token_id))
    for i, r in enumerate(rows):
        r["response_logprobs"] = lp[i, :len(r["response_ids"])].tolist()
    return rows


def test_kl_loss_uses_a_frozen_reference_and_grows_as_the_policy_moves(tiny):
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    trainer = Trainer(policy, tokenizer.pad_token_id, TrainerConfig(lr=5e-3, micro_batch_size=4),
                      resolve("grpo", kl_coef=0.1, kl_kind="k3", entropy_coef=0.01))
    rows = _explorer_rows(model, tokenizer)
    first = trainer.train(rows, whole(rows))
    assert first["kl/k3"] == pytest.approx(0.0, abs=1e-5)  # reference = policy at the first step
    ref_before = [p.clone() for p in trainer.ref_model.parameters()]
    for _ in range(5):
        last = trainer.train(rows, whole(rows))
    assert last["kl/k3"] > 1e-4 and "update/entropy" in last
    assert all(torch.equal(a, b) for a, b in zip(ref_before, trainer.ref_model.parameters()))


def test_kl_in_reward_subtracts_beta_times_summed_kl(tiny):
    model, tokenizer = tiny
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=1e-4, micro_batch_size=4),
                      resolve("grpo", kl_coef=0.2, kl_kind="k1", kl_mode="reward"))
    rows = _explorer_rows(model, tokenizer)
    for r in rows:  # behaviour log-probs 0.5 above the reference's on every token: k1 = 0.5 per token
        r["response_logprobs"] = [v + 0.5 for v in r["response_logprobs"]]
    expected = sum(r["reward"] - 0.2 * 0.5 * len(r["response_ids"]) for r in rows) / len(rows)
    metrics = trainer.train(rows, whole(rows))
    assert metrics["reward/kl_penalised_mean"] == pytest.approx(expected, abs=1e-4)
    assert "kl/k1" not in metrics  # not also a loss term


def test_ppo_trains_a_critic_on_token_level_gae(tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)  # the critic's new value head: not whatever the tests before left the generator at
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id,
                      TrainerConfig(lr=1e-4, micro_batch_size=4, critic_lr=1e-3),
                      resolve("ppo", advantage_options={"whiten": False}))
    rows = _explorer_rows(model, tokenizer)
    rows[0]["response_ids"] = rows[0]["response_ids"] + [tokenizer.eos_token_id]  # unequal lengths: 3 vs 2
    rows[0]["response_logprobs"] = rows[0]["response_logprobs"] + [-1.0]
    first = trainer.train(rows, whole(rows))
    assert trainer.critic is not None and {"value/loss", "value/explained_variance", "loss/policy"} <= set(first)
    # token-level advantages: (N, R_max), zero past each row's last token; with V = critic's values,
    # A_t = Σ_{k≥t} (γλ)^{k−t} δ_k, so the last token's A = reward − V_last
    advantages, targets, _ = trainer._advantages(rows)
    assert advantages.shape == (4, 3) and advantages[1:, 2].eq(0).all() and advantages[0, 2] != 0
    last = torch.tensor([r["reward"] for r in rows]) - targets["old_values"][torch.arange(4), [2, 1, 1, 1]]
    torch.testing.assert_close(advantages[torch.arange(4), [2, 1, 1, 1]], last)
    torch.testing.assert_close(targets["returns"], (advantages + targets["old_values"]) * (advantages != 0))
    for _ in range(15):
        later = trainer.train(rows, whole(rows))
    assert later["value/loss"] < first["value/loss"] / 2  # the critic fits the returns


def test_dpo_raises_the_chosen_response_over_the_rejected(tiny):
    from rftflow.components.buffer.sampling import preference_pairs
    import pyarrow as pa

    model, tokenizer = tiny
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=1e-3, micro_batch_size=4),
                      resolve("dpo", beta=0.5))
    paired, n = preference_pairs(pa.Table.from_pylist(_explorer_rows(model, tokenizer)))
    rows = paired.to_pylist()
    assert n == 2 and [r["reward"] for r in rows] == [1.0, 0.0, 1.0, 0.0]
    first = trainer.train(rows, whole(rows))
    assert first["update/dpo_margin"] == pytest.approx(0.0, abs=1e-5)  # the reference is the policy at the start
    for _ in range(10):
        last = trainer.train(rows, whole(rows))
    assert last["update/dpo_reward_accuracy"] == 1.0 and last["update/dpo_margin"] > 1.0 and last["loss/policy"] < first["loss/policy"]


def test_a_lora_trainer_moves_the_adapter_only_and_its_reference_is_the_base_without_a_copy(tiny):
    from rftflow.components.config import LoraConfig
    from rftflow.components.train.batching import batch_tensors, response_logprobs

    model, tokenizer = tiny
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=5e-3, micro_batch_size=4),
                      resolve("grpo", kl_coef=0.1, kl_kind="k3"), lora=LoraConfig(rank=4, alpha=8))
    peft_model = trainer.unwrapped
    adapter = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert adapter and all("lora_" in n for n in adapter)
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}
    rows = _explorer_rows(model, tokenizer)
    first = trainer.train(rows, whole(rows))
    assert first["kl/k3"] == pytest.approx(0.0, abs=1e-6)  # B = 0 at the start: the policy is the base
    for _ in range(5):
        last = trainer.train(rows, whole(rows))
    after = dict(peft_model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved and moved <= adapter  # only adapter weights changed
    assert trainer.ref_model is None and last["kl/k3"] > 1e-5  # the reference is the base, not a copy
    state = trainer.optimizer.state_dict()["state"]
    assert len(state) == len(adapter)  # the optimizer holds the adapter's moments only
    batch = batch_tensors(rows, tokenizer.pad_token_id)
    assert torch.allclose(trainer._reference_logprobs(batch), response_logprobs(model, batch), atol=1e-6)


def test_a_micro_batch_without_advantage_steps_on_zero_gradients_to_the_same_weights(tiny):
    """A GRPO round whose groups all scored alike has advantages all 0: the trainer skips its
    forward and backward and steps on zero gradients, and the weights come out bit for bit as
    when the zero gradient is computed (AdamW's momentum and weight decay still move them)."""
    model, tokenizer = tiny
    config = TrainerConfig(lr=5e-3, micro_batch_size=4, weight_decay=0.1)
    skipping = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, resolve("grpo"))
    computing = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, resolve("grpo"))
    computing._idle = lambda *_: False  # the reference: every step through the forward and backward
    mixed = _explorer_rows(model, tokenizer)
    alike = [dict(r, reward=1.0) for r in mixed]  # each group all right: advantages all 0
    first = [t.train(mixed, whole(mixed)) for t in (skipping, computing)]
    assert first[0]["train/skipped_steps"] == 0.0 and first[0]["train/grad_norm"] > 0.0
    before = [p.detach().clone() for p in skipping.model.parameters()]
    second = [t.train(alike, whole(alike)) for t in (skipping, computing)]
    assert second[0]["train/skipped_steps"] == 1.0 and second[1]["train/skipped_steps"] == 0.0
    assert second[1]["loss/total"] == 0.0 and second[1]["train/grad_norm"] == 0.0
    assert any(not torch.equal(a, b) for a, b in zip(before, skipping.model.parameters()))  # momentum moved them
    for a, b in zip(skipping.model.parameters(), computing.model.parameters()):
        assert torch.equal(a, b)
    assert skipping.steps == computing.steps == 2


def test_only_a_loss_that_vanishes_without_advantage_skips():
    assert resolve("grpo").zero_without_advantage and resolve("opmd").zero_without_advantage
    assert not resolve("grpo", kl_coef=0.05).zero_without_advantage  # the KL term has a gradient
    assert resolve("grpo", kl_coef=0.05, kl_mode="reward").zero_without_advantage
    assert not resolve("grpo", entropy_coef=0.01).zero_without_advantage
    assert not resolve("ppo").zero_without_advantage  # the critic trains on the returns
    assert not resolve("mix").zero_without_advantage and not resolve("sft").zero_without_advantage
