"""Experience rows → padded token tensors, and the log-probs of a batch's response tokens.

Layout of a batch: prompts left-padded to P, responses right-padded to R, concatenated to
(B, P + R); position ids count real tokens only, so every row is laid out exactly as the rollout
engine saw it. The logits predicting response token t are at position P − 1 + t, so the response
log-probs are read from logits[:, P−1 : P+R−1].

When it costs less, the batch also carries a packed layout (rows share prompts, as a GRPO group's
responses do, or lengths differ): each prompt once per bin, followed by responses to it, real
tokens only, in N bins of L positions, with a block mask (N, 1, L, L): a prompt token sees its
prompt's earlier tokens, a response token its prompt and its own earlier tokens. The policy's
log-probs and gradients are those of the padded layout (up to float rounding). The cost of a
layout is its linear layers' work, N·L positions, plus its attention's, N·L² (query, key) pairs
under a dense mask whatever it keeps, weighted by ``attention_pair_cost``: long bins save padding
and pay attention, so the bin size is the cheapest of ``BIN_SIZES`` (``cheapest_bins``), and the
padded layout stays when no packing costs less. Short responses pack many rows into one bin;
long ones into several bins of a few hundred positions (``benchmarks/`` measures both).

A vision-language policy's batches (``processor``) keep the padded layout and carry their rows'
pixels (``data.images.pixel_inputs``: ``pixel_values`` (B, N, C, H, W), ``pixel_attention_mask``),
made from the images stored in the rows as the explorer's engine made them from the tasks'; its
image placeholder token is never a response token (``suppressed_ids``: its logit is the lowest
float, as in the engine's sampling: a sampled placeholder would take an image's place).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from rftflow.components.data.images import PIXEL_KEYS, images_of_row, pixel_inputs, suppressed_ids

Row = Mapping[str, Any]
BIN_SIZES = (64, 128, 256, 512, 1024)  # the packed layouts tried: bins of at most this many positions
PAIR_COST = 1.0e-3  # ``attention_pair_cost`` of builtin:tiny, for callers that name no model


def attention_pair_cost(model: PreTrainedModel) -> float:
    """The forward FLOPs of one attended (query, key) pair over those of one position's linear
    layers: 4·layers·heads·head_dim / (2·Σ linear weights). 1.0e-3 for builtin:tiny, ~2.6e-4 for
    SmolLM2-135M."""
    config = getattr(model, "config", None)
    layers, heads, hidden = (getattr(config, k, None) for k in ("num_hidden_layers", "num_attention_heads", "hidden_size"))
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    if not (layers and heads and hidden and linear):  # a config that names none of them: builtin:tiny's
        return PAIR_COST
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * heads * head_dim / linear


def padded_mask(row: Row, width: int) -> list[int]:
    """A row's ``response_mask`` (all ones when it has none: every token trained), right-padded with 0 to ``width``."""
    mask = row.get("response_mask")
    mask = list(mask) if mask is not None else [1] * len(row["response_ids"])
    return mask + [0] * (width - len(mask))


def batch_tensors(rows: Sequence[Row], pad_id: int, pair_cost: float | None = PAIR_COST,
                  processor=None) -> dict[str, torch.Tensor]:
    """Rows with ``prompt_ids``, ``response_ids`` (and optional ``response_mask``) → padded tensors,
    and the packed layout when it costs less (``pair_cost``: the model's ``attention_pair_cost``;
    None: a model that does not pack, ``packs``, so no packed layout is worked out). With a
    vision-language model's ``processor``: the rows' ``images`` as pixel inputs, and its image
    placeholder's id as ``suppressed_ids`` (module docstring).

    Each tensor is made by one ``torch.tensor`` call over padded lists, not a call per row."""
    P = max(len(r["prompt_ids"]) for r in rows)
    R = max(len(r["response_ids"]) for r in rows)
    ids, attention, mask = [], [], []
    for r in rows:
        p, resp = r["prompt_ids"], r["response_ids"]
        left, right = P - len(p), R - len(resp)
        ids.append([pad_id] * left + list(p) + list(resp) + [pad_id] * right)
        attention.append([0] * left + [1] * (len(p) + len(resp)) + [0] * right)
        mask.append(padded_mask(r, R))
    input_ids = torch.tensor(ids, dtype=torch.long)  # (B, P+R)
    attention = torch.tensor(attention, dtype=torch.long)  # (B, P+R)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, P+R)
    batch = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions,
             "response_ids": input_ids[:, P:], "mask": torch.tensor(mask, dtype=torch.float32),  # (B, R) trained tokens
             "prompt_len": torch.tensor(P)}
    images = [images_of_row(r) for r in rows]
    if processor is not None:
        blind = next((r for r, some in zip(rows, images) if not some and processor.image_token_id in r["prompt_ids"]),
                     None)
        if blind is not None:  # the model would read its placeholders' embeddings instead of a picture
            raise ValueError(f"row {blind.get('experience_id', '')}: its prompt has image tokens but the row has no "
                             "images")
        suppressed = torch.tensor(suppressed_ids(processor), dtype=torch.long)
        return batch | pixel_inputs(processor.image_processor, images) | {"suppressed_ids": suppressed}
    if any(images):
        raise ValueError("rows with images need a vision-language model (its processor)")
    if pair_cost is None:
        return batch
    bins = cheapest_bins(rows, pair_cost)
    if bins_cost(bins, pair_cost) < layout_cost(len(rows), P + R, pair_cost):
        batch |= _packed(rows, bins, pad_id)
    return batch


