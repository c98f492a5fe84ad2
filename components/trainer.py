"""The trainer: experiences → token tensors → the algorithm's loss → AdamW steps, under ``accelerate``.

Layout of a training batch: prompts left-padded to P, responses right-padded to R, concatenated
to (B, P + R); position ids count real tokens only, so every row is laid out exactly as the
rollout engine saw it. The response log-probs are read from logits[:, P−1 : P+R−1].
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel

from components.algorithms import LossInputs, entropy_from_logprobs, get_advantage, get_loss, kl_penalty, regularized
from components.config import AlgorithmConfig, TrainerConfig

Row = Mapping[str, Any]


def batch_tensors(rows: Sequence[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Rows with ``prompt_ids``, ``response_ids`` (and optional ``response_mask``) → padded tensors."""
    P = max(len(r["prompt_ids"]) for r in rows)
    R = max(len(r["response_ids"]) for r in rows)
    B = len(rows)
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)  # (B, P+R)
    attention = torch.zeros((B, P + R), dtype=torch.long)  # (B, P+R)
    mask = torch.zeros((B, R), dtype=torch.float32)  # (B, R) trained response tokens
    for i, r in enumerate(rows):
        p, resp = r["prompt_ids"], r["response_ids"]
        input_ids[i, P - len(p):P] = torch.tensor(p)
        input_ids[i, P:P + len(resp)] = torch.tensor(resp)
        attention[i, P - len(p):P + len(resp)] = 1
        rmask = r.get("response_mask")
        mask[i, :len(resp)] = torch.tensor(rmask, dtype=torch.float32) if rmask is not None else 1.0
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, P+R)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions,
            "response_ids": input_ids[:, P:], "mask": mask, "prompt_len": torch.tensor(P)}


