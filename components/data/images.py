"""Images of tasks and experiences: stored as encoded bytes (PNG) with their sha256, decoded to
PIL images for a vision-language model's processor.

- A task holds its images in ``metadata["images"]``: a list of ``{"sha256": hex, "data": base64}``
  (JSON, like the rest of a task's metadata), in the order of the prompt's image placeholders.
- An experience row holds them in its ``images`` column: a list of ``{"sha256", "key", "data"}``
  structs, so a row can be replayed without its taskset (in the store, ``data`` is null and the
  bytes are the object at ``key``, stored once: ``buffer.images``).
- A task's identity includes its images' hashes (``tasksets.task_id``): one question asked of
  two pictures is two tasks.

``pixel_inputs`` turns the images of a batch of prompts into the tensors an Idefics3-style model
takes, the same way for the explorer's engine and the trainer, so both see the same pixels.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from PIL import Image

ImageRef = Mapping[str, Any]  # {"sha256": hex, "data": bytes (a row) or base64 text (a task's metadata)}


def png_bytes(image: Image.Image) -> bytes:
    """``image`` encoded as PNG (no metadata, no optimisation: the same pixels give the same bytes)."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def digest(data: bytes) -> str:
    """sha256 hex of an image's encoded bytes: its identity."""
    return hashlib.sha256(data).hexdigest()


def data_url(data: bytes) -> str:
    """Encoded image bytes as a ``data:image/<format>;base64,…`` URL (the format read from its header):
    how an exported row carries its picture, and what a taskset's image entry may be."""
    with Image.open(io.BytesIO(data)) as image:
        kind = (image.format or "png").lower()
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def metadata_entry(data: bytes) -> dict[str, str]:
    """An image as a task's metadata holds it: ``{"sha256", "data"}`` (base64)."""
    return {"sha256": digest(data), "data": base64.b64encode(data).decode()}


def image_digests(metadata: Mapping[str, Any] | None) -> list[str]:
    """The sha256 of each image a task's metadata holds ([] for a text task)."""
    return [str(entry["sha256"]) for entry in (metadata or {}).get("images") or ()]


def task_image_bytes(metadata: Mapping[str, Any] | None) -> list[bytes]:
    """The encoded images a task's metadata holds, each checked against its sha256 (``ValueError``
    naming the hash when the bytes are not the image it names)."""
    out = []
    for entry in (metadata or {}).get("images") or ():
        data = base64.b64decode(entry["data"])
        if digest(data) != entry["sha256"]:
            raise ValueError(f"task image {entry['sha256'][:12]}: its bytes have another sha256 ({digest(data)[:12]})")
        out.append(data)
    return out


def row_images(task_metadata: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """A task's images as an experience row's ``images`` column holds them (None for a text task)."""
    data = task_image_bytes(task_metadata)
    return [{"sha256": digest(d), "data": d} for d in data] or None


@functools.lru_cache(maxsize=4096)
def decode(data: bytes) -> Image.Image:
    """Encoded bytes → an RGB PIL image (cached: a GRPO group's rows share their image)."""
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def task_images(task) -> list[Image.Image]:
    """A task's images as PIL images, in prompt order ([] for a text task)."""
    return [decode(d) for d in task_image_bytes(task.metadata)]


def images_argument(tasks: Sequence) -> dict[str, list[list[Image.Image]]]:
    """``{"images": each task's images}`` for an engine's ``generate(prompts, **…)``; {} when no task
    has one, so a text batch calls every engine as before."""
    images = [task_images(t) for t in tasks]
    return {"images": images} if any(images) else {}


def images_of_row(row: Mapping[str, Any]) -> list[Image.Image]:
    """An experience row's images (its ``images`` column: stored refs, or PIL images given as they are)."""
    return [item if isinstance(item, Image.Image) else decode(bytes(item["data"])) for item in row.get("images") or ()]


def blank_like(image: Image.Image, color: str | tuple[int, int, int] = "white") -> Image.Image:
    """An image of ``image``'s size and mode in one ``color``: what a model sees when the picture is taken away."""
    return Image.new(image.mode, image.size, color)


def blank_pictures(task):
    """``task`` with each of its pictures replaced by a white one of the same size (its question,
    answer and identity kept): the anti-toy control, a policy that answers from the text alone."""
    entries = [metadata_entry(png_bytes(blank_like(decode(data)))) for data in task_image_bytes(task.metadata)]
    return dataclasses.replace(task, metadata={**task.metadata, "images": entries})


PIXEL_KEYS = ("pixel_values", "pixel_attention_mask")  # what an Idefics3-style model's forward takes


def suppressed_ids(processor) -> list[int]:
    """The token ids a vision-language policy never emits, in sampling as in training: its image
    placeholder (``processor.image_token_id``), whose every occurrence the model fills with an
    image's features (one sampled into a response would take an image's place)."""
    return [processor.image_token_id]


def pixel_inputs(image_processor, images: Sequence[Sequence[Image.Image]]) -> dict[str, torch.Tensor]:
    """The images of a batch of B prompts (a list each, maybe empty) → the model's pixel inputs:
    ``pixel_values`` (B, N, C, H, W) and ``pixel_attention_mask`` (B, N, H, W), N the most images
    of a prompt. A prompt with fewer images is padded with all-zero images, which Idefics3-style
    models drop as padding (a real image is never all zero after their normalisation). {} when no
    prompt has an image."""
    rows = [i for i, some in enumerate(images) if some]
    if not rows:
        return {}
    made = image_processor(images=[list(images[i]) for i in rows], return_tensors="pt")
    out = {}
    for key in PIXEL_KEYS:
        if key in made:
            values = made[key]  # (b, N, …)
            full = values.new_zeros((len(images), *values.shape[1:]))  # (B, N, …)
            full[rows] = values
            out[key] = full
    return out
