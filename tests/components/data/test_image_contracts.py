"""The image rules of the contracts, with hostile pictures: each experience row or task whose image
does not decode, lies outside its bounds or is not the image its hash names is quarantined with a
reason naming the image (its hash prefix) and what is wrong; the other rows pass, and rows in =
accepted + quarantined."""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import struct
import zlib

import pyarrow as pa
import pytest
from PIL import Image

from rftflow.components.config import ContractsConfig, TasksetConfig
from rftflow.components.data import image_checks
from rftflow.components.data.contracts import ContractBounds, check
from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.data.tasksets import validated_tasks


def _png(size=(24, 16), color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@functools.cache
def _bomb(side: int = 6000) -> bytes:
    """A greyscale PNG that declares ``side``×``side`` pixels, every one of them there: rows of zeros
    that zlib packs ~1000:1, so the file is small (37 kB) and its decoded pixels are not (36 MB)."""
    raw = zlib.compressobj(6)
    row = b"\0" * (1 + side)
    body = b"".join(raw.compress(row) for _ in range(side)) + raw.flush()
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", header) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def _ref(data: bytes, sha256: str | None = None) -> dict:
    return {"sha256": sha256 or hashlib.sha256(data).hexdigest(), "data": data}


def _row(i: int, images) -> dict:
    return make_experience(experience_id=f"e{i}", campaign="c", round=1, task_id=f"t{i}", group_id=f"g{i}",
                           source="explorer", prompt="How many shapes?", response="2", prompt_ids=[1, 2, 3],
                           response_ids=[4], response_logprobs=[-0.1], response_mask=[1], reward=1.0,
                           model_version=0, images=images)


GOOD = _png()
TRUNCATED = GOOD[: len(GOOD) // 2 + 20]  # its header whole, its pixels cut short
HUGE = (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0))
        + _chunk(b"IDAT", zlib.compress(b"\0" * 1000)) + _chunk(b"IEND", b""))  # 10^10 pixels declared, few there


def test_hostile_images_of_experience_rows_are_quarantined_naming_the_image():
    sha = hashlib.sha256
    rows = [_row(0, [_ref(GOOD)]), _row(1, [_ref(TRUNCATED)]), _row(2, [_ref(b"GIF89a, or so it says")]),
            _row(3, [_ref(_bomb())]), _row(4, [_ref(HUGE)]), _row(5, [_ref(GOOD, sha256="ab" * 32)]),
            _row(6, [_ref(_png((300, 10)))]), _row(7, None), _row(8, [_ref(GOOD), None]), _row(9, [_ref(b"")]),
            _row(10, [_ref(GOOD), _ref(TRUNCATED)]),
            _row(11, [_ref(TRUNCATED, sha256=sha(GOOD).hexdigest())])]  # another's hash, after a row that had it
    bounds = ContractBounds(max_image_side=256)
    verdict = check(to_table(rows), "explorer", bounds)
    assert verdict.counts["rows"] == len(rows) == verdict.counts["accepted"] + verdict.counts["quarantined"]
    assert verdict.accepted.column("experience_id").to_pylist() == ["e0", "e7"]  # a text row has no image to check
    reasons = dict(zip(verdict.quarantined.column("experience_id").to_pylist(),
                       verdict.quarantined.column("reason").to_pylist()))
    rule = "expect_multicolumn_values_within_bounds(images_valid): "
    assert all(reason.startswith(rule) for reason in reasons.values()), reasons

    def name(data: bytes) -> str:
        return f"image {sha(data).hexdigest()[:12]}: "

    assert reasons["e1"] == rule + name(TRUNCATED) + "does not decode (OSError: image file is truncated)"
    assert reasons["e2"] == rule + name(b"GIF89a, or so it says") + "not an image (Pillow identifies no format in " \
                                                                      "its bytes)"
    assert reasons["e3"] == rule + name(_bomb()) + "6000×6000 pixels, a side above contracts.max_image_side=256"
    assert reasons["e4"] == rule + name(HUGE) + ("declares 10000000000 pixels (a decompression bomb), above "
                                                 "contracts.max_image_pixels=16777216")
    assert reasons["e5"] == rule + f"image {'ab' * 6}: its bytes have sha256 {sha(GOOD).hexdigest()[:12]}, not the " \
                                   "one it names"
    assert reasons["e6"] == rule + name(_png((300, 10))) + "300×10 pixels, a side above contracts.max_image_side=256"
    assert reasons["e8"] == rule + "image #2: null"
    assert reasons["e9"] == rule + name(b"") + "no bytes"
    assert reasons["e10"] == reasons["e1"]  # the good image of the row is not named, the bad one is
    assert reasons["e11"] == rule + f"image {sha(GOOD).hexdigest()[:12]}: its bytes have sha256 " \
                                    f"{sha(TRUNCATED).hexdigest()[:12]}, not the one it names"


