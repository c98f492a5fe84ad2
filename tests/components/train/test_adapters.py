"""LoRA adapters: the merged weights an explorer loads are the adapted policy, an adapter
checkpoint continues bit for bit, and a campaign checks each sync and fails loudly on one that
did not arrive (by the weights' sha256 where the engine holds them, by log-probs where it cannot say)."""

from __future__ import annotations

import copy

import pytest
import torch

from rftflow.components.algorithms import resolve
from rftflow.components.config import LoraConfig, TrainerConfig
from rftflow.components.train import adapters
from rftflow.components.train.batching import batch_tensors, response_logprobs
from rftflow.components.train.checkpoints import load_trainer, save_trainer
from rftflow.components.train.trainer import Trainer
from tests.components.train.test_trainer import _explorer_rows, whole


def _lora_trainer(tiny) -> Trainer:
    model, tokenizer = tiny
    return Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=5e-3, micro_batch_size=4),
                   resolve("grpo", kl_coef=0.05), lora=LoraConfig(rank=4, alpha=8))


def test_merged_weights_make_the_plain_model_the_adapted_policy_and_leave_the_base_as_it_was(tiny):
    model, tokenizer = tiny
    trainer = _lora_trainer(tiny)
    rows = _explorer_rows(model, tokenizer)
    for _ in range(5):
        trainer.train(rows, whole(rows))
    merged = trainer.policy_weights()
    plain = copy.deepcopy(model)
    plain.load_state_dict(merged)  # strict: exactly the base model's names
    batch = batch_tensors(rows, tokenizer.pad_token_id)
    ours, adapted, base = (response_logprobs(m, batch) for m in (plain, trainer.model, model))
    assert torch.allclose(ours, adapted, atol=1e-5) and (adapted - base).abs().max() > 1e-3
    peft_merged = copy.deepcopy(trainer.unwrapped).merge_and_unload().state_dict()  # PEFT's own merge agrees
    assert all(torch.allclose(merged[k], peft_merged[k], atol=1e-6) for k in peft_merged)
    names = trainer.trained_names()
    assert names and all(n.endswith("_proj.weight") for n in names)
    untouched = model.state_dict()
    assert all(torch.equal(merged[k], untouched[k]) for k in merged if k not in names)
    base_layers = trainer.unwrapped.get_base_model().state_dict()
    assert all(torch.equal(base_layers[k.replace(".weight", ".base_layer.weight")], untouched[k]) for k in names)


def test_a_lora_trainer_continues_exactly_from_its_adapter_checkpoint(tiny, tmp_path):
    model, tokenizer = tiny
    rows = _explorer_rows(model, tokenizer)
    trainer = _lora_trainer(tiny)
    trainer.train(rows, whole(rows))
    save_trainer(trainer, tmp_path, base="builtin:tiny")
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "trainer.json"} <= set(files)
    assert "model.safetensors" not in files and adapters.adapter_base(tmp_path) == "builtin:tiny"
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    assert files["adapter_model.safetensors"] < full / 10 and files["optimizer.pt"] < full / 4

    fresh = _lora_trainer(tiny)
    load_trainer(fresh, tmp_path)
    later = [t.train(rows, whole(rows)) for t in (trainer, fresh)]
    assert later[0]["loss/total"] == later[1]["loss/total"]
    for (name, x), (_, y) in zip(trainer.unwrapped.state_dict().items(), fresh.unwrapped.state_dict().items()):
        assert torch.equal(x, y), name


def test_each_sync_is_checked_and_one_that_did_not_arrive_fails_the_round(tmp_path, default_config, small):
    from rftflow.components.campaign.schedule import ROUND
    from rftflow.components.campaign.stages import Campaign
    from rftflow.components.explore.sync import SyncMismatch

    campaign = Campaign.from_config(default_config, tmp_path, [
        *small, "name=lora-sync", "model.lora={rank: 8, alpha: 16}", "trainer.lr=2e-2", "sync.check_logprobs_every=1"])
    campaign.prepare()
    campaign.warm_start()
    for round_no in (1, 2):
        metrics = campaign.run_round(round_no)
        assert metrics["sync/checked"] == 1.0 and metrics["sync/logprob_max_diff"] < 1e-4

    def skipped_sync(round_no: int) -> None:  # train, then a sync that never reaches the engine
        for stage in ROUND[:-1]:
            campaign.stage(stage, round_no)
        campaign.engine.load_state_dict = lambda weights: None

    skipped_sync(3)
    version = campaign.policy_version
    with pytest.raises(SyncMismatch, match=f"weight sync of version {version} did not arrive: the explorer's weights have "
                                           "sha256 [0-9a-f]{12}, the trainer published [0-9a-f]{12}"):
        campaign.sync(3)
    campaign.engine.holds = lambda weights, names: None  # an engine that cannot say (a server): log-probs tell
    probe = campaign.engine.encode(campaign.splits.train[0].prompt)
    [[sampled]] = campaign.engine.generate_ids([probe], max_new_tokens=16, temperature=1.0)
    moved = (campaign.trainer.logprobs_of(probe, sampled.response_ids) - torch.tensor(sampled.logprobs)).abs().max()
    assert moved > campaign.cfg.sync.logprob_tolerance  # the adapter moved enough to matter
    with pytest.raises(SyncMismatch, match=rf"weight sync of version {version}: the explorer's log-probs differ from the "
                                           r"trainer's by up to [0-9.]+ nats \(tolerance 0.02\)"):
        campaign.sync(3)
