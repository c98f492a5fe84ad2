"""A campaign's checkpoints: everything needed to continue after a round written to the store
(``checkpoints/vNNNNNN``), and read back to continue from it. They span rooms — the trainer, the
sampler, the buffer's state, the explorer's weights, the validation log — which is why they live
here, where those are wired together; each is passed in.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import torch

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.sampling import Sampler
from rftflow.components.buffer.weights import WeightStore
from rftflow.components.data.report import ValidationLog
from rftflow.components.train.checkpoints import load_trainer, save_trainer
from rftflow.components.train.trainer import Trainer

# buffer state a checkpoint restores: the trainer's (sampling cursors) and the explorer's (pass rates)
TRAINER_STATE, EXPLORER_STATE = ("fifo_cursor", "replay_uses"), ("pass_rates",)
RESUMABLE_STATE = TRAINER_STATE + EXPLORER_STATE


class Checkpoints:
    """The checkpoints of one campaign's trainer. ``tokens``: the tokenizer or a vision-language
    model's processor, saved with each; ``base``: the model's path (a LoRA adapter names its base);
    ``weights``: the weight sync (a restore hands the explorer the checkpoint's weights);
    ``explorer_state``: this process explores too, so a restore brings back the explorer's buffer
    state as well (an explorer process keeps its own)."""

    def __init__(self, trainer: Trainer, sampler: Sampler, store: ExperienceStore, weight_store: WeightStore,
                 weights, validation: ValidationLog, *, tokens, base: str, explorer_state: bool):
        self.trainer, self.sampler, self.store, self.weight_store = trainer, sampler, store, weight_store
        self.weights, self.validation, self.tokens, self.base = weights, validation, tokens, base
        self.explorer_state = explorer_state

    def write(self, round_no: int, policy_version: int, out: Path, **meta: Any) -> dict[str, Any]:
        """Write everything needed to continue after ``round_no`` into ``out`` — the trainer (a
        Hugging Face model directory with the tokenizer, optimizer, critic, reference), the
        samplers' and torch's RNG states, the buffer's state files, the validation log — and commit
        it to the store as ``checkpoints/vNNNNNN`` (NNNNNN = ``policy_version``). Its manifest."""
        save_trainer(self.trainer, out, base=self.base)
        self.tokens.save_pretrained(out)
        resume = {
            "round": round_no, "weight_version": policy_version,
            "sampler": {"pick": self.sampler.pick_rng.getstate(), "order": self.sampler.order_rng.getstate()},
            "torch_rng": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
            "buffer_state": {name: self.store.read_state(name) for name in RESUMABLE_STATE},
            "validation_log": self.validation.to_state(),
        }
        (out / "campaign.json").write_text(json.dumps(resume))
        meta = {**meta, "round": round_no, "weight_version": policy_version}
        self.weight_store.write_checkpoint(policy_version, out, meta)
        return {**meta, "prefix": self.weight_store.checkpoint_prefix(policy_version)}

    def read(self, version: int, into: Path) -> tuple[int, int]:
        """Continue from committed checkpoint ``version`` (downloaded into ``into``): trainer,
        explorer weights, RNG states, buffer state and validation log as they were when it was
        written. Its (round, policy version)."""
        self.weight_store.read_checkpoint(version, into)
        load_trainer(self.trainer, into)
        self.trainer.share_state()  # the trainer's other processes, if any, take it from here
        resume = json.loads((into / "campaign.json").read_text())
        policy_version = resume["weight_version"]
        self.weights.publish(policy_version)  # checkpoints follow a sync: the explorer had these weights
        for rng, saved in ((self.sampler.pick_rng, resume["sampler"]["pick"]),
                           (self.sampler.order_rng, resume["sampler"]["order"])):
            rng.setstate((saved[0], tuple(saved[1]), saved[2]))
        for name in RESUMABLE_STATE if self.explorer_state else TRAINER_STATE:  # an explorer process keeps its own
            value = resume["buffer_state"][name]
            if value is None:
                self.store.delete_state(name)
            else:
                self.store.write_state(name, value)
        self.validation.restore(resume["validation_log"])
        rng = torch.frombuffer(bytearray(base64.b64decode(resume["torch_rng"])), dtype=torch.uint8)
        torch.set_rng_state(rng.clone())
        return resume["round"], policy_version
