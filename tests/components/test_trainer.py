import copy

import pytest
import torch

from components.config import AlgorithmConfig, TrainerConfig
from components.trainer import Trainer


def _expert_row(tokenizer, prompt: str, answer: str) -> dict:
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return {"prompt_ids": ids, "response_ids": response, "source": "expert", "reward": 1.0, "group_id": prompt}


def test_round_learning_rate_follows_a_cosine_to_min_lr(tiny):
    model, tokenizer = tiny
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=1e-3, min_lr=1e-5),
                      AlgorithmConfig(name="sft", expert_per_round=1))
    assert trainer.round_lr(1, 11) == pytest.approx(1e-3)
    assert trainer.round_lr(6, 11) == pytest.approx((1e-3 + 1e-5) / 2)
    assert trainer.round_lr(11, 11) == pytest.approx(1e-5)
    constant = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=1e-3), AlgorithmConfig())
    assert constant.round_lr(7, 11) == pytest.approx(1e-3)


def test_sft_steps_change_the_weights_and_lower_the_loss(tiny):
    model, tokenizer = tiny
    policy = copy.deepcopy(model)
    before = [p.detach().clone() for p in policy.parameters()]
    trainer = Trainer(policy, tokenizer.pad_token_id, TrainerConfig(lr=3e-3, micro_batch_size=4),
                      AlgorithmConfig(name="sft", expert_per_round=4))
    rows = [_expert_row(tokenizer, f"{a} + {a} =", str(2 * a)) for a in range(4)]
    first = trainer.train(rows)["loss/sft"]
    for _ in range(20):
        last = trainer.train(rows)["loss/sft"]
    assert last < first / 2
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
