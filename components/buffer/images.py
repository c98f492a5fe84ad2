"""The pictures of experience rows in a campaign's store, each stored once by its content hash.

A row's ``images`` column (``data.experience.IMAGE``) holds, in the store, each picture's sha256
and its key (``images/<sha256>``, under the campaign's prefix: a campaign moved aside by
``--restart`` keeps its rows' keys), never its bytes; the bytes are the object at that key, put
if absent, so the sixteen rows of a GRPO group (and every later round that asks the same picture)
share one object. In memory, read back, a row holds the bytes again (``data``) and everything
above the store sees rows as the explorer made them.

Pure functions over Arrow tables: ``ExperienceStore`` does the reads and writes (the pictures
before the shard that names them, so a committed row's picture is always there).
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from rftflow.components.data.experience import IMAGE
from rftflow.components.data.images import digest

IMAGES_DIR = "images"


def image_key(sha256: str) -> str:
    """A picture's key under its campaign's prefix."""
    return f"{IMAGES_DIR}/{sha256}"


def _images(table: pa.Table) -> list | None:
    """The ``images`` column as Python lists, or None when no row has one."""
    if "images" not in table.column_names or table.column("images").null_count == table.num_rows:
        return None
    return table.column("images").to_pylist()


def _with_images(table: pa.Table, images: list) -> pa.Table:
    index = table.column_names.index("images")
    return table.set_column(index, table.schema.field(index), pa.array(images, pa.list_(IMAGE)))


def stored_form(table: pa.Table) -> tuple[pa.Table, dict[str, bytes]]:
    """``table`` as the store keeps it — each picture as ``{sha256, key}`` — and the bytes to put,
    by key. A row whose picture already is a reference (read from the store) keeps it."""
    images = _images(table)
    if images is None:
        return table, {}
    blobs: dict[str, bytes] = {}
    refs = []
    for row in images:
        if row is None:
            refs.append(None)
            continue
        out = []
        for item in row:
            key = item.get("key") or image_key(item["sha256"])
            if item.get("data") is not None:
                blobs[key] = bytes(item["data"])
            out.append({"sha256": item["sha256"], "key": key, "data": None})
        refs.append(out)
    return _with_images(table, refs), blobs


def filled(table: pa.Table, fetch: Callable[[str], bytes], where: str) -> pa.Table:
    """``table`` with each referenced picture's bytes fetched (``fetch(key)``, once per key) and
    checked against its sha256: a picture whose object is missing or is other bytes raises
    ``ValueError`` naming its key under ``where`` (the campaign's prefix in the store)."""
    images = _images(table)
    if images is None or all(item.get("data") is not None for row in images if row for item in row):
        return table
    got: dict[str, bytes] = {}
    for row in images:
        for item in row or ():
            if item.get("data") is not None:
                continue
            key = item["key"]
            if key not in got:
                try:
                    got[key] = fetch(key)
                except KeyError:
                    raise ValueError(f"picture {where}/{key} is missing from the store (a row names it)") from None
                if digest(got[key]) != item["sha256"]:
                    raise ValueError(f"picture {where}/{key} is corrupt: its bytes have sha256 "
                                     f"{digest(got[key])[:12]}…, not the {item['sha256'][:12]}… its rows name")
            item["data"] = got[key]
    return _with_images(table, images)


def referenced(table: pa.Table) -> set[str]:
    """The keys of the pictures ``table``'s rows name (stored form or not)."""
    return {item.get("key") or image_key(item["sha256"]) for row in _images(table) or () for item in row or ()}