Unit = tuple[tuple[int, ...], list[int], int]  # a prompt, some of its rows (indices), their positions in all


def layout_cost(sequences: int, length: int, pair_cost: float) -> float:
    """Forward cost of ``sequences`` × ``length`` positions under a dense mask, in positions:
    N·L·(1 + pair_cost·L) (the linear layers per position, attention per (query, key) pair)."""
    return sequences * length * (1 + pair_cost * length)


def bins_cost(bins: list[list[Unit]], pair_cost: float) -> float:
    """``layout_cost`` of bins padded to the longest."""
    return layout_cost(len(bins), max(sum(u[2] for u in units) for units in bins), pair_cost)


def cheapest_bins(rows: Sequence[Row], pair_cost: float) -> list[list[Unit]]:
    """The packed layout of least ``bins_cost`` over the bin sizes of ``BIN_SIZES``. For a size:
    each group (the rows of one prompt) is cut, in order, into as few units (the prompt once + some
    of its rows) as fit a bin; then first fit, largest unit first. A unit larger than the bin (a
    row longer than it, with its prompt) has a bin of its own. Once everything fits one bin, no
    group was cut, and a larger size would give the same bin: the sizes after it are not tried."""
    lengths = [len(r["response_ids"]) for r in rows]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r["prompt_ids"]), []).append(i)
    best, best_cost = [], float("inf")
    for size in BIN_SIZES:
        units: list[Unit] = []
        for prompt, members in groups.items():
            unit, used = [], len(prompt)
            for i in members:
                if unit and used + lengths[i] > size:
                    units.append((prompt, unit, used))
                    unit, used = [], len(prompt)
                unit.append(i)
                used += lengths[i]
            units.append((prompt, unit, used))
        bins: list[list[Unit]] = []
        room: list[int] = []
        for unit in sorted(units, key=lambda u: u[2], reverse=True):
            b = next((b for b, free in enumerate(room) if free >= unit[2]), None)
            if b is None:
                b = len(bins)
                bins.append([])
                room.append(max(size, unit[2]))
            bins[b].append(unit)
            room[b] -= unit[2]
        cost = bins_cost(bins, pair_cost)
        if cost < best_cost:
            best, best_cost = bins, cost
        if len(bins) == 1:
            break
    return best


def _packed(rows: Sequence[Row], bins: list[list[Unit]], pad_id: int) -> dict[str, torch.Tensor]:
    """The packed layout of ``bins`` (module docstring). Keys, each (N, L): ``packed_ids``,
    ``packed_positions``, ``packed_segment`` (the unit of each position within its bin, −1 for
    padding) and ``packed_owner`` (its row, −1 for a prompt's), from which ``packed_allowed`` makes
    the mask; ``logit_at`` (K, 2) the (bin, position) whose logits predict ``logit_for`` (K, 2), a
    (row, response token) of the padded layout."""
    L = max(sum(u[2] for u in units) for units in bins)
    # per bin: token ids, position ids, the unit of each position (−1: padding), its row (−1: a prompt's)
    ids, positions, segment, owner = ([[] for _ in bins] for _ in range(4))
    logit_at, logit_for = [], []
    for b, units in enumerate(bins):
        for g, (prompt, members, _) in enumerate(units):
            n = len(prompt)
            ids[b] += list(prompt)
            positions[b] += range(n)
            segment[b] += [g] * n
            owner[b] += [-1] * n
            last_prompt = len(ids[b]) - 1
            for i in members:
                resp, at = rows[i]["response_ids"], len(ids[b])
                m = len(resp)
                ids[b] += list(resp)  # a NumPy array would be added element-wise
                positions[b] += range(n, n + m)
                segment[b] += [g] * m
                owner[b] += [i] * m
                logit_at += [(b, last_prompt)] + [(b, at + t) for t in range(m - 1)] if m else []
                logit_for += [(i, t) for t in range(m)]
        pad = L - len(ids[b])
        ids[b] += [pad_id] * pad
        positions[b] += [0] * pad
        segment[b] += [-1] * pad
        owner[b] += [-1] * pad
    ids, positions, segment, owner = (torch.tensor(x, dtype=torch.long) for x in (ids, positions, segment, owner))
    return {"packed_ids": ids, "packed_positions": positions, "packed_segment": segment, "packed_owner": owner,
            "logit_at": torch.tensor(logit_at, dtype=torch.long).view(-1, 2),
            "logit_for": torch.tensor(logit_for, dtype=torch.long).view(-1, 2)}


