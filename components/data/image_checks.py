"""The image rules of the data contracts: each image of a row is its bytes, within size bounds,
with the sha256 it names, and decodes.

An image is checked in this order, and its first problem is what is said of it:

1. bytes present and at most ``max_bytes`` long;
2. their sha256 is the one the image names (its identity in a task's id and in the store);
3. Pillow identifies it from its header;
4. its declared size is within bounds: each side at most ``max_side`` pixels, width × height at most
   ``max_pixels`` — read from the header, before any pixel is decompressed, so a decompression bomb
   (a small file declaring a huge picture) is refused without being expanded;
5. its pixels decode and convert to RGB, as a model's processor reads them (a truncated file fails here).

A problem reads ``image <sha256[:12]>: <what is wrong>`` (a task's image read from a file:
``image <sha256[:12]> (<file>): …``); an image without a usable hash is named by its position
(``image #2``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import warnings
from dataclasses import dataclass

import pyarrow as pa
from PIL import Image

PREFIX = 12  # hex digits of an image's sha256 that name it in a reason


@dataclass(frozen=True)
class ImageBounds:
    max_bytes: int = 16 * 2**20  # 16 MiB encoded
    max_side: int = 4096  # pixels, width and height each
    max_pixels: int = 4096 * 4096  # width × height


def image_problem(data: bytes | pa.Buffer | None, sha256: str | None, bounds: ImageBounds, position: int = 1,
                  file: str | None = None, hashed: dict | None = None) -> str | None:
    """What is wrong with one image (``data``: its encoded bytes, ``sha256``: the hash it names;
    ``file``: the file it was read from, named too), or None. ``hashed`` (sha256 → bytes found to
    have it) spares hashing again bytes equal to ones already hashed (a group's rows share a picture)."""
    name = f"image {sha256[:PREFIX]}" if isinstance(sha256, str) and sha256 else f"image #{position}"
    name += f" ({file})" if file else ""
    if data is None or len(data) == 0:
        return f"{name}: no bytes"
    if len(data) > bounds.max_bytes:
        return f"{name}: {len(data)} bytes, above contracts.max_image_bytes={bounds.max_bytes}"
    if hashed is None or sha256 not in hashed or hashed[sha256] != data:
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            return f"{name}: its bytes have sha256 {actual[:PREFIX]}, not the one it names"
        if hashed is not None:
            hashed[sha256] = data
    problem = _pixels_problem(sha256, data, bounds.max_side, bounds.max_pixels)
    return f"{name}: {problem}" if problem else None


def column_problems(column: pa.ChunkedArray, bounds: ImageBounds) -> list[str | None]:
    """Per row of an experience table's ``images`` column (a list of ``{"sha256", "key", "data"}`` structs):
    its images' problems joined with ", ", or None. The bytes are read in place (Arrow buffers), and
    bytes equal to ones already hashed are not hashed again."""
    hashed: dict[str, pa.Buffer] = {}
    out = []
    for row in column.combine_chunks():
        problems = []
        for position, image in enumerate(row.values if row.is_valid else (), start=1):
            if not image.is_valid or not image["data"].is_valid:  # no picture, or its bytes never read back
                problems.append(f"image #{position}: null" if not image.is_valid else f"image #{position}: no bytes")
                continue
            problem = image_problem(image["data"].as_buffer(), image["sha256"].as_py(), bounds, position, None, hashed)
            if problem:
                problems.append(problem)
        out.append(", ".join(problems) or None)
    return out


_CHECKED: dict[tuple[str, int, int], str | None] = {}  # (sha256, max_side, max_pixels) → problem
_CHECKED_MAX = 8192


def _pixels_problem(sha256: str, data: bytes, max_side: int, max_pixels: int) -> str | None:
    """Steps 3–5 for bytes whose sha256 has been checked, remembered by that hash (not by the bytes,
    which the memory would then keep), so the rows of a group or a round that share a picture decode
    it once."""
    key = (sha256, max_side, max_pixels)
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = _decode_problem(data, max_side, max_pixels)
    return _CHECKED[key]


def _decode_problem(data: bytes, max_side: int, max_pixels: int) -> str | None:
    try:
        with warnings.catch_warnings():  # Pillow's bomb warning, above its own limit, as an error
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data)) as image:
                width, height = image.size
                if max(width, height) > max_side:
                    return f"{width}×{height} pixels, a side above contracts.max_image_side={max_side}"
                if width * height > max_pixels:
                    return f"{width}×{height} pixels, above contracts.max_image_pixels={max_pixels}"
                image.convert("RGB")  # loads every pixel
    except Image.UnidentifiedImageError:
        return "not an image (Pillow identifies no format in its bytes)"
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        declared = re.search(r"\((\d+) pixels\)", str(e))
        return (f"declares {declared.group(1) if declared else 'too many'} pixels (a decompression bomb), above "
                f"contracts.max_image_pixels={max_pixels}")
    except Exception as e:  # noqa: BLE001 — Pillow's decoders raise OSError, SyntaxError, ValueError, …
        return f"does not decode ({type(e).__name__}: {str(e)[:120]})"
    return None


def task_images_problem(metadata: str | None, bounds: ImageBounds) -> str | None:
    """The problems of the images a task's metadata (JSON text) holds under ``images``: a list of
    ``{"sha256", "data"}`` with ``data`` in base64 (``data.images``); None when all are good or it has none."""
    if not metadata or '"images"' not in metadata:
        return None
    try:
        images = json.loads(metadata).get("images")
    except (ValueError, AttributeError):
        return None  # metadata that is not a JSON object is the parser's business
    if images is None:
        return None
    if not isinstance(images, list):
        return f"metadata images: expected a list of {{sha256, data}}, got {type(images).__name__}"
    problems = []
    for position, image in enumerate(images, start=1):
        if not isinstance(image, dict) or not isinstance(image.get("data"), str):
            problems.append(f"image #{position}: expected {{sha256, data (base64)}}, got {type(image).__name__}")
            continue
        try:
            data = base64.b64decode(image["data"], validate=True)
        except binascii.Error:
            problems.append(f"image {str(image.get('sha256'))[:PREFIX]}: its data is not base64")
            continue
        problem = image_problem(data, image.get("sha256"), bounds, position, image.get("file"))
        if problem:
            problems.append(problem)
    return ", ".join(problems) or None
