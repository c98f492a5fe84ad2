"""Tasksets with a team's own pictures: paths relative to the taskset file, bytes, data: URLs and a
``datasets`` Image column all become the same task entries (so the same picture is the same task
however it came); a bad picture or path quarantines its row, named by file and row."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rftflow.components.config import ContractsConfig, TasksetConfig
from rftflow.components.data.images import task_images
from rftflow.components.data.tasksets import TasksetError, check_taskset, task_id, validated_tasks

COLOURS = {"red": (220, 40, 40), "green": (30, 160, 60), "blue": (40, 70, 220)}


@pytest.fixture
def pictures(tmp_path):
    """A team's folder: pictures/<colour>.png beside where its taskset files go."""
    folder = tmp_path / "team" / "pictures"
    folder.mkdir(parents=True)
    for name, rgb in COLOURS.items():
        Image.new("RGB", (20, 12), rgb).save(folder / f"{name}.png")
    return folder.parent


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _by_answer(cfg: TasksetConfig, **contracts):
    tasks, quarantined = validated_tasks(cfg, 0, ContractsConfig(max_bad_fraction=1.0, **contracts))
    return {t.answer: t for t in tasks}, quarantined


def test_paths_bytes_data_urls_and_entries_make_the_same_tasks(pictures, tmp_path, monkeypatch):
    red, green, blue = (pictures / "pictures" / f"{c}.png" for c in COLOURS)
    url = "data:image/png;base64," + base64.b64encode(green.read_bytes()).decode()
    rows = [{"question": "What colour?", "answer": "red", "image": "pictures/red.png"},  # relative to the file
            {"question": "What colour?", "answer": "green", "image": url},
            {"question": "Which two colours?", "answer": "blue red", "images": [str(blue), "pictures/red.png"]},
            {"question": "What colour?", "answer": "blue", "images": [{"sha256": _sha(blue), "data": base64.b64encode(
                blue.read_bytes()).decode()}]},
            {"question": "2+2=", "answer": "4"}]  # a text task beside them
    (pictures / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)  # not the taskset's folder: paths are read from the file's
    tasks, quarantined = _by_answer(TasksetConfig(source=str(pictures / "tasks.jsonl")))
    assert quarantined.num_rows == 0 and len(tasks) == 5
    assert [e["sha256"] for e in tasks["blue red"].metadata["images"]] == [_sha(blue), _sha(red)]
    assert tasks["red"].metadata["images"][0]["file"] == "pictures/red.png" and "image" not in tasks["red"].metadata
    for answer, picture in (("red", red), ("green", green), ("blue", blue)):
        [entry] = tasks[answer].metadata["images"]
        assert base64.b64decode(entry["data"]) == picture.read_bytes()  # the file's bytes, not re-encoded
        assert tasks[answer].task_id == task_id("What colour?", [_sha(picture)])
        [image] = task_images(tasks[answer])
        assert image.getpixel((3, 3)) == COLOURS[answer]
    assert "images" not in tasks["4"].metadata and tasks["4"].task_id == task_id("2+2=")

    # the same pictures as bytes in a Parquet file, under another column name: the same tasks
    table = pa.table({"q": ["What colour?"] * 3, "a": list(COLOURS),
                      "picture": [(pictures / "pictures" / f"{c}.png").read_bytes() for c in COLOURS]})
    pq.write_table(table, pictures / "tasks.parquet")
    from_bytes, _ = _by_answer(TasksetConfig(source=str(pictures / "tasks.parquet"), question_key="q",
                                             answer_key="a", image_key="picture"))
    assert {a: t.task_id for a, t in from_bytes.items()} == {a: tasks[a].task_id for a in COLOURS}


