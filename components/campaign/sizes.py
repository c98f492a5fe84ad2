"""Sizes that cannot fit, refused before any work (``check_sizes``, called by ``preflight``).

Two checks, each a ``ValueError`` of one line naming the key to change:

- **Positions**: a single-turn response is generated after its prompt, so P + T must not pass
  the model's ``max_position_embeddings`` (P: the tokens of a sample task's prompt, T:
  ``explorer.max_new_tokens`` or ``eval.max_new_tokens``). Multi-turn episodes cut each turn to the
  room left, so they are not refused for it.
- **Memory** (docs/capacity.md): the attention keys and values and the logits of one batch, a lower
  bound of what it needs (weights, optimizer state and the other activations come on top)::

      KV(B, S)     = 2 · L · B · S · H_kv · d_head · b     keys and values of L layers
      logits(B, S) = B · S · V · b
      decode       = KV(B_d, S) + logits(B_d, 1)           the hf engine's batch: its cache, one position's logits
      train        = KV(B_t, S) + logits(B_t, S)           a micro-batch: K and V kept for the backward pass,
                                                           logits at every position

  with S = P + T, b the bytes of ``model.dtype``, B_d the rows the engine decodes at once
  (``explorer.batch_size`` in whole groups of ``repeat_times``, at most a round's rows), B_t a
  trainer process's rows of a micro-batch. Past the memory available (the GPU's free memory where
  torch sees one, else the machine's available RAM), the batch cannot run.

Nothing is loaded: the shape comes from the model's config (a built-in's spec, ``config.json``, a
GGUF's header), the prompt's tokens from its tokenizer where one is read without the model (a
built-in, a Hugging Face directory; else P counts as 0). A shape that cannot be read skips the checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rftflow.components.config import CampaignConfig, ModelConfig

GIB = 2 ** 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the sizes depend on: layers L, key/value heads H_kv, head dim d_head, vocabulary V, positions."""

    layers: int
    kv_heads: int
    head_dim: int
    vocab: int
    positions: int | None  # max_position_embeddings (None: the config does not say)

    def kv_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """KV(B, S) = 2 · L · B · S · H_kv · d_head · b."""
        return 2 * self.layers * batch * seq * self.kv_heads * self.head_dim * dtype_bytes

    def logits_bytes(self, batch: int, seq: int, dtype_bytes: int) -> int:
        """logits(B, S) = B · S · V · b."""
        return batch * seq * self.vocab * dtype_bytes


def shape_of(config) -> ModelShape:
    """A ``transformers`` config's ``ModelShape`` (a multimodal one's text model)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(text.num_hidden_layers, getattr(text, "num_key_value_heads", None) or heads, head_dim,
                      text.vocab_size, getattr(text, "max_position_embeddings", None))


def model_shape(model: ModelConfig) -> ModelShape | None:
    """``model.path``'s shape, read from its config (None: a hub id, or a config that cannot be read)."""
    from rftflow.components.explore.models import BUILTIN_PREFIX, BUILTIN_SPECS, SPECIAL_TOKENS, resolve_model_path

    path = model.path
    if path.startswith(BUILTIN_PREFIX) and path[len(BUILTIN_PREFIX):] in BUILTIN_SPECS:
        spec = BUILTIN_SPECS[path[len(BUILTIN_PREFIX):]]
        return ModelShape(spec["num_hidden_layers"], spec["num_key_value_heads"],
                          spec["hidden_size"] // spec["num_attention_heads"], len(SPECIAL_TOKENS) + 256,
                          spec["max_position_embeddings"])
    from transformers import AutoConfig

    try:
        local = Path(resolve_model_path(path, allow_download=model.allow_download))
        if local.suffix == ".gguf":  # its header only
            return shape_of(AutoConfig.from_pretrained(local.parent, gguf_file=local.name, local_files_only=True))
        if (local / "config.json").is_file():
            return shape_of(AutoConfig.from_pretrained(local, local_files_only=True))
    except Exception:  # noqa: BLE001 — a config transformers cannot read here: the model's load says why
        return None
    return None


