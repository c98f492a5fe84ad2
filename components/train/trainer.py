"""The trainer: a round's ordered micro-batches → the algorithm's loss → AdamW steps, under ``accelerate``.

The batch arrives mixed and ordered (``buffer.sampling.TrainBatch``: rows once each, then the
micro-batches to step through); the trainer computes advantages over the rows and takes one
optimizer step per micro-batch. Token layout: ``train.batching``.

Several processes (``accelerate launch --num_processes P``, DDP: gloo on CPU, NCCL on GPUs) split
each micro-batch: process k takes the k-th contiguous 1/P of its rows (whole pairs for a pairwise
loss; all of them when there are fewer rows than processes) and the losses are aggregated as
shares of the whole micro-batch (``algorithms.aggregation.shared_batch``), so the averaged
gradient, and the update, are those of one process with the whole batch. Only rank 0 runs the
campaign (store, state, checkpoints, MLflow, weights); it announces each update to the others
(``Trainer.follow``), which hold the same model and optimizer and step with it.

With ``trainer.fsdp`` the processes hold a shard each of the policy, its gradients and AdamW's state
instead (PyTorch FSDP2, ``fully_shard`` on each decoder layer and the root; the same update). After
each update all of them gather the whole policy into rank 0's CPU copy (``unwrapped`` there), which
is what rank 0 alone reads: the weights it publishes, checkpoints and registers. The reference model
and the critic are sharded the same way (with LoRA, the base with its adapter). Gathering the rest
of a checkpoint (``checkpoint_state``) and restoring one (``load_state``) are collectives too,
announced as updates are.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import DistributedType, InitProcessGroupKwargs
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from rftflow.components.algorithms import Algorithm, LossInputs, entropy_from_logprobs, get_loss, kl_penalty, regularized
from rftflow.components.algorithms.aggregation import over_processes, shared_batch, shared_processes
from rftflow.components.algorithms.advantages import discounted_turn_advantages, turn_returns
from rftflow.components.config import TrainerConfig
from rftflow.components.train.batching import (attention_pair_cost, batch_tensors, behaviour_logprobs, packs, padded_mask,
                                      response_logits, response_logprobs)
from rftflow.components.train import adapters
from rftflow.components.train.critic import Critic
from rftflow.components.train.optim import adamw, cosine

Row = Mapping[str, Any]
# How long a trainer process beside rank 0 waits for its next update: rank 0 explores, evaluates and
# checkpoints in between (a collective's default limit, 30 min, would end a long round)
PROCESS_WAIT = timedelta(hours=24)
# fsdp: a state dict of whole tensors, gathered into rank 0's CPU memory or sent from rank 0's to every process
GATHERED = StateDictOptions(full_state_dict=True, cpu_offload=True)
FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


class ProcessCountError(ValueError):
    """The trainer runs in another number of processes than ``trainer.processes`` says (one line)."""


class Trainer:
    """Owns the policy being trained, its optimizer and the step counter (and, when the algorithm
    needs them, a frozen reference model and a critic, both made when the RL rounds start)."""

    def __init__(self, model: PreTrainedModel, pad_id: int, trainer: TrainerConfig, algorithm: Algorithm,
                 *, temperature: float = 1.0, credit: str = "final", gamma: float = 1.0, lora=None,
                 leads: bool = False, processor=None):
        self.cfg, self.algorithm, self.temperature, self.pad_id = trainer, algorithm, temperature, pad_id
        self.processor = processor  # a vision-language policy's: rows' images → pixel inputs (``batch_tensors``)
        self.credit, self.gamma = credit, gamma  # episodes' rewards → advantages (workflow.credit)
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available(),
                                       kwargs_handlers=[InitProcessGroupKwargs(timeout=PROCESS_WAIT)])
        self.processes, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        # rank 0 of a campaign announces each update to the other processes (``follow``); without it
        # every process calls the same methods with the same arguments itself
        self.leads = leads and self.processes > 1 and self.rank == 0
        self.busy = False  # rank 0: an announced update is under way
        if self.processes != trainer.processes:
            raise ProcessCountError(launch_mismatch(trainer.processes, self.processes))
        if self.accelerator.distributed_type not in (DistributedType.NO, DistributedType.MULTI_CPU,
                                                     DistributedType.MULTI_GPU):
            # accelerate's FSDP or DeepSpeed would wrap the model behind the trainer's back: the trainer
            # shards it itself (trainer.fsdp), gathering what rank 0 reads
            raise ProcessCountError(f"accelerate's {self.accelerator.distributed_type.value} is not supported: "
                                    "launch with infra/accelerate/ddp.yaml (the processes; set trainer.fsdp to "
                                    "shard the model across them)")
        self.lora = lora is not None
        if self.lora:  # the base frozen, an adapter on top (PEFT); the optimizer holds the adapter's state only
            model = adapters.wrap(model, lora)
        self.sharded = trainer.fsdp
        self.full: PreTrainedModel | None = None  # with fsdp, rank 0's whole policy (CPU), gathered after updates
        self.blank = functools.partial(type(model), model.config)  # a new policy (fsdp's reference model)
        if self.sharded:
            # FSDP2 itself, not accelerate's FSDP plugin: without CUDA accelerate launches that config as
            # unconnected single processes, while fully_shard runs over gloo as over NCCL
            self.full = copy.deepcopy(model).requires_grad_(False) if self.rank == 0 else None
            self._shard(model)
        optimizer = adamw([p for p in model.parameters() if p.requires_grad], trainer.lr, trainer.weight_decay)
        if self.sharded:  # already distributed: no DDP wrapper around it
            self.model, self.optimizer = model, self.accelerator.prepare_optimizer(optimizer)
        else:
            self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        # packed or padded micro-batches (``batch_tensors``); a model (or wrapper) that cannot take the
        # packed layout never has one worked out
        self.pair_cost = attention_pair_cost(model) if packs(self.model) else None
        self.steps = 0
        self.ref_model: PreTrainedModel | None = None
        self.base_reference = False  # LoRA: the reference is the base, the adapter disabled (from the rounds on)
        self.critic: Critic | None = None

    def prepare_rl_models(self) -> None:
        """Once, when the RL rounds start: freeze the policy as the reference model (KL, DPO; with
        LoRA the base model, its adapter disabled) and initialise the critic from it (PPO), as the
        algorithm needs."""
        if self.algorithm.needs_reference and self.ref_model is None and not self.lora:
            self.ref_model = self._sharded_copy() if self.sharded else copy.deepcopy(self.unwrapped)
            self.ref_model.eval().requires_grad_(False)
        self.base_reference = self.lora and self.algorithm.needs_reference
        if self.algorithm.needs_critic and self.critic is None:
            self.critic = Critic(self.unwrapped, self.accelerator, lr=self.cfg.critic_lr or self.cfg.lr,
                                 weight_decay=self.cfg.weight_decay, grad_clip=self.cfg.grad_clip,
                                 value_clip=self.algorithm.value_clip, shard=self._shard if self.sharded else None,
                                 whole=not self.sharded or self.full is not None)

    def _batch(self, chunk: Sequence[Row]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.accelerator.device)
                for k, v in batch_tensors(chunk, self.pad_id, self.pair_cost, self.processor).items()}

    @torch.no_grad()
    def _per_token(self, rows: Sequence[Row], fn) -> torch.Tensor:
        """``fn(chunk, batch) -> (B, R)`` over micro-batches, right-padded with 0 to (N, R_max)."""
        width = max(len(r["response_ids"]) for r in rows)
        out = torch.zeros(len(rows), width)  # (N, R_max)
        for s in range(0, len(rows), self.cfg.micro_batch_size):
            chunk = rows[s:s + self.cfg.micro_batch_size]
            batch = self._batch(chunk)
            values = (fn(chunk, batch) * batch["mask"]).cpu()  # (B, R)
            out[s:s + len(chunk), :values.shape[1]] = values
        return out

    def _reference_kl(self, chunk: Sequence[Row], batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Per-token KL_kind(behaviour ‖ reference) of explorer rows: (B, R)."""
        ref = self._reference_logprobs(batch)  # (B, R)
        return kl_penalty(behaviour_logprobs(chunk, ref), ref, self.algorithm.kl_kind)

    @property
    def has_reference(self) -> bool:
        """Whether the rounds have a reference model: a frozen copy, or with LoRA the base itself."""
        return self.ref_model is not None or self.base_reference

    @torch.no_grad()
    def _reference_logprobs(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """log π_ref of the batch's response tokens (B, R): the frozen copy's, or with LoRA the base
        model's, the adapter disabled (no second copy of the weights)."""
        if self.ref_model is not None:
            return response_logprobs(self.ref_model, batch, self.temperature)
        policy = self.accelerator.unwrap_model(self.model)  # this process's (with fsdp its shard of it)
        with policy.disable_adapter():
            return response_logprobs(policy, batch, self.temperature)

    def _advantages(self, rows: Sequence[Row]) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, float]]:
        """Advantages of all ``rows`` — (N,) outcome-level, or (N, R_max) token-level with a critic —
        plus critic targets ({old_values, returns}, (N, R_max)) and metrics. Expert rows get 0."""
        algo, metrics = self.algorithm, {}
        explorer_idx = [i for i, r in enumerate(rows) if r["source"] == "explorer"]
        if not explorer_idx or algo.advantage_fn is None:
            return torch.zeros(len(rows)), {}, metrics
        explorer_rows = [rows[i] for i in explorer_idx]
        rewards = torch.tensor([float(r["reward"]) for r in explorer_rows])  # (n,)
        kl = None
        if self.has_reference and algo.kl_mode == "reward":
            kl = self._per_token(explorer_rows, self._reference_kl)  # (n, R_max)
            metrics["reward/kl_penalised_mean"] = float((rewards - algo.kl_coef * kl.sum(-1)).mean())
        options = algo.advantage_options
        if self.credit == "discounted" and not algo.needs_critic and any(r.get("turns") for r in explorer_rows):
            return self._turn_advantages(rows, explorer_idx), {}, metrics
        if not algo.needs_critic:
            if kl is not None:
                rewards = rewards - algo.kl_coef * kl.sum(-1)
            advantages = torch.zeros(len(rows))  # (N,)
            advantages[explorer_idx] = algo.advantage_fn(rewards, [r["group_id"] for r in explorer_rows], **options)
            return advantages, {}, metrics
        # token-level (PPO): reward on the last trained (mask 1) token, −β·KL_t on every token (veRL)
        width_n = max(len(r["response_ids"]) for r in explorer_rows)
        mask = torch.tensor([padded_mask(r, width_n) for r in explorer_rows], dtype=torch.float32)  # (n, R_max)
        last = (mask * torch.arange(1, width_n + 1)).argmax(-1)  # (n,) index of the last 1
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(len(explorer_rows)), last] = rewards
        if kl is not None:
            token_rewards -= algo.kl_coef * kl
        old_values = self._per_token(explorer_rows, lambda _, batch: self.critic.values(batch))  # (n, R_max)
        adv, returns = algo.advantage_fn(token_rewards, old_values, mask, **options)
        width = max(len(r["response_ids"]) for r in rows)
        full = {name: torch.zeros(len(rows), width) for name in ("advantages", "old_values", "returns")}
        for name, value in (("advantages", adv), ("old_values", old_values), ("returns", returns)):
            full[name][explorer_idx, :value.shape[1]] = value
        metrics["value/returns_mean"] = float(returns.sum() / mask.sum())
        return full.pop("advantages"), full, metrics

    def _turn_advantages(self, rows: Sequence[Row], explorer_idx: list[int]) -> torch.Tensor:
        """Token-level advantages of episodes, each model turn credited with its discounted return
        (``discounted_turn_advantages``); (N, R_max), 0 on expert rows and on mask-0 tokens."""
        width = max(len(r["response_ids"]) for r in rows)
        returns, spans = [], []
        for i in explorer_idx:
            turns = [(t["start"], t["end"]) for t in rows[i].get("turns") or () if t["role"] == "assistant"]
            if not turns:  # a single answer: one turn, the whole response
                turns = [(0, len(rows[i]["response_ids"]))]
            spans.append(turns)
            returns.append(turn_returns(rows[i].get("step_rewards") or (), len(turns), rows[i]["reward"], self.gamma))
        out = torch.zeros(len(rows), width)
        out[explorer_idx] = discounted_turn_advantages(returns, spans, [rows[i]["group_id"] for i in explorer_idx],
                                                       width)
        return out

    @property
    def unwrapped(self) -> PreTrainedModel:
        """The policy as a plain model: with fsdp rank 0's whole copy (a shard elsewhere)."""
        return self.full if self.full is not None else self.accelerator.unwrap_model(self.model)

    def policy_weights(self) -> dict[str, torch.Tensor]:
        """The weights an explorer samples with, under the base model's names: the policy's own
        tensors, or with LoRA the base's with the adapter merged in (``adapters.merged_weights``)."""
        if self.lora:
            return adapters.merged_weights(self.unwrapped)
        return self._own_tensors

    @functools.cached_property
    def _own_tensors(self) -> dict[str, torch.Tensor]:
        return self.unwrapped.state_dict(keep_vars=True)  # updated in place by the optimizer: listed once

    def trained_names(self) -> list[str]:
        """The names (in ``policy_weights``) of the tensors training changes: the adapted layers'
        with LoRA, else all."""
        return adapters.adapter_names(self.unwrapped) if self.lora else sorted(self._own_tensors)

    @torch.no_grad()
    def logprobs_of(self, prompt_ids: Sequence[int], response_ids: Sequence[int],
                    images: Sequence = ()) -> torch.Tensor:
        """log π(response token | context) at the sampling temperature, per response token (R,);
        ``images``: the prompt's (PIL images, or a row's stored ones)."""
        row = {"prompt_ids": list(prompt_ids), "response_ids": list(response_ids), "images": list(images)}
        model = self.unwrapped
        device = next(model.parameters()).device  # fsdp: rank 0's copy is in CPU memory
        batch = {k: v.to(device)
                 for k, v in batch_tensors([row], self.pad_id, self.pair_cost, self.processor).items()}
        return response_logprobs(model, batch, self.temperature)[0].cpu()

    def _step(self, rows: Sequence[Row], batch: Mapping[str, torch.Tensor], advantages: torch.Tensor, loss_fn,
              options: dict, regularize: bool = True) -> dict[str, float]:
        """One optimizer step on ``loss_fn`` plus, when ``regularize``, the algorithm's KL term and
        entropy bonus (the rounds'; the warm start's SFT takes neither)."""
        logp = torch.log_softmax(response_logits(self.model, batch, self.temperature), -1)  # (B, R, V)
        logprobs = logp.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)  # (B, R)
        old = behaviour_logprobs(rows, logprobs)  # (B, R)
        is_expert = torch.tensor([r["source"] != "explorer" for r in rows], device=logprobs.device)  # (B,)
        if advantages.dim() == 2:  # token-level: this batch is only as wide as its longest response
            advantages = advantages[:, :logprobs.shape[1]]
        algo = self.algorithm
        kl_in_loss = regularize and algo.kl_mode == "loss"
        ref = None  # the reference's forward pass only where the KL term or the loss reads it
        if self.has_reference and (kl_in_loss or getattr(loss_fn, "needs_reference", False)):
            ref = self._reference_logprobs(batch)  # (B, R)
        inputs = LossInputs(logprobs, old, advantages.to(logprobs.device), batch["mask"], is_expert, ref)
        loss, metrics = loss_fn(inputs, **options)
        entropy_coef = algo.entropy_coef if regularize else 0.0
        entropy = entropy_from_logprobs(logp if entropy_coef else logp.detach())  # (B, R)
        loss, extra = regularized(loss, logprobs, batch["mask"], ref_logprobs=ref if kl_in_loss else None,
                                  kl_coef=algo.kl_coef, kl_kind=algo.kl_kind, entropy=entropy,
                                  entropy_coef=entropy_coef, agg=options.get("agg", "token-mean"))
        metrics = {**metrics, **extra}
        self.optimizer.zero_grad()
        self.accelerator.backward(loss)
        grad_norm = self._update()
        total = loss.detach()
        if shared_processes():  # this process's loss is its share × P: the whole micro-batch's is their mean
            total = over_processes(total, total) / self.processes
        return {**metrics, "loss/total": float(total), "train/grad_norm": float(grad_norm)}

    def _idle(self, advantages: torch.Tensor) -> bool:
        """Whether a round's micro-batch has a gradient of 0 whatever the model: its advantages are
        all 0 under an ``Algorithm.zero_without_advantage`` (every group of a GRPO round answered
        all right or all wrong). One process only: with several, each must take its part of the
        gradients' all-reduce."""
        return self.processes == 1 and self.algorithm.zero_without_advantage and not bool(advantages.any())

    def _zero_step(self) -> dict[str, float]:
        """The optimizer step on zero gradients, without a forward or backward: the update of an
        ``_idle`` micro-batch (AdamW's moments and weight decay move as after a computed zero)."""
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        self._update()
        return {"loss/total": 0.0, "train/grad_norm": 0.0}

    def _update(self) -> torch.Tensor:
        """The optimizer update from the gradients in place (clipped to ``grad_clip``), counted as a
        step; the gradients' norm before clipping. Computed and skipped steps share it, so both move
        the weights and AdamW's state the same way."""
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.steps += 1
        return grad_norm.full_tensor() if isinstance(grad_norm, DTensor) else grad_norm

    def _share(self, idx: Sequence[int]):
        """This process's rows of a micro-batch (indices) and the aggregation context to step in:
        its contiguous 1/P (in whole pairs for a pairwise loss) under ``shared_batch``, or — alone,
        or with fewer rows (pairs) than processes — all of them (each process then computes the
        same gradient, and their mean is it)."""
        idx = list(idx)
        unit = 2 if self.algorithm.pairwise else 1
        units = len(idx) // unit
        if self.processes == 1 or units < self.processes:
            return idx, contextlib.nullcontext()
        bounds = [unit * (units * k // self.processes) for k in range(self.processes)] + [len(idx)]
        return idx[bounds[self.rank]:bounds[self.rank + 1]], shared_batch(self.processes)

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def round_lr(self, round_no: int, rounds: int) -> float:
        """``lr_scale`` × (``lr`` constant, or with ``min_lr`` a cosine from ``lr`` (round 1) to
        ``min_lr`` (last round)); ``lr_scale`` is the algorithm's."""
        lr, floor, scale = self.cfg.lr, self.cfg.min_lr, self.algorithm.lr_scale
        if floor is None or rounds <= 1:
            return scale * lr
        return scale * cosine(lr, floor, (round_no - 1) / (rounds - 1))

    def train(self, rows: Sequence[Row], steps: Sequence[Sequence[int]]) -> dict[str, float]:
        """One round's update: advantages over ``rows`` (explorer rows; expert rows get 0), then one
        optimizer step per micro-batch of ``steps`` (indices into ``rows``, in training order; and
        one critic step each, with a critic). Returns metrics averaged over steps."""
        rows = list(rows)
        if not rows or not steps:
            return {"train/steps": 0.0}
        steps = [list(idx) for idx in steps]
        self._announce("train", rows, steps, self.optimizer.param_groups[0]["lr"])
        self.prepare_rl_models()
        options = self.algorithm.loss_options()
        advantages, critic_targets, metrics_extra = self._advantages(rows)
        start, sums, counts, tokens, skipped = time.perf_counter(), defaultdict(float), defaultdict(int), 0, 0
        for idx in steps:
            idx, shared = self._share(idx)
            chunk = [rows[i] for i in idx]
            if self._idle(advantages[idx]):  # no batch to build, no forward or backward
                step_metrics, skipped = self._zero_step(), skipped + 1
            else:
                batch = self._batch(chunk)
                with shared:
                    step_metrics = self._step(chunk, batch, advantages[idx], self.algorithm.loss_fn, options)
                    if self.critic is not None:
                        width = batch["mask"].shape[1]
                        targets = {k: v[idx, :width].to(self.accelerator.device) for k, v in critic_targets.items()}
                        step_metrics |= self.critic.update(batch, targets["old_values"], targets["returns"],
                                                           self.algorithm.agg)
                tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in chunk)
            for k, v in step_metrics.items():
                sums[k] += v
                counts[k] += 1
        # each metric over the steps that measured it (a skipped step measures no ratio or entropy)
        metrics = {**{k: v / counts[k] for k, v in sums.items()}, **metrics_extra}
        metrics["train/skipped_steps"] = float(skipped)
        metrics["train/steps"] = float(len(steps))
        if tokens:
            metrics["train/tokens_per_s"] = tokens / max(time.perf_counter() - start, 1e-9)
        self._gather()
        self.busy = False
        return metrics

    def warm_start(self, steps: Sequence[Sequence[Row]], peak_lr: float | None = None,
                   progress=None, first: int = 0) -> dict[str, float]:
        """One SFT step per micro-batch of expert rows in ``steps`` (an expert-only warm start), from
        step ``first`` on (a warm start resumed with the state it had after ``first`` steps).

        Learning rate: linear ramp to ``peak_lr`` over the first 5% of steps, then cosine decay to
        ``trainer.lr``, the rate the RL rounds continue with. ``progress(step, metrics)`` returning
        true ends it after that step (one process only: the others were sent every step).
        """
        steps = [list(chunk) for chunk in steps]
        self._announce("warm_start", steps, peak_lr, None, first)
        n = len(steps)
        peak, final = peak_lr or self.cfg.lr, self.cfg.lr
        ramp = max(1, n // 20)
        last: dict[str, float] = {}
        sft = get_loss("sft")
        for step in range(first, n):
            chunk = steps[step]
            if step < ramp:
                self.set_lr(peak * (step + 1) / ramp)
            else:
                self.set_lr(cosine(peak, final, (step - ramp) / max(1, n - ramp)))
            idx, shared = self._share(range(len(chunk)))
            mine = [chunk[i] for i in idx]
            with shared:
                last = self._step(mine, self._batch(mine), torch.zeros(len(mine)), sft, {"agg": "token-mean"},
                                  regularize=False)
            if progress is not None and progress(step + 1, last):
                break
        self.set_lr(final)
        self._gather()
        self.busy = False
        return last

    # fsdp -------------------------------------------------------------------------------------
    def _sharded_copy(self) -> PreTrainedModel:
        """Every process: a copy of the policy as it is now, sharded as it is (FSDP modules cannot
        be deep-copied: a new model is sharded, then takes its weights from rank 0's whole copy)."""
        with torch.random.fork_rng(devices=[]):  # its random start, overwritten, leaves the seed's sequence as it was
            copied = self.blank().to(next(self.model.parameters()).dtype)
        self._shard(copied)
        return copied

    def _shard(self, model: torch.nn.Module, weights: Mapping[str, torch.Tensor] | None = None) -> None:
        """``shard`` over this trainer's processes, from rank 0's ``weights`` (default: its whole policy)."""
        if weights is None and self.full is not None:
            weights = self.full.state_dict()
        shard(model, weights, self.accelerator.device.type, self.processes)

    def _gather(self) -> None:
        """With fsdp, every process: the whole policy into rank 0's copy (``full``)."""
        if self.sharded:
            whole = get_model_state_dict(self.model, options=GATHERED)
            if self.full is not None:
                self.full.load_state_dict(whole)  # in place: ``policy_weights`` stays a view of it

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds beside the policy: {optimizer: its state, reference: weights or
        None, critic: (weights, its optimizer's state) or None}; with fsdp gathered from every
        process (whole on rank 0 only; optimizers' keyed by parameter name)."""
        if not self.sharded:
            critic = None
            if self.critic is not None:
                critic = (self.accelerator.unwrap_model(self.critic.model).state_dict(),
                          self.critic.optimizer.state_dict())
            return {"optimizer": self.optimizer.state_dict(), "critic": critic,
                    "reference": self.ref_model.state_dict() if self.ref_model is not None else None}
        self._announce("checkpoint_state")
        reference = self.ref_model
        state = {"optimizer": get_optimizer_state_dict(self.model, self.optimizer.optimizer, options=GATHERED),
                 "reference": get_model_state_dict(reference, options=GATHERED) if reference is not None else None,
                 "critic": None}
        if self.critic is not None:
            critic = self.critic.model
            state["critic"] = (get_model_state_dict(critic, options=GATHERED),
                               get_optimizer_state_dict(critic, self.critic.optimizer.optimizer, options=GATHERED))
        self.busy = False
        return state

    def load_state(self, model: Mapping[str, torch.Tensor] | None, optimizer: Mapping[str, Any] | None, steps: int,
                   lr: float, reference: Mapping[str, torch.Tensor] | None = None, critic=None) -> None:
        """Continue from a checkpoint: the policy's weights (None: loaded already, a LoRA adapter),
        the optimizer's state (``checkpoint_state``'s), step count, learning rate, and the reference
        model's weights and the critic's (weights, optimizer state) if there are any. With fsdp
        every process takes them, rank 0 sending them to the others' shards (elsewhere the tensors
        are None, or empty for the parts there are); else the others take them from ``share_state``."""
        if self.sharded:
            counters = {"steps": steps, "lr": lr, "reference": reference is not None, "critic": critic is not None}
            self._announce("shards", counters)
            self._take_shards(counters, model, optimizer, reference, critic)
            self.busy = False
            return
        self._take_state({"model": model, "optimizer": optimizer, "steps": steps, "lr": lr, "reference": reference,
                          "critic": critic})

    # several processes ----------------------------------------------------------------------
    def _announce(self, command: str, *args: Any) -> None:
        """Rank 0 of several: send the others (``follow``) the next command and its arguments."""
        if self.leads:
            dist.broadcast_object_list([(command, args)], src=0)
            self.busy = command != "stop"  # until this process has done its part of the command

    def share_state(self) -> None:
        """Rank 0, after restoring a checkpoint: give the others its model, optimizer, step count,
        learning rate (and reference and critic), so all step from the same state."""
        if not self.leads or self.sharded:  # with fsdp, ``load_state`` gave it to every process
            return
        self._announce("state", {**self.checkpoint_state(), "model": self.unwrapped.state_dict(), "steps": self.steps,
                                 "lr": self.optimizer.param_groups[0]["lr"]})
        self.busy = False

    def _take_state(self, state: Mapping[str, Any]) -> None:
        if state["model"] is not None:  # None: a LoRA adapter, loaded into the model already
            self.unwrapped.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = state["steps"]
        self.set_lr(state["lr"])
        if state["reference"] is not None or state["critic"] is not None:
            self.prepare_rl_models()
        if state["reference"] is not None:
            self.ref_model.load_state_dict(state["reference"])
        if state["critic"] is not None:
            self.accelerator.unwrap_model(self.critic.model).load_state_dict(state["critic"][0])
            self.critic.optimizer.load_state_dict(state["critic"][1])

    def _take_shards(self, counters: Mapping[str, Any], model=None, optimizer=None, reference=None,
                     critic=None) -> None:
        """fsdp, every process: a checkpoint's state, whole on rank 0 (``load_state``'s arguments;
        None elsewhere), sent to every process's shards; ``counters``: steps, lr, and whether there
        is a reference and a critic."""
        if self.full is not None:  # first: setting the shards turns the dict's tensors into them
            self.full.load_state_dict(model)
        set_model_state_dict(self.model, model or {}, options=FROM_RANK0)
        set_optimizer_state_dict(self.model, self.optimizer.optimizer, optimizer or {}, options=FROM_RANK0)
        self.steps = counters["steps"]
        self.set_lr(counters["lr"])
        if counters["reference"] or counters["critic"]:
            self.prepare_rl_models()
        if counters["reference"]:
            set_model_state_dict(self.ref_model, reference or {}, options=FROM_RANK0)
        if counters["critic"]:
            weights, state = critic or ({}, {})
            set_model_state_dict(self.critic.model, weights, options=FROM_RANK0)
            set_optimizer_state_dict(self.critic.model, self.critic.optimizer.optimizer, state, options=FROM_RANK0)

    def _follow_train(self, rows: Sequence[Row], steps: Sequence[Sequence[int]], lr: float) -> None:
        self.set_lr(lr)
        self.train(rows, steps)

    def release(self) -> None:
        """Rank 0: the campaign is over (or stopping); the other processes return from ``follow``.
        Not while an update failed half-way (its collectives unfinished): the others then fail
        when this process is gone."""
        if self.leads and not self.busy:
            self._announce("stop")
            self.leads = False

    def follow(self) -> None:
        """Ranks > 0: do what rank 0 announces — a round's update, the warm start, its restored
        state — step for step with it, until it says stop."""
        handlers = {"train": self._follow_train, "warm_start": self.warm_start, "state": self._take_state,
                    "checkpoint_state": self.checkpoint_state, "shards": self._take_shards}
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=0)
            command, args = box[0]
            if command == "stop":
                return
            handlers[command](*args)


def shard(model: torch.nn.Module, weights: Mapping[str, torch.Tensor] | None, device: str,
          processes: int) -> None:
    """FSDP2 over ``processes``: each decoder layer (the classes transformers keeps whole,
    ``_no_split_modules``) its own unit, the rest (embeddings, norm, head) the root's; then every
    process takes its shards of rank 0's ``weights`` (whole there, None elsewhere), as DDP
    broadcasts rank 0's at the start (what a process made at random differs from rank 0's)."""
    mesh = init_device_mesh(device, (processes,))
    units = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in units:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    set_model_state_dict(model, weights or {}, options=FROM_RANK0)


def launch_mismatch(configured: int, launched: int) -> str:
    """The one line for a trainer launched in another number of processes than configured."""
    how = (f"accelerate launch --config_file infra/accelerate/ddp.yaml --num_processes {configured} -m rftflow run …"
           if configured > 1 else "rftflow run … (no accelerate launch)")
    return (f"trainer.processes is {configured} but the trainer was launched in {launched} process"
            f"{'es' if launched != 1 else ''}: start it with `{how}`, or set trainer.processes={launched} "
            "(a campaign resumes only with the number it started with)")
