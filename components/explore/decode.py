"""The decode loop's steps after the prefill: one new token per active row, its next-token logits.

Two implementations of one contract (``step(tokens, positions) -> logits``, ``keep(indices)``):

- ``CacheSteps``: the model's own forward with transformers' ``DynamicCache`` (any causal LM).
- ``LeanSteps``: the same arithmetic for the Llama family (``llama``, ``qwen2``: RMSNorm, rotary
  positions, grouped-query attention, gated MLP), written as direct tensor calls on the model's
  own weights, with K/V in buffers allocated once for the whole response.

Why a second implementation of what transformers does: at the explorer's sizes a decode step is
a few hundred small tensor ops, and transformers spends longer on the Python around them (the
module calls, the mask builders, the cache growing by ``torch.cat`` at every step) than on the
arithmetic (``benchmarks/decode_step.py`` compares the two; for larger models the matmuls
dominate and the gap narrows). The prefill stays the model's own forward: its K/V are copied into
the buffers. ``tests/components/explore/test_decode.py`` holds the two to the same logits.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from rftflow.components.explore.models import forward_with_cache

LEAN_MODELS = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}


def lean_unsupported(model) -> str | None:
    """Why ``LeanSteps`` cannot reproduce ``model``'s forward, or None when it can: the class is
    ``LlamaForCausalLM``/``Qwen2ForCausalLM`` itself (not a wrapper) with full attention in every
    layer, one tensor-parallel slice, SiLU gating, plain ``nn.Linear`` projections (not quantized
    or adapted ones) and no forward hooks, torch's or accelerate's (the lean step calls no module)."""
    cfg = model.config
    if LEAN_MODELS.get(type(model).__name__) != cfg.model_type:
        return f"{type(model).__name__} ({cfg.model_type}) is not one of {', '.join(LEAN_MODELS)}"
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return "a sliding attention window"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    if cfg.hidden_act != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    modules = list(model.modules())
    hooked = nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks
    if hooked or any(m._forward_hooks or m._forward_pre_hooks for m in modules):
        return "forward hooks"
    if any(hasattr(m, "_hf_hook") for m in modules):  # accelerate's offloading and device maps wrap forward
        return "accelerate hooks"
    projections = [model.lm_head, *(p for layer in model.model.layers for p in _projections(layer))]
    if any(type(p) is not nn.Linear for p in projections):
        return "projections other than nn.Linear"
    return None


class CacheSteps:
    """Decode steps through ``model(...)`` and its ``DynamicCache`` (after the prefill's ``cache``)."""

    def __init__(self, model, cache, attention: torch.Tensor, n: int, max_new_tokens: int):
        if n > 1:
            cache.batch_repeat_interleave(n)
        self.model, self.cache = model, cache
        self.attention = attention.repeat_interleave(n, 0)  # (N, P): 1 = a real token

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions (A,) → next-token logits (A, V)."""
        self.attention = torch.cat([self.attention, self.attention.new_ones(len(tokens), 1)], dim=-1)
        out, self.cache = forward_with_cache(self.model, self.cache, input_ids=tokens.unsqueeze(-1),
                                             attention_mask=self.attention, position_ids=positions.unsqueeze(-1))
        return out.logits[:, -1]

    def keep(self, indices: torch.Tensor) -> None:
        """Only these rows go on (finished rows leave the batch and the cache)."""
        self.attention = self.attention[indices]
        self.cache.batch_select_indices(indices)


class LeanSteps:
    """Decode steps of a Llama-family model (see ``lean_unsupported``) as direct tensor calls.

    Per layer, with n(x) = x / sqrt(mean(x²) + eps) ⊙ w (RMSNorm):
    h = x + W_o attn(rope(W_q n₁(x)) / √D, rope(W_k n₁(x)), W_v n₁(x)) and
    x' = h + W_down (silu(W_gate n₂(h)) ⊙ W_up n₂(h)); logits = W_head n(x) after the last layer.
    Attention is over the row's buffered K/V (its prompt's real tokens and its own); query head i
    reads K/V head ⌊i / (heads / kv_heads)⌋. Each layer's q, k, v projections are one matmul (and
    gate, up another) over concatenated weights (``fused_weights``).
    """

    def __init__(self, model, cache, attention: torch.Tensor, n: int, max_new_tokens: int):
        self.model, base = model, model.model
        self.layers = list(base.layers)
        first = self.layers[0].self_attn
        self.head_dim = first.head_dim
        self.heads = first.q_proj.out_features // self.head_dim
        self.kv_heads = first.k_proj.out_features // self.head_dim
        self.eps = self.layers[0].input_layernorm.variance_epsilon
        self.weights = fused_weights(model)
        prompts, prompt = attention.shape
        width = prompt + max_new_tokens
        self.keys, self.values = [], []
        for layer in cache.layers:  # each prompt's K/V (G, Hkv, P, D) into its n rows' buffers
            k = layer.keys.new_empty(prompts, n, self.kv_heads, width, self.head_dim)  # (G, n, Hkv, P+S, D)
            v = torch.empty_like(k)
            k[:, :, :, :prompt], v[:, :, :, :prompt] = layer.keys.unsqueeze(1), layer.values.unsqueeze(1)
            self.keys.append(k.view(prompts * n, self.kv_heads, width, self.head_dim))  # (N, Hkv, P+S, D)
            self.values.append(v.view(prompts * n, self.kv_heads, width, self.head_dim))
        real = attention.bool().repeat_interleave(n, 0)  # (N, P)
        self.bias = torch.full((prompts * n, width), float("-inf"), dtype=self.keys[0].dtype,
                               device=attention.device)  # (N, P+S): 0 where attended, -inf elsewhere
        self.bias[:, :prompt].masked_fill_(real, 0.0)
        self.length = prompt  # positions filled in the buffers

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # by hand: F.rms_norm's dispatch costs more than these five ops at decode sizes
        if x.dtype == torch.float32:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(self.eps)) * weight
        wide = x.float()  # half precision: the mean of squares in float32, as the model's RMSNorm does
        return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True).add_(self.eps))).to(x.dtype)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """tokens, positions (A,) → next-token logits (A, V)."""
        base, rows, t = self.model.model, len(tokens), self.length
        heads, kv, dim = self.heads, self.kv_heads, self.head_dim
        half, rotated = dim // 2, heads + kv
        x = F.embedding(tokens, base.embed_tokens.weight)  # (A, hidden)
        cos, sin = base.rotary_emb(x, positions.unsqueeze(-1))  # (A, 1, D)
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)  # rotate_half's sign, folded in
        self.bias[:, t] = 0.0
        bias = self.bias[:, None, None, :t + 1]  # (A, 1, 1, t+1)
        for layer, keys, values, w in zip(self.layers, self.keys, self.values, self.weights):
            h = self._norm(x, layer.input_layernorm.weight)
            qkv = _affine(h, w.qkv, w.qkv_bias).view(rows, heads + 2 * kv, dim)  # (A, H+2Hkv, D)
            qk = qkv[:, :rotated]
            qk = qk * cos + qk.view(rows, rotated, 2, half).flip(2).view(rows, rotated, dim) * sin  # rope
            keys[:, :, t] = qk[:, heads:]
            values[:, :, t] = qkv[:, rotated:]
            q = qk[:, :heads].reshape(rows, kv, heads // kv, dim)  # (A, Hkv, H/Hkv, D), already / √D
            scores = torch.matmul(q, keys[:, :, :t + 1].transpose(-1, -2))  # (A, Hkv, H/Hkv, t+1)
            scores += bias
            weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
            o = torch.matmul(weights, values[:, :, :t + 1])  # (A, Hkv, H/Hkv, D)
            x = _affine(o.reshape(rows, heads * dim), w.o, w.o_bias, x)
            h = self._norm(x, layer.post_attention_layernorm.weight)
            gate_up = _affine(h, w.gate_up, w.gate_up_bias)  # (A, 2I)
            inner = gate_up.shape[-1] // 2
            x = _affine(F.silu(gate_up[:, :inner]) * gate_up[:, inner:], w.down, w.down_bias, x)
        self.length = t + 1
        head = self.model.lm_head
        return _affine(self._norm(x, base.norm.weight), head.weight.t(), head.bias)  # (A, V)

    def keep(self, indices: torch.Tensor) -> None:
        """Only these rows go on (finished rows leave the batch and the buffers)."""
        self.keys = [k[indices] for k in self.keys]
        self.values = [v[indices] for v in self.values]
        self.bias = self.bias[indices]


class _Fused(NamedTuple):
    """One layer's weights as the lean step multiplies them (transposed: (in, out))."""
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    o: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up: torch.Tensor
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor
    down_bias: torch.Tensor | None


