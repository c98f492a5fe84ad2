"""The critic of PPO: a separate value model V(prefix) for every response position.

Built like veRL's and TRL's value models: the policy's architecture with a scalar head
(``AutoModelForTokenClassification``, ``num_labels=1``), its backbone initialised from the policy's
current weights and the head fresh. ``values`` are read at the same positions as the policy's
log-probs (logits[:, P−1 : P+R−1]), so V_t is the value of the prefix before response token t.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

import torch
from accelerate import Accelerator
from torch.distributed.tensor import DTensor
from transformers import AutoModelForTokenClassification, PreTrainedModel

from rftflow.components.algorithms import value_loss
from rftflow.components.train.optim import adamw


class Critic:
    """A value model with its own AdamW optimizer, trained on GAE returns with a clipped loss."""

    def __init__(self, policy: PreTrainedModel, accelerator: Accelerator, *, lr: float, weight_decay: float = 0.0,
                 grad_clip: float = 1.0, value_clip: float | None = 0.2,
                 shard: Callable[[torch.nn.Module, dict | None], None] | None = None, whole: bool = True):
        """``shard(model, weights)``: the trainer's fsdp, sharding the value model with rank 0's
        weights; ``whole``: ``policy`` holds whole weights to start from (with ``shard``, on rank 0
        only: elsewhere only its config and dtype are read)."""
        config = copy.deepcopy(policy.config)
        config.num_labels, config.classifier_dropout = 1, 0.0
        model = AutoModelForTokenClassification.from_config(config).to(policy.dtype)
        if whole:
            backbone = getattr(policy, policy.base_model_prefix)
            getattr(model, model.base_model_prefix).load_state_dict(backbone.state_dict())
        self.accelerator, self.grad_clip, self.value_clip = accelerator, grad_clip, value_clip
        if shard is None:
            self.model, self.optimizer = accelerator.prepare(model, adamw(model.parameters(), lr, weight_decay))
            return
        shard(model, model.state_dict() if whole else None)  # the head too: each process made its own at random
        self.model, self.optimizer = model, accelerator.prepare_optimizer(adamw(model.parameters(), lr, weight_decay))

    def values(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """V at each response position: (B, R), float32."""
        P, R = int(batch["prompt_len"]), batch["response_ids"].shape[1]
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         position_ids=batch["position_ids"]).logits  # (B, P+R, 1)
        return out[:, P - 1:P + R - 1, 0].float()

    def update(self, batch: Mapping[str, torch.Tensor], old_values: torch.Tensor, returns: torch.Tensor,
               agg: str = "token-mean") -> dict[str, float]:
        """One optimizer step on the clipped value loss (see ``value_loss``)."""
        values = self.values(batch)  # (B, R)
        mask = batch["mask"]
        loss = value_loss(values, old_values, returns, mask, clip=self.value_clip, agg=agg)
        self.optimizer.zero_grad()
        self.accelerator.backward(loss)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        explained = 1.0 - ((returns - values.detach()) ** 2 * mask).sum() / (
            ((returns - (returns * mask).sum() / mask.sum()) ** 2 * mask).sum().clamp(min=1e-8))
        return {"value/loss": float(loss.detach()), "value/grad_norm": float(grad_norm),
                "value/mean": float((values.detach() * mask).sum() / mask.sum().clamp(min=1.0)),
                "value/explained_variance": float(explained)}
