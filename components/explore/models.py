"""Model loading, and ``builtin:tiny``: a small Qwen2 causal LM with a character tokenizer.

``builtin:tiny`` is built once (fixed seed, random init), saved in Hugging Face format under the
cache directory, and from then on loaded with ``AutoModelForCausalLM``/``AutoTokenizer`` exactly
like any local model directory (Qwen2.5-0.5B-Instruct from a local dir takes the same path).
Nothing is downloaded unless the config allows it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

BUILTIN_PREFIX = "builtin:"
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")

# Architecture of the built-in models (Qwen2, grouped-query attention, tied embeddings).
BUILTIN_SPECS: dict[str, dict] = {
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0),
}
_BUILTIN_VERSION = 1  # bump when the builder changes, so stale caches are rebuilt


def cache_dir() -> Path:
    """Where built-in models are kept: ``$RFTFLOW_CACHE_DIR`` or ``~/.cache/rftflow``."""
    return Path(os.environ.get("RFTFLOW_CACHE_DIR", Path.home() / ".cache" / "rftflow"))


def build_char_tokenizer():
    """A byte-level tokenizer with no merges: one token per UTF-8 byte (so per ASCII character).

    It is a genuine ``Qwen2Tokenizer`` (vocab.json + empty merges.txt), the class transformers
    insists on for the qwen2 model type, so it loads with ``AutoTokenizer`` like any Qwen model.
    """
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *bytes_to_unicode().values()])}
    return Qwen2Tokenizer(
        vocab=vocab, merges=[], unk_token="<unk>", eos_token="<eos>", pad_token="<pad>",
        padding_side="left", clean_up_tokenization_spaces=False,
    )


def build_builtin(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Build ``builtin:<name>`` into ``out_dir`` (atomic: written to a temp dir, then renamed)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name not in BUILTIN_SPECS:
        raise ValueError(f"unknown built-in model {name!r}; known: {', '.join(BUILTIN_SPECS)}")
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id, **BUILTIN_SPECS[name],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process built it first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def check_model_path(path: str, *, allow_download: bool = False) -> None:
    """``ValueError`` naming ``model.path`` unless it is a known ``builtin:<name>``, a local Hugging
    Face model directory (with a ``config.json``), or a hub id with ``allow_download``. Builds nothing."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        if name not in BUILTIN_SPECS:
            raise ValueError(f"model.path {path!r}: unknown built-in model; known: "
                             + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_SPECS))
        return
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ValueError(f"model.path {path!r}: a directory without config.json, not a Hugging Face model")
        return
    if local.exists():
        raise ValueError(f"model.path {path!r}: not a directory")
    if not allow_download:
        raise ValueError(f"model.path {path!r}: no such directory (hub downloads are off; set "
                         "model.allow_download: true to fetch a hub id)")


def resolve_model_path(path: str, *, allow_download: bool = False) -> str:
    """``builtin:<name>`` → its cached directory (built on first use); a local dir → itself.

    Anything else is a hub id, accepted only with ``allow_download``.
    """
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        spec = json.dumps([BUILTIN_SPECS.get(name), _BUILTIN_VERSION], sort_keys=True)
        target = cache_dir() / f"builtin-{name}-{hashlib.sha256(spec.encode()).hexdigest()[:10]}"
        return str(target if target.exists() else build_builtin(name, target))
    if Path(path).is_dir() or allow_download:
        return path
    raise FileNotFoundError(
        f"model.path {path!r} is not a local directory (hub downloads are off; set model.allow_download: true)"
    )


def load_model(
    path: str, *, allow_download: bool = False, dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from ``builtin:<name>``, a local dir or (if allowed) the hub."""
    resolved = resolve_model_path(path, allow_download=allow_download)
    local_only = not allow_download
    tokenizer = AutoTokenizer.from_pretrained(resolved, local_files_only=local_only)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        resolved, local_files_only=local_only, dtype=getattr(torch, dtype)
    )
    return model, tokenizer