def test_a_datasets_image_column_and_a_csv_of_paths(pictures):
    import datasets

    files = [str(pictures / "pictures" / f"{c}.png") for c in COLOURS]
    data = datasets.Dataset.from_dict({"question": ["What colour?"] * 3, "answer": list(COLOURS), "image": files})
    data.cast_column("image", datasets.Image()).save_to_disk(pictures / "saved")  # the bytes go into the dataset
    os.rename(pictures / "pictures", pictures / "moved")  # so they are read from it, not from the files
    saved, quarantined = _by_answer(TasksetConfig(source=str(pictures / "saved")))
    assert quarantined.num_rows == 0
    os.rename(pictures / "moved", pictures / "pictures")
    (pictures / "tasks.csv").write_text("question,answer,image\n" + "".join(
        f"What colour?,{c},pictures/{c}.png\n" for c in COLOURS))
    from_csv, _ = _by_answer(TasksetConfig(source=str(pictures / "tasks.csv")))
    for colour, path in zip(COLOURS, files):
        assert saved[colour].task_id == from_csv[colour].task_id == task_id("What colour?", [_sha_of(path)])
        assert task_images(saved[colour])[0].getpixel((0, 0)) == COLOURS[colour]


def _sha_of(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_bad_pictures_and_paths_are_named_by_file_and_row(pictures):
    (pictures / "pictures" / "cut.png").write_bytes((pictures / "pictures" / "red.png").read_bytes()[:60])
    (pictures / "pictures" / "notes.png").write_text("not a picture")
    Image.effect_noise((64, 64), 60).save(pictures / "pictures" / "noise.png")  # larger than the others
    bad = ["pictures/none.png", "https://example.com/cat.png", "pictures", "/dev/zero", "data:image/png,raw",
           "data:image/png;base64,@@@", 7, "pictures/cut.png", "pictures/notes.png", "pictures/noise.png"]
    rows = [{"question": "What colour?", "answer": "red", "image": "pictures/red.png"}]
    rows += [{"question": f"What colour? ({i})", "answer": str(i), "image": image} for i, image in enumerate(bad)]
    path = pictures / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    size = (pictures / "pictures" / "noise.png").stat().st_size
    assert (pictures / "pictures" / "red.png").stat().st_size < size - 1
    tasks, quarantined = _by_answer(TasksetConfig(source=str(path)), max_image_bytes=size - 1)
    assert list(tasks) == ["red"] and quarantined.num_rows == len(bad)
    reasons = dict(zip(quarantined.column("where").to_pylist(), quarantined.column("reason").to_pylist()))
    parse = "expect_column_values_to_be_null(parse_error): "
    image = "expect_column_values_to_be_null(image_error): "
    cut, notes = (_sha(pictures / "pictures" / name)[:12] for name in ("cut.png", "notes.png"))
    expected = [
        parse + f"image file 'pictures/none.png' not found (looked for {pictures / 'pictures' / 'none.png'})",
        parse + "image 'https://example.com/cat.png': URLs are not downloaded; save the picture and give its path",
        parse + f"image file 'pictures' is not a regular file (looked for {pictures / 'pictures'})",
        parse + "image file '/dev/zero' is not a regular file (looked for /dev/zero)",
        parse + "image 'data:image/png,raw'…: a data: URL must be `data:image/<type>;base64,<data>`",
        parse + "image data:image/png;base64: not base64",
        parse + "image: expected a path, a data: URL, bytes or a list of them, got int",
        image + f"image {cut} (pictures/cut.png): does not decode (OSError: image file is truncated)",
        image + f"image {notes} (pictures/notes.png): not an image (Pillow identifies no format in its bytes)",
        parse + f"image file 'pictures/noise.png': {size} bytes, above contracts.max_image_bytes={size - 1}",
    ]
    for row, reason in enumerate(expected, start=2):
        assert reasons[f"{path}:{row}"].startswith(reason), (row, reasons[f"{path}:{row}"])
    with pytest.raises(TasksetError, match=rf"first: {path}:2: .*image file 'pictures/none.png' not found"):
        check_taskset(TasksetConfig(source=str(path)))