def test_the_bounds_come_from_the_config_and_each_is_enforced():
    picture = _png((64, 48))
    table = to_table([_row(0, [_ref(picture)])])

    def reason(**keys) -> str | None:
        verdict = check(table, "explorer", ContractBounds.of(ContractsConfig(**keys)))
        return verdict.quarantined.column("reason")[0].as_py() if verdict.quarantined.num_rows else None

    assert reason() is None
    assert reason(max_image_side=63).endswith("64×48 pixels, a side above contracts.max_image_side=63")
    assert reason(max_image_pixels=3071).endswith("64×48 pixels, above contracts.max_image_pixels=3071")
    assert reason(max_image_bytes=len(picture) - 1).endswith(
        f"{len(picture)} bytes, above contracts.max_image_bytes={len(picture) - 1}")
    assert reason(max_image_side=64, max_image_pixels=64 * 48, max_image_bytes=len(picture)) is None  # bounds inclusive


def test_a_picture_shared_by_a_group_is_decoded_once(monkeypatch):
    decoded = []
    real = image_checks._decode_problem
    monkeypatch.setattr(image_checks, "_decode_problem", lambda data, *a: decoded.append(data) or real(data, *a))
    monkeypatch.setattr(image_checks, "_CHECKED", {})
    picture = _png(color=(1, 2, 3))
    verdict = check(to_table([_row(i, [_ref(picture)]) for i in range(16)]), "explorer")
    assert verdict.counts["accepted"] == 16 and decoded == [picture]


def test_task_images_are_checked_when_a_taskset_is_read(tmp_path):
    def entry(data: bytes, sha256: str | None = None) -> dict:
        return {"sha256": sha256 or hashlib.sha256(data).hexdigest(), "data": base64.b64encode(data).decode()}

    rows = [{"question": "What colour?", "answer": "red", "images": [entry(GOOD)]},
            {"question": "What colour?", "answer": "blue", "images": [entry(_png(color=(0, 0, 255)), "cd" * 32)]},
            {"question": "What colour?", "answer": "grey", "images": [entry(TRUNCATED)]},
            {"question": "What colour?", "answer": "green", "images": [{"sha256": "ef" * 32, "data": "not base64!"}]},
            {"question": "What colour?", "answer": "white", "images": [entry(_bomb())]}]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tasks, quarantined = validated_tasks(TasksetConfig(source=str(path)), 0, ContractsConfig(max_bad_fraction=1.0))
    assert [t.answer for t in tasks] == ["red"] and quarantined.num_rows == 4
    reasons = dict(zip(quarantined.column("where").to_pylist(), quarantined.column("reason").to_pylist()))
    rule = "expect_column_values_to_be_null(image_error): "
    blue = hashlib.sha256(_png(color=(0, 0, 255))).hexdigest()[:12]
    assert reasons[f"{path}:2"] == rule + f"image {'cd' * 6}: its bytes have sha256 {blue}, not the one it names"
    truncated = hashlib.sha256(TRUNCATED).hexdigest()[:12]
    assert reasons[f"{path}:3"].startswith(rule + f"image {truncated}: does not decode")
    assert reasons[f"{path}:4"] == rule + f"image {'ef' * 6}: its data is not base64"
    assert reasons[f"{path}:5"].endswith("6000×6000 pixels, a side above contracts.max_image_side=4096")


@pytest.mark.parametrize(("images", "problem"), [
    ({"sha256": "x"}, "metadata images: expected a list of {sha256, data}, got dict"),
    (["pictures/a.png"], "image #1: expected {sha256, data (base64)}, got str"),
    ([{"sha256": "x", "data": ""}], "image x: no bytes")])
def test_task_metadata_images_of_the_wrong_shape_are_named(images, problem):
    assert image_checks.task_images_problem(json.dumps({"images": images}), image_checks.ImageBounds()) == problem


def test_a_bomb_is_refused_from_its_header_without_decoding_a_pixel(monkeypatch):
    from PIL import ImageFile

    def no_decoding(self):
        raise AssertionError("pixels decoded")

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_decoding)
    monkeypatch.setattr(image_checks, "_CHECKED", {})
    bomb = _bomb()
    assert image_checks.image_problem(bomb, hashlib.sha256(bomb).hexdigest(), image_checks.ImageBounds()) == \
        f"image {hashlib.sha256(bomb).hexdigest()[:12]}: 6000×6000 pixels, a side above contracts.max_image_side=4096"
