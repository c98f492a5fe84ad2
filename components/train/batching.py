"""Experience rows → padded token tensors, and the log-probs of a batch's response tokens.

Layout of a batch: prompts left-padded to P, responses right-padded to R, concatenated to
(B, P + R); position ids count real tokens only, so every row is laid out exactly as the rollout
engine saw it. The logits predicting response token t are at position P − 1 + t, so the response
log-probs are read from logits[:, P−1 : P+R−1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

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
    """Logits that predict each response token, divided by ``temperature``: (B, R, V). The LM head
    runs on the last R + 1 positions only (``logits_to_keep``), P − 1 … P + R − 1, not on the prompt."""
    R = batch["response_ids"].shape[1]
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
        logits_to_keep=R + 1,
    ).logits  # (B, R+1, V)
    return logits[:, :R].float() / temperature  # (B, R, V)


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
