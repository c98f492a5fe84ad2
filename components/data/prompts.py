"""Prompts as token ids: how the explorer, the trainer and ingested rows encode a prompt the same way."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat_template: bool = False) -> list[int]:
    """Prompt token ids as the explorer feeds them: raw, or wrapped in the tokenizer's chat template."""
    if chat_template:
        return list(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"])
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]