_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → (its weights' versions, fused)


def fused_weights(model) -> list[_Fused]:
    """Each layer's ``_fused`` weights, kept with the model and made again only when one of its
    weights is another tensor or was changed in place since (a weight sync, an optimizer step:
    each bumps the tensor's version counter; for the fused AdamW, ``train.optim.adamw``'s hook
    does): once per sync, not once per generate batch, as concatenating a real model's projections
    is not free."""
    sources = [p for layer in model.model.layers for p in _projections(layer)]
    versions = tuple((t.data_ptr(), t._version) for p in sources for t in (p.weight, p.bias) if t is not None)
    kept = _FUSED.get(model)
    if kept is None or kept[0] != versions:
        kept = versions, [_fused(layer) for layer in model.model.layers]
        _FUSED[model] = kept
    return kept[1]


def forget_fused(model) -> None:
    """Drop ``model``'s fused weights (a copy of its projections) when it is not decoded for a while."""
    _FUSED.pop(model, None)


def _projections(layer) -> tuple[nn.Linear, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _fused(layer) -> _Fused:
    """[W_q / √D; W_k; W_v] and [W_gate; W_up] concatenated (copies); W_o and W_down as they are."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    scales = (attn.scaling, 1.0, 1.0)
    qkv_bias = None
    if any(p.bias is not None for p in projections):
        qkv_bias = torch.cat([(p.bias if p.bias is not None else p.weight.new_zeros(p.out_features)) * s
                              for p, s in zip(projections, scales)])
    gate_up_bias = None
    if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
        gate_up_bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.out_features)
                                  for p in (mlp.gate_proj, mlp.up_proj)])
    return _Fused(qkv=torch.cat([p.weight * s for p, s in zip(projections, scales)]).t(), qkv_bias=qkv_bias,
                  o=attn.o_proj.weight.t(), o_bias=attn.o_proj.bias,
                  gate_up=torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).t(), gate_up_bias=gate_up_bias,
                  down=mlp.down_proj.weight.t(), down_bias=mlp.down_proj.bias)


def _affine(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None,
            residual: torch.Tensor | None = None) -> torch.Tensor:
    """residual + x @ weight_t + bias, as one ``addmm`` where it can be."""
    if residual is None:
        return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)
    out = torch.addmm(residual, x, weight_t)
    return out if bias is None else out.add_(bias)


PREFILL_TOKENS = 8192  # padded prompt tokens per prefill forward (see ``prefill``)


def prefill(model, prompts: list[list[int]], pad_id: int,
            pixels: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, object, torch.Tensor, torch.Tensor]:
    """The model's own forward over G prompts, left-padded to the longest (positions count from each
    prompt's first token): (last logits (G, V), its K/V cache, attention (G, P), last positions (G,)).
    ``pixels``: a vision-language model's pixel inputs for the G prompts (``data.images.pixel_inputs``,
    each (G, …)), read here only: the decode steps after it read the cache.

    Prompts of unequal length run in chunks of similar length, at most ``PREFILL_TOKENS`` padded
    tokens each (a chunk holds at least one prompt), whose caches are then left-padded with zeros
    to the longest and joined: one forward over prompts of 82 to 198 tokens is 40 % padding, and a
    prompt's K/V do not depend on the other rows of its batch. Models whose cache is not plain
    ``DynamicLayer``s (sliding windows …) take the one forward."""
    device = next(model.parameters()).device
    width = max(map(len, prompts))
    attention = torch.zeros(len(prompts), width, dtype=torch.long)  # (G, P)
    for i, p in enumerate(prompts):
        attention[i, width - len(p):] = 1
    attention = attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (G, P)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    chunks: list[list[int]] = [[]]
    for i in order:  # ascending length: a chunk's width is its last prompt's
        if chunks[-1] and (len(chunks[-1]) + 1) * len(prompts[i]) > PREFILL_TOKENS:
            chunks.append([])
        chunks[-1].append(i)
    if len(chunks) == 1 or not _joinable(model):
        chunks = [list(range(len(prompts)))]
    lasts, caches = [], []
    for chunk in chunks:
        rows = [prompts[i] for i in chunk]
        wide = max(map(len, rows))
        ids = torch.full((len(rows), wide), pad_id, dtype=torch.long)  # (C, W)
        for j, p in enumerate(rows):
            ids[j, wide - len(p):] = torch.tensor(p)
        index = torch.tensor(chunk, device=device)
        images = {k: v[index] for k, v in (pixels or {}).items()}  # (C, …) the chunk's prompts'
        out, cache = forward_with_cache(model, input_ids=ids.to(device), attention_mask=attention[index, width - wide:],
                                        position_ids=positions[index, width - wide:], logits_to_keep=1, **images)
        lasts.append(out.logits[:, -1])
        caches.append(cache)
    if len(chunks) == 1:
        return lasts[0], caches[0], attention, positions[:, -1]
    back = torch.tensor([i for chunk in chunks for i in chunk], device=device).argsort()  # rows in prompt order
    _join(caches, width, back)
    return torch.cat(lasts)[back], caches[0], attention, positions[:, -1]


def _joinable(model) -> bool:
    """Whether ``model``'s cache is plain ``DynamicLayer``s, which ``_join`` can pad and concatenate."""
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)


def _join(caches: list, width: int, back: torch.Tensor) -> None:
    """Chunks' caches → one in ``caches[0]``: each layer's K/V (C, H, W, D) left-padded with zeros to
    ``width``, concatenated, and taken in the order ``back`` (the prompts')."""
    for k, layer in enumerate(caches[0].layers):
        for name in ("keys", "values"):
            parts = [getattr(c.layers[k], name) for c in caches]
            joined = torch.cat([F.pad(t, (0, 0, width - t.shape[-2], 0)) for t in parts])
            setattr(layer, name, joined[back])


def decode_steps(model, cache, attention: torch.Tensor, n: int, max_new_tokens: int,
                 lean: bool = True) -> CacheSteps | LeanSteps:
    """The steps after the prefill of G prompts (``attention`` (G, P), ``cache`` its K/V), for n
    rows per prompt (row i·n + j is prompt i's j-th): lean where asked and the model allows it."""
    kind = LeanSteps if lean and lean_unsupported(model) is None else CacheSteps
    return kind(model, cache, attention, n, max_new_tokens)
