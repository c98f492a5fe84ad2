"""LoRA adapters (PEFT): wrapping a policy, the merged weights an explorer samples with, and the
adapter's files (checkpoints, the registry).

An adapter directory is PEFT's own (``adapter_config.json`` + ``adapter_model.safetensors``), so it
loads with ``PeftModel.from_pretrained`` anywhere; its ``base_model_name_or_path`` names the base as
rftflow resolves it (``builtin:tiny``, a model directory, or a registered ``models:/name/version``).
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import torch
from transformers import PreTrainedModel

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"


# A vision-language model's image encoder and connector (Idefics3 / SmolVLM names): its adapter is on
# the language side only, so the pictures are seen as the base model sees them
VISION_SIDE = r"(.*\.)?(vision_model|connector)(\..*)?"


def wrap(model: PreTrainedModel, lora) -> PreTrainedModel:
    """``model`` with a new LoRA adapter (``lora``: a ``LoraConfig`` of the campaign's): the base
    frozen, only the adapter's A and B trainable (B starts at 0, so the policy starts as the base).
    On a vision-language model, on its language side only (``VISION_SIDE`` excluded)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=lora.target_modules, task_type="CAUSAL_LM",
                        exclude_modules=VISION_SIDE if hasattr(model.config, "vision_config") else None)
    with _quiet():
        return get_peft_model(model, config)


@contextlib.contextmanager
def _quiet():
    """PEFT 0.21 asks transformers a deprecated question: a FutureWarning per adapter set up."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        yield


def is_adapted(model: torch.nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


@torch.no_grad()
def merged_weights(model) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's own names, each adapted layer's W + α/r·B·A —
    what an engine holding the plain base model loads. Computed beside the trainer's tensors, not by
    PEFT's ``merge_adapter``/``unmerge_adapter``: those add and subtract ΔW in place, and the base
    would drift by float rounding with every sync (a resumed run would not be bit-exact)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter = model.active_adapter
    out: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict(keep_vars=True).items():
        if "lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = tensor.detach()
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer) and adapter in module.lora_A:
            weight = module.get_base_layer().weight
            out[f"{name}.weight"] = weight.detach() + module.get_delta_weight(adapter).to(weight.dtype)
    return out


def adapter_names(model) -> list[str]:
    """The base model's names of the adapted weights (``…q_proj.weight``): the tensors a sync changes."""
    from peft.tuners.lora import LoraLayer

    return sorted(f"{name}.weight" for name, module in model.get_base_model().named_modules()
                  if isinstance(module, LoraLayer) and model.active_adapter in module.lora_A)


def save_adapter(model, out: Path, base: str) -> None:
    """PEFT's adapter files under ``out``, with ``base`` as the base model's reference."""
    from peft.tuners.lora import Embedding

    # the embeddings are saved when the adapter has them; PEFT's "auto" would look the base up on the
    # hub (or warn, offline) to learn whether its vocabulary grew, which rftflow never does
    adapted_embeddings = any(isinstance(m, Embedding) for m in model.modules())
    model.save_pretrained(out, save_embedding_layers=adapted_embeddings)
    (out / "README.md").unlink(missing_ok=True)  # PEFT's empty model card template
    config = json.loads((out / ADAPTER_CONFIG).read_text())
    config["base_model_name_or_path"] = base
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def load_adapter(model, src: Path) -> None:
    """The adapter weights ``save_adapter`` wrote into ``model``'s adapter, in place."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(model, load_file(src / ADAPTER_WEIGHTS))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise ValueError(f"{src / ADAPTER_WEIGHTS}: not this campaign's adapter (missing {missing[:3]}, "
                         f"unexpected {list(result.unexpected_keys)[:3]})")


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str:
    """The base model an adapter directory names (``base_model_name_or_path``)."""
    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def merge_into(base: PreTrainedModel, adapter_dir: str | Path) -> PreTrainedModel:
    """``base`` with the adapter in ``adapter_dir`` merged into its weights: a plain model again."""
    from peft import PeftModel

    with _quiet():
        return PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