def prompt_tokens(model: ModelConfig, prompts: list[str]) -> int:
    """The most tokens of ``prompts`` as the explorer encodes them, with a tokenizer read without the
    model (a built-in's, a Hugging Face directory's); 0 where there is none to read."""
    from rftflow.components.data.prompts import encode_prompt
    from rftflow.components.explore.models import BUILTIN_PREFIX, BUILTIN_SPECS, build_char_tokenizer

    if not prompts:
        return 0
    try:
        if model.path.startswith(BUILTIN_PREFIX) and model.path[len(BUILTIN_PREFIX):] in BUILTIN_SPECS:
            tokenizer = build_char_tokenizer()
        elif (Path(model.path).expanduser() / "tokenizer_config.json").is_file():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(Path(model.path).expanduser(), local_files_only=True)
        else:
            return 0
        return max(len(encode_prompt(tokenizer, p, model.chat_template)) for p in prompts)
    except Exception:  # noqa: BLE001 — a tokenizer that does not load here: the model's load says why
        return 0


def sample_prompts(cfg: CampaignConfig, samples: Mapping[str | None, list] | None = None) -> list[str]:
    """A task's prompt from each single-turn taskset (the campaign's, or each mixture part's): from
    ``samples`` (tasks by part, None outside a mixture: what ``preflight`` read), else read here."""
    from rftflow.components.data.tasksets import validated_tasks

    prompts = []
    for part, taskset in (cfg.part_tasksets() or {None: cfg.taskset}).items():
        if taskset.workflow == "single_turn":
            tasks = samples[part] if samples is not None else validated_tasks(taskset, 0, cfg.contracts, size=1)[0]
            prompts += [t.prompt for t in tasks[:1]]
    return prompts


def available_memory() -> int:
    """Bytes free where the campaign computes: the GPU's (torch sees one), else the machine's available RAM."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.mem_get_info()[0]
    import psutil

    return psutil.virtual_memory().available


def check_sizes(cfg: CampaignConfig, samples: Mapping[str | None, list] | None = None,
                memory: int | None = None) -> None:
    """``ValueError`` in one line when a response cannot fit the model's positions or a batch's keys,
    values and logits exceed ``memory`` (default: ``available_memory()``); see the module docstring.
    ``samples``: each taskset's tasks by part, as ``preflight`` read them (else read here)."""
    shape = model_shape(cfg.model)
    if shape is None:
        return
    prompts = sample_prompts(cfg, samples)
    p = prompt_tokens(cfg.model, prompts)
    ex, new = cfg.explorer, max(cfg.explorer.max_new_tokens, cfg.eval.max_new_tokens)
    key = "explorer.max_new_tokens" if ex.max_new_tokens >= cfg.eval.max_new_tokens else "eval.max_new_tokens"
    if shape.positions is not None and "single_turn" in cfg.workflows() and p + new > shape.positions:
        raise ValueError(f"{key} {new}: a prompt of {p} tokens and {new} new ones pass the "
                         f"{shape.positions} positions of {cfg.model.path} (max_position_embeddings); at most "
                         f"{max(0, shape.positions - p)} new tokens fit")
    b, seq = DTYPE_BYTES[cfg.model.dtype], p + new
    needs = []  # (bytes, what, key)
    if ex.engine == "hf" and cfg.mode.explores:
        rows = min(max(1, ex.batch_size // ex.repeat_times), ex.tasks_per_round) * ex.repeat_times
        needs.append((shape.kv_bytes(rows, seq, b) + shape.logits_bytes(rows, 1, b),
                      f"a decode batch of {rows} rows", "explorer.batch_size"))
    if cfg.mode.trains:
        rows = math.ceil(cfg.trainer.micro_batch_size / cfg.trainer.processes)
        needs.append((shape.kv_bytes(rows, seq, b) + shape.logits_bytes(rows, seq, b),
                      f"a micro-batch of {rows} rows", "trainer.micro_batch_size"))
    if not needs:
        return
    need, what, key = max(needs)
    memory = available_memory() if memory is None else memory
    if need > memory:
        raise ValueError(f"{key}: {what} of {seq} tokens needs at least {need / GIB:.1f} GiB for its attention keys, "
                         f"values and logits (docs/capacity.md), more than the {memory / GIB:.1f} GiB of memory "
                         "available; lower it, or the tokens per row")


__all__ = ["ModelShape", "available_memory", "check_sizes", "model_shape", "prompt_tokens", "sample_prompts",
           "shape_of"]
