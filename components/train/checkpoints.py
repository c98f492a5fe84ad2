"""Trainer checkpoints: everything a ``Trainer`` needs to continue bit for bit, in a directory.

Layout (the policy part is a Hugging Face model directory, loadable with ``from_pretrained``)::

    model.safetensors, config.json, generation_config.json   the policy's weights
      (LoRA: adapter_model.safetensors, adapter_config.json    the adapter, naming its base)
    optimizer.pt                                              AdamW state (torch.save)
    trainer.json                                              step count, learning rate
    critic/ + critic_optimizer.pt                             PPO's value model, when there is one
    reference/                                                the frozen reference model (KL, DPO)

Weights are safetensors; the optimizer state is ``torch.save``'s format (tensors and step counts,
read back with ``weights_only=True``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from rftflow.components.train import adapters
from rftflow.components.train.trainer import Trainer


OPTIMIZER, CRITIC_OPTIMIZER = "optimizer.pt", "critic_optimizer.pt"
OPTIMIZER_FILES = (OPTIMIZER, CRITIC_OPTIMIZER)  # resume state only: 2x the weights' size under AdamW


def save_trainer(trainer: Trainer, out: Path, base: str | None = None) -> None:
    """Write ``trainer``'s policy, optimizer, counters (and critic, reference) under ``out``; with
    LoRA the policy is its adapter, naming ``base`` as its base model. Called by several processes
    at once (each its part of gathering a sharded optimizer state), rank 0 alone writes."""
    state = trainer.checkpoint_state()
    if trainer.rank != 0:
        return
    out.mkdir(parents=True, exist_ok=True)
    if trainer.lora:
        adapters.save_adapter(trainer.unwrapped, out, base or trainer.unwrapped.get_base_model().name_or_path)
    else:
        trainer.unwrapped.save_pretrained(out)
    torch.save(state["optimizer"], out / OPTIMIZER)
    lr = trainer.optimizer.param_groups[0]["lr"]
    (out / "trainer.json").write_text(json.dumps({"steps": trainer.steps, "lr": lr}))
    if state["critic"] is not None:  # (with fsdp the state dicts are whole; the models hold shards)
        trainer.accelerator.unwrap_model(trainer.critic.model).save_pretrained(out / "critic",
                                                                               state_dict=state["critic"][0])
        torch.save(state["critic"][1], out / CRITIC_OPTIMIZER)
    if state["reference"] is not None:
        trainer.ref_model.save_pretrained(out / "reference", state_dict=state["reference"])


def load_trainer(trainer: Trainer, src: Path) -> None:
    """Restore what ``save_trainer`` wrote into ``trainer`` (made with the same config). With fsdp
    rank 0 reads it and every process takes its shards from rank 0 (several may call this at once)."""
    counters = json.loads((src / "trainer.json").read_text())
    has_reference, has_critic = (src / "reference").is_dir(), (src / "critic").is_dir()
    if trainer.sharded and trainer.rank != 0:  # told what there is; the tensors come from rank 0
        trainer.load_state(None, None, counters["steps"], counters["lr"], {} if has_reference else None,
                           ({}, {}) if has_critic else None)
        return
    model = None
    if trainer.lora:
        adapters.load_adapter(trainer.unwrapped, src)
        if trainer.sharded:  # rank 0's whole copy holds it: its weights go to every process's shards
            model = trainer.unwrapped.state_dict()
    else:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=trainer.unwrapped.dtype).state_dict()
    reference = critic = None
    if has_reference:
        reference = AutoModelForCausalLM.from_pretrained(src / "reference").state_dict()
    if has_critic:
        critic = (AutoModelForTokenClassification.from_pretrained(src / "critic").state_dict(),
                  torch.load(src / CRITIC_OPTIMIZER, weights_only=True))
    trainer.load_state(model, torch.load(src / OPTIMIZER, weights_only=True), counters["steps"], counters["lr"],
                       reference, critic)
