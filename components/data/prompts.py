"""Prompts as token ids: how the explorer, the trainer and ingested rows encode a prompt the same way."""

from __future__ import annotations

import functools

from transformers import PreTrainedTokenizerBase


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str, chat_template: bool = False) -> list[int]:
    """Prompt token ids as the explorer feeds them: raw, or wrapped in the tokenizer's chat template."""
    if chat_template:
        return list(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"])
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def encode_image_prompt(processor, prompt: str, images, chat_template: bool = False) -> list[int]:
    """A vision-language model's prompt token ids: one image placeholder per image before the text
    (in the processor's chat template, or bare), each expanded by the processor into the image's
    tokens (Idefics3: ``<fake_token_around_image><global-img>`` + ``<image>`` × image_seq_len +
    ``<fake_token_around_image>``), as the explorer feeds them and the trainer reads them."""
    if chat_template:
        content = [*({"type": "image"} for _ in images), {"type": "text", "text": prompt}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True)
    else:
        text = processor.image_token * len(images) + prompt
    return list(_expanded_ids(processor, text, tuple(image.size for image in images)))


@functools.lru_cache(maxsize=1024)
def _expanded_ids(processor, text: str, sizes: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """``text``'s ids with its image placeholders expanded for images of ``sizes``: how many tokens
    an image takes depends on its size (Idefics3's tiles), not its pixels, so blank images of those
    sizes stand in (the processor's pixel work, ~10 ms an image, is done once per prompt and size)."""
    from PIL import Image

    blanks = [Image.new("RGB", size, "white") for size in sizes]
    return tuple(processor(text=[text], images=[blanks])["input_ids"][0])


def image_block(processor, size: tuple[int, int]) -> list[int]:
    """The token ids one image of ``size`` expands into (``encode_image_prompt``'s expansion of one
    placeholder, without what the tokenizer adds around any text)."""
    plain = list(processor.tokenizer(processor.image_token)["input_ids"])
    at = plain.index(processor.image_token_id)
    expanded = _expanded_ids(processor, processor.image_token, (tuple(size),))
    return list(expanded[at:len(expanded) - (len(plain) - at - 1)])
