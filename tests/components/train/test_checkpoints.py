"""A trainer saved and loaded into a fresh one continues bit for bit: policy, optimizer, counters,
and the critic and reference model an algorithm keeps."""

import copy

import torch

from rftflow.components.algorithms import resolve
from rftflow.components.config import TrainerConfig
from rftflow.components.train.checkpoints import load_trainer, save_trainer
from rftflow.components.train.trainer import Trainer
from tests.components.train.test_trainer import _explorer_rows, whole


def test_a_ppo_trainer_with_critic_and_reference_continues_exactly_after_a_round_trip(tiny, tmp_path):
    model, tokenizer = tiny
    algorithm = resolve("ppo", kl_coef=0.05)  # a critic (GAE) and a reference model (KL)
    config = TrainerConfig(lr=1e-3, micro_batch_size=4, critic_lr=1e-3)
    rows = _explorer_rows(model, tokenizer)
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, algorithm)
    trainer.train(rows, whole(rows))
    save_trainer(trainer, tmp_path)
    assert {"model.safetensors", "config.json", "optimizer.pt", "trainer.json"} <= {p.name for p in tmp_path.iterdir()}
    assert (tmp_path / "critic" / "model.safetensors").is_file() and (tmp_path / "reference" / "model.safetensors").is_file()

    fresh = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, config, algorithm)
    load_trainer(fresh, tmp_path)
    assert fresh.steps == trainer.steps
    later = [t.train(rows, whole(rows)) for t in (trainer, fresh)]  # the same next step on both
    assert later[0]["loss/total"] == later[1]["loss/total"]
    for a, b in ((trainer.unwrapped, fresh.unwrapped), (trainer.ref_model, fresh.ref_model),
                 (trainer.critic.model, fresh.critic.model)):
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.equal(x, y), name