def packed_allowed(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Which key each query of the packed layout may see, (N, L, L) bool: an earlier (or the same)
    position of its group that is a prompt token or its own row's; padding sees itself only (no
    empty row). Made from the (N, L) ``packed_segment`` and ``packed_owner`` where they are, so
    only a model that packs pays the L² mask, on its own device."""
    segment, owner = batch["packed_segment"], batch["packed_owner"]  # (N, L), (N, L)
    order = torch.arange(segment.shape[1], device=segment.device)
    return (((segment.unsqueeze(-1) == segment.unsqueeze(-2)) & (order.view(1, 1, -1) <= order.view(1, -1, 1))
             & ((owner.unsqueeze(-2) == -1) | (owner.unsqueeze(-1) == owner.unsqueeze(-2)))
             & (segment.unsqueeze(-1) >= 0)) | torch.eye(len(order), dtype=torch.bool, device=segment.device))


def packs(model: PreTrainedModel) -> bool:
    """Whether ``model`` takes the packed layout: rotary positions (read from ``position_ids``, so
    each sequence restarts at 0; ALiBi models build their bias from a 2-D mask), an attention that
    reads a 4-D mask as given (sdpa, eager), and no sliding window (a custom mask replaces the
    model's own, window included; a config that has one names it in ``sliding_window``)."""
    config = getattr(model, "config", None)  # a wrapper without one (DDP) keeps the padded layout
    if config is None:
        return False
    rotary = getattr(config, "rope_parameters", None) is not None or getattr(config, "rope_theta", None) is not None
    full = all(t == "full_attention" for t in getattr(config, "layer_types", None) or ["full_attention"])
    return (rotary and full and not getattr(config, "alibi", False) and not getattr(config, "sliding_window", None)
            and config._attn_implementation in ("sdpa", "eager"))


def _packed_logits(model: PreTrainedModel, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """Response logits (B, R, V) from one forward over the packed layout; the LM head runs on the
    columns where some bin predicts a response token (with one bin, exactly those positions)."""
    dtype = next(model.parameters()).dtype
    allowed = packed_allowed(batch).unsqueeze(1)  # (N, 1, L, L)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)
    at, target = batch["logit_at"], batch["logit_for"]  # (K, 2), (K, 2)
    columns, where = torch.unique(at[:, 1], return_inverse=True)  # positions any bin needs; each K's among them
    logits = model(input_ids=batch["packed_ids"], position_ids=batch["packed_positions"], attention_mask=mask,
                   logits_to_keep=columns).logits  # (N, C, V)
    B, R = batch["response_ids"].shape
    out = logits.new_zeros(B, R, logits.shape[-1])  # (B, R, V): padding positions stay 0 (masked by the loss)
    out[target[:, 0], target[:, 1]] = logits[at[:, 0], where]
    return out


def response_logits(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """Logits that predict each response token, divided by ``temperature``: (B, R, V). The LM head
    runs on the last R + 1 positions only (``logits_to_keep``), P − 1 … P + R − 1, not on the prompt;
    a batch with a packed layout runs it when the model takes it (``packs``)."""
    R = batch["response_ids"].shape[1]
    if "packed_ids" in batch and packs(model):
        return _packed_logits(model, batch).float() / temperature
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"],
        logits_to_keep=R + 1, **{k: batch[k] for k in PIXEL_KEYS if k in batch},
    ).logits  # (B, R+1, V)
    logits = logits[:, :R].float() / temperature  # (B, R, V)
    if "suppressed_ids" in batch:
        logits = logits.index_fill(-1, batch["suppressed_ids"], torch.finfo(logits.dtype).min)
    return logits


def response_logprobs(model: PreTrainedModel, batch: Mapping[str, torch.Tensor], temperature: float = 1.0) -> torch.Tensor:
    """log π(response token | prefix) for every response position: (B, R)."""
    logp = torch.log_softmax(response_logits(model, batch, temperature), -1)  # (B, R, V)
    return logp.gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)


def behaviour_logprobs(rows: Sequence[Row], fallback: torch.Tensor) -> torch.Tensor:
    """Each row's recorded ``response_logprobs``, padded like ``fallback`` (B, R); rows without
    them (expert rows) take ``fallback``'s values, detached."""
    old = fallback.detach()  # (B, R)
    R = old.shape[1]
    recorded = [r.get("response_logprobs") for r in rows]
    if all(lp is None for lp in recorded):
        return old.clone()
    values = torch.tensor([list(lp) + [0.0] * (R - len(lp)) if lp is not None else [0.0] * R for lp in recorded],
                          dtype=old.dtype, device=old.device)  # (B, R)
    lengths = torch.tensor([len(lp) if lp is not None else 0 for lp in recorded], device=old.device)  # (B,)
    recorded_here = torch.arange(R, device=old.device) < lengths.unsqueeze(-1)  # (B, R)
    return torch.where(recorded_here, values, old)
