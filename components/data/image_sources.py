"""A taskset's pictures as a team brings them, made into the entries a task's metadata holds
(``data.images``: ``{"sha256", "data" (base64)}``, the encoded bytes as they are, not re-encoded;
a picture read from a file also keeps its name, ``file``, which the contract's reasons quote).

A row's image column (``taskset.image_key``, and ``images``) holds one picture or a list of them, each:

- a path to an image file, relative to the folder that holds the taskset (its file, or its
  ``save_to_disk`` directory), or absolute; read only when it is a regular file no larger than
  ``contracts.max_image_bytes``;
- a ``data:image/…;base64,…`` URL, or bytes (a Parquet binary column);
- a ``datasets`` ``Image`` value read undecoded (``{"bytes", "path"}``: the bytes, else the file);
- an entry as a task's metadata holds it (``{"sha256", "data"}``), kept as it is: the contract
  checks its hash.

An URL to fetch is refused (no downloads while a taskset is read). Each problem is a ``ValueError``
naming the file or value; the row is then quarantined with it, named by its file and row. Whether
the bytes are a picture within bounds is the contract's business (``data.image_checks``).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Any

from rftflow.components.data.images import metadata_entry, png_bytes


def image_entries(value: Any, base: Path, max_bytes: int) -> list[dict[str, str]]:
    """The metadata entries of one image column's ``value`` (a picture or a list of pictures);
    ``base``: the folder relative paths are read from."""
    values = value if isinstance(value, (list, tuple)) else [value]
    return [_entry(v, base, max_bytes) for v in values if v is not None]


def _entry(value: Any, base: Path, max_bytes: int) -> dict[str, str]:
    from PIL import Image

    if isinstance(value, dict) and "data" in value:  # already an entry: kept, its hash checked by the contract
        return {"sha256": str(value.get("sha256")), "data": str(value["data"])}
    if isinstance(value, dict) and ("bytes" in value or "path" in value):  # a `datasets` Image, undecoded
        data = value.get("bytes")
        if data is None:
            if not value.get("path"):
                raise ValueError("image: a `datasets` Image value with neither bytes nor a path")
            return _file_entry(str(value["path"]), base, max_bytes)
        return metadata_entry(_bytes(data, "image bytes"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return metadata_entry(bytes(value))
    if isinstance(value, Image.Image):
        return metadata_entry(png_bytes(value))
    if not isinstance(value, str):
        raise ValueError(f"image: expected a path, a data: URL, bytes or a list of them, got {type(value).__name__}")
    if value.startswith("data:"):
        header, comma, payload = value.partition(",")
        if not comma or not header.endswith(";base64"):
            raise ValueError(f"image {value[:40]!r}…: a data: URL must be `data:image/<type>;base64,<data>`")
        return metadata_entry(_bytes(payload, f"image {header}"))
    if value.startswith(("http://", "https://", "s3://", "hf://")):
        raise ValueError(f"image {value!r}: URLs are not downloaded; save the picture and give its path")
    return _file_entry(value, base, max_bytes)


def _file_entry(name: str, base: Path, max_bytes: int) -> dict[str, str]:
    """The entry of image file ``name``, which keeps the name (``file``) for the contract's reasons."""
    return {**metadata_entry(_read_file(name, base, max_bytes)), "file": name}


def _bytes(data: bytes | str, what: str) -> bytes:
    """Bytes as they are; text as base64."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: not base64") from None


def _read_file(name: str, base: Path, max_bytes: int) -> bytes:
    """The bytes of image file ``name`` (relative to ``base``), refusing what is not a regular file
    (a device, a folder) and a file above ``max_bytes`` before reading it."""
    path = Path(name) if Path(name).is_absolute() else base / name
    if not path.is_file():
        what = "is not a regular file" if path.exists() else "not found"
        raise ValueError(f"image file {name!r} {what} (looked for {path.absolute()})")
    size = path.stat().st_size
    if size > max_bytes:
        raise ValueError(f"image file {name!r}: {size} bytes, above contracts.max_image_bytes={max_bytes}")
    return path.read_bytes()


def undecoded_images(dataset):
    """``dataset`` with its ``Image`` columns (nested ones too) read undecoded, as ``{"bytes",
    "path"}``: the picture's own bytes, not a decoded PIL image to encode again."""
    import datasets

    def off(feature):
        if isinstance(feature, dict):
            if feature.get("_type") == "Image":
                return {**feature, "decode": False}
            return {k: off(v) for k, v in feature.items()}
        if isinstance(feature, list):
            return [off(v) for v in feature]
        return feature

    features = dataset.features.to_dict()
    undecoded = off(features)
    return dataset if undecoded == features else dataset.cast(datasets.Features.from_dict(undecoded))