def response_logits(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict each response token, divided by ``temperature``: (B, R, V)."""
    P = int(batch["prompt_len"])
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits  # (B, P+R, V)
    R = batch["response_ids"].shape[1]
    return logits[:, P - 1:P + R - 1].float() / temperature  # (B, R, V)


def response_logprobs(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """log π(response token | prefix) for every response position: (B, R)."""
    logp = torch.log_softmax(response_logits(model, batch, temperature), -1)  # (B, R, V)
    return logp.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)


def behaviour_logprobs(rows: Sequence[Row], fallback: torch.Tensor) -> torch.Tensor:
    """Each row's recorded ``response_logprobs``, padded like ``fallback`` (B, R); rows without
    them (expert rows) take ``fallback``'s values, detached."""
    old = fallback.detach().clone()  # (B, R)
    for i, r in enumerate(rows):
        if r.get("response_logprobs") is not None:
            old[i, :len(r["response_ids"])] = torch.tensor(r["response_logprobs"])
    return old


def cosine(start: float, end: float, progress: float) -> float:
    """Cosine interpolation from ``start`` (progress 0) to ``end`` (progress 1)."""
    return end + 0.5 * (start - end) * (1 + math.cos(math.pi * progress))


class Trainer:
    """Owns the policy being trained, its optimizer and the step counter."""

    def __init__(self, model: PreTrainedModel, pad_id: int, trainer: TrainerConfig, algorithm: AlgorithmConfig,
                 *, temperature: float = 1.0, seed: int = 0):
        self.cfg, self.algorithm, self.temperature, self.pad_id = trainer, algorithm, temperature, pad_id
        self.accelerator = Accelerator(cpu=not torch.cuda.is_available())
        optimizer = torch.optim.AdamW(model.parameters(), lr=trainer.lr, weight_decay=trainer.weight_decay)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.rng = random.Random(seed)
        self.steps = 0
        self.ref_model: PreTrainedModel | None = None  # frozen copy, made when the RL rounds start

    def _reference(self) -> None:
        """Freeze the current policy as the reference model (once), if the algorithm uses KL."""
        if self.algorithm.kl_coef > 0 and self.ref_model is None:
            self.ref_model = copy.deepcopy(self.unwrapped).eval().requires_grad_(False)

    @torch.no_grad()
    def _kl_penalised_rewards(self, rows: Sequence[Row]) -> list[float]:
        """reward − β · Σ_t KL_t(behaviour ‖ reference) for each explorer row (``kl_mode: reward``)."""
        out = []
        for s in range(0, len(rows), self.cfg.micro_batch_size):
            chunk = rows[s:s + self.cfg.micro_batch_size]
            batch = batch_tensors(chunk, self.pad_id)
            ref = response_logprobs(self.ref_model, batch, self.temperature)  # (B, R)
            old = behaviour_logprobs(chunk, ref)  # (B, R)
            kl = (kl_penalty(old, ref, self.algorithm.kl_kind) * batch["mask"]).sum(-1)  # (B,)
            out.extend(float(r["reward"]) - self.algorithm.kl_coef * float(k) for r, k in zip(chunk, kl))
        return out

    @property
    def unwrapped(self) -> PreTrainedModel:
        return self.accelerator.unwrap_model(self.model)

    def _step(self, rows: Sequence[Row], advantages: torch.Tensor, loss_name: str, options: dict) -> dict[str, float]:
        batch = {k: v.to(self.accelerator.device) for k, v in batch_tensors(rows, self.pad_id).items()}
        logp = torch.log_softmax(response_logits(self.model, batch, self.temperature), -1)  # (B, R, V)
        logprobs = logp.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)  # (B, R)
        old = behaviour_logprobs(rows, logprobs)  # (B, R)
        is_expert = torch.tensor([r["source"] != "explorer" for r in rows], device=logprobs.device)  # (B,)
        inputs = LossInputs(logprobs, old, advantages.to(logprobs.device), batch["mask"], is_expert)
        loss, metrics = get_loss(loss_name)(inputs, **options)
        algo = self.algorithm
        ref = None
        if self.ref_model is not None and algo.kl_mode == "loss":
            with torch.no_grad():
                ref = response_logprobs(self.ref_model, batch, self.temperature)  # (B, R)
        entropy = entropy_from_logprobs(logp if algo.entropy_coef else logp.detach())  # (B, R)
        loss, extra = regularized(loss, logprobs, batch["mask"], ref_logprobs=ref, kl_coef=algo.kl_coef,
                                  kl_kind=algo.kl_kind, entropy=entropy, entropy_coef=algo.entropy_coef,
                                  agg=options.get("agg", "token-mean"))
        metrics = {**metrics, **extra}
        self.optimizer.zero_grad()
        self.accelerator.backward(loss)
        grad_norm = self.accelerator.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        self.steps += 1
        return {**metrics, "loss/total": float(loss.detach()), "train/grad_norm": float(grad_norm)}

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def round_lr(self, round_no: int, rounds: int) -> float:
        """``lr`` constant, or with ``min_lr`` a cosine from ``lr`` (round 1) to ``min_lr`` (last round)."""
        lr, floor = self.cfg.lr, self.cfg.min_lr
        if floor is None or rounds <= 1:
            return lr
        return cosine(lr, floor, (round_no - 1) / (rounds - 1))

    def train(self, rows: Sequence[Row]) -> dict[str, float]:
        """One round's update: advantages over explorer rows, then ``epochs`` shuffled passes in
        micro-batches, one optimizer step each. Returns metrics averaged over steps."""
        rows = list(rows)
        if not rows:
            return {"train/steps": 0.0}
        algo = self.algorithm
        loss_name, options = algo.setting("loss"), algo.loss_options()
        explorer_idx = [i for i, r in enumerate(rows) if r["source"] == "explorer"]
        advantages = torch.zeros(len(rows))  # (N,) expert rows keep 0: their term is SFT
        self._reference()
        metrics_extra: dict[str, float] = {}
        if explorer_idx and algo.setting("advantage"):
            explorer_rows = [rows[i] for i in explorer_idx]
            if self.ref_model is not None and algo.kl_mode == "reward":
                rewards = torch.tensor(self._kl_penalised_rewards(explorer_rows))
                metrics_extra["reward/kl_penalised_mean"] = float(rewards.mean())
            else:
                rewards = torch.tensor([r["reward"] for r in explorer_rows])
            groups = [r["group_id"] for r in explorer_rows]
            advantages[explorer_idx] = get_advantage(algo.setting("advantage"))(
                rewards, groups, **algo.setting("advantage_options")
            )
        start, sums, tokens = time.perf_counter(), defaultdict(float), 0
        n_steps = 0
        for _ in range(self.cfg.epochs):
            order = list(range(len(rows)))
            self.rng.shuffle(order)
            for s in range(0, len(order), self.cfg.micro_batch_size):
                idx = order[s:s + self.cfg.micro_batch_size]
                chunk = [rows[i] for i in idx]
                for k, v in self._step(chunk, advantages[idx], loss_name, options).items():
                    sums[k] += v
                tokens += sum(len(r["prompt_ids"]) + len(r["response_ids"]) for r in chunk)
                n_steps += 1
        metrics = {**{k: v / n_steps for k, v in sums.items()}, **metrics_extra}
        metrics["train/steps"] = float(n_steps)
        metrics["train/tokens_per_s"] = tokens / max(time.perf_counter() - start, 1e-9)
        return metrics

    def warm_start(self, expert_rows: Sequence[Row], steps: int, peak_lr: float | None = None,
                   progress=None) -> dict[str, float]:
        """``steps`` SFT steps on micro-batches sampled from ``expert_rows`` (an expert-only warm start).

        Learning rate: linear ramp to ``peak_lr`` over the first 5% of steps, then cosine decay to
        ``trainer.lr``, the rate the RL rounds continue with.
        """
        peak, final = peak_lr or self.cfg.lr, self.cfg.lr
        ramp = max(1, steps // 20)
        last: dict[str, float] = {}
        pool = list(expert_rows)
        for step in range(steps):
            if step < ramp:
                self.set_lr(peak * (step + 1) / ramp)
            else:
                self.set_lr(cosine(peak, final, (step - ramp) / max(1, steps - ramp)))
            chunk = self.rng.sample(pool, min(self.cfg.micro_batch_size, len(pool)))
            last = self._step(chunk, torch.zeros(len(chunk)), "sft", {"agg": "token-mean"})
            if progress is not None:
                progress(step + 1, last)
        self.set_lr(final)
        return last
