"""The ``builtin:vision`` taskset: each answer recomputed from what the generator says it drew,
without its code or the picture; the picture checked to hold what the metadata says; one question
about many pictures is many tasks; experience rows keep their images, and older shards still read."""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import pyarrow as pa
import pytest

from rftflow.components.data.images import decode, digest, task_image_bytes
from rftflow.components.data.vision_tasks import BACKGROUND, COLORS, vision_task_entries

SIDE = 48


def _area(shape: dict) -> float:
    """A drawn shape's area from its box: a disc, a square or a triangle of that width."""
    x0, y0, x1, y1 = shape["box"]
    w, h = x1 - x0, y1 - y0
    return {"circle": math.pi * w * h / 4, "square": w * h, "triangle": w * h / 2}[shape["shape"]]


def _expected(entry: dict) -> str:
    """The answer computed from the metadata alone (not by the generator's code, not from pixels)."""
    meta = entry["metadata"]
    if meta["kind"] == "count":
        return str(len(meta["shapes"]))
    if meta["kind"] == "larger":
        left = [s for s in meta["shapes"] if (s["box"][0] + s["box"][2]) / 2 < SIDE / 2]
        right = [s for s in meta["shapes"] if (s["box"][0] + s["box"][2]) / 2 >= SIDE / 2]
        assert len(left) == len(right) == 1
        return "left" if _area(left[0]) > _area(right[0]) else "right"
    return str(meta["digit"])


def _overlap(a: list[int], b: list[int]) -> bool:
    return not (a[2] < b[0] or b[2] < a[0] or a[3] < b[1] or b[3] < a[1])


def test_every_answer_follows_from_what_was_drawn_and_the_picture_holds_it():
    entries = vision_task_entries({}, 300, seed=7)
    kinds = Counter(e["metadata"]["kind"] for e in entries)
    assert kinds == {"count": 100, "larger": 100, "number": 100}
    for e in entries:
        meta = e["metadata"]
        assert e["answer"] == _expected(e), e
        [data] = task_image_bytes(meta)
        assert meta["images"][0]["sha256"] == hashlib.sha256(data).hexdigest()
        image = decode(data)
        assert image.size == (SIDE, SIDE)
        for shape in meta.get("shapes", ()):
            x0, y0, x1, y1 = shape["box"]
            assert 0 <= x0 < x1 < SIDE and 0 <= y0 < y1 < SIDE
            centroid = ((x0 + x1) // 2, (y0 + 2 * y1) // 3 if shape["shape"] == "triangle" else (y0 + y1) // 2)
            assert image.getpixel(centroid) == COLORS[shape["color"]], (shape, centroid)
        if meta["kind"] == "count":  # apart: a count no one could dispute
            boxes = [s["box"] for s in meta["shapes"]]
            assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
        if meta["kind"] == "larger":  # never a close call: areas at least 1.5² apart
            areas = sorted(_area(s) for s in meta["shapes"])
            assert areas[1] >= 1.5 ** 2 * areas[0]
        # nothing drawn outside the boxes the metadata names
        boxes = [s["box"] for s in meta.get("shapes", ())] or [meta["box"]]
        stray = [(x, y) for x in range(SIDE) for y in range(SIDE) if image.getpixel((x, y)) != BACKGROUND
                 and not any(b[0] - 1 <= x <= b[2] + 1 and b[1] - 1 <= y <= b[3] + 1 for b in boxes)]
        assert not stray, (meta["kind"], stray[:5])
        if meta["kind"] == "number":  # the digit is there: its box has ink
            x0, y0, x1, y1 = meta["box"]
            assert any(image.getpixel((x, y)) != BACKGROUND for x in range(x0, x1) for y in range(y0, y1))


def test_each_kind_asks_one_question_and_its_answers_are_uniform():
    """The question alone says nothing about the answer: a policy that ignores the picture gets each
    kind's chance (1/4, 1/2, 1/10) and no more."""
    entries = vision_task_entries({}, 3000, seed=1)
    for kind, values in (("count", "1234"), ("larger", ("left", "right")), ("number", "0123456789")):
        mine = [e for e in entries if e["metadata"]["kind"] == kind]
        assert len({e["question"] for e in mine}) == 1
        counts = Counter(e["answer"] for e in mine)
        assert set(counts) == set(values)
        share = 1 / len(values)  # each answer within 5 standard errors of its share
        assert all(abs(c / len(mine) - share) < 5 * math.sqrt(share * (1 - share) / len(mine)) for c in counts.values())


def test_the_same_seed_draws_the_same_tasks_and_bad_params_are_named():
    assert vision_task_entries({"kinds": ["larger"]}, 5, 3) == vision_task_entries({"kinds": ["larger"]}, 5, 3)
    assert vision_task_entries({}, 5, 3) != vision_task_entries({}, 5, 4)
    for params, match in (({"kinds": ["colour"]}, r"params\.kinds \['colour'\]"), ({"image_size": 16}, "image_size"),
                          ({"max_count": 9}, "max_count"), ({"min_ratio": 5}, "min_ratio")):
        with pytest.raises(ValueError, match=match):
            vision_task_entries(params, 2, 0)


def test_one_question_about_many_pictures_is_many_tasks_held_out_by_picture():
    from rftflow.components.config import TasksetConfig
    from rftflow.components.data.tasksets import load_tasks, task_id

    taskset = load_tasks(TasksetConfig(source="builtin:vision", size=120, eval_size=20), seed=0)
    ids = [t.task_id for t in taskset.train + taskset.held_out]
    assert len(ids) == len(set(ids)) == 120  # three questions, 120 pictures
    assert not {t.task_id for t in taskset.train} & {t.task_id for t in taskset.held_out}
    question = taskset.train[0].question
    assert taskset.train[0].task_id != task_id(question)  # the picture is part of the task's identity
    assert taskset.train[0].task_id == task_id(question, [digest(task_image_bytes(taskset.train[0].metadata)[0])])


def test_a_task_image_whose_bytes_are_not_its_hash_is_refused():
    entry = vision_task_entries({}, 1, 0)[0]
    meta = {**entry["metadata"], "images": [{**entry["metadata"]["images"][0], "sha256": "0" * 64}]}
    with pytest.raises(ValueError, match=r"task image 000000000000: its bytes have another sha256"):
        task_image_bytes(meta)


def test_experience_rows_keep_their_images_and_older_shards_read_without_them(tiny_vlm):
    from rftflow.components.data.experience import SCHEMA, conform
    from rftflow.components.data.tasksets import _to_task
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.explorer import expert_demonstrations

    model, tokenizer, processor = tiny_vlm
    tasks = [_to_task(e, "{question}") for e in vision_task_entries({}, 3, 0)]
    engine = HFRolloutEngine(model, tokenizer, chat_template=True, processor=processor)
    rows = expert_demonstrations(engine, tasks, campaign="c")
    for row, task in zip(rows.to_pylist(), tasks):
        [image] = row["images"]
        assert image["sha256"] == digest(image["data"]) == task.metadata["images"][0]["sha256"]
        assert row["prompt_ids"].count(processor.image_token_id) == processor.image_seq_len
    older = rows.drop_columns(["images", "domain", "turns"])  # a shard written before these columns
    read = conform(older)
    assert read.schema.equals(SCHEMA) and read.column("images").null_count == 3
    assert conform(rows).equals(rows)
    assert pa.Table.from_pylist(rows.to_pylist(), schema=SCHEMA).equals(rows)  # the column round-trips


def test_a_blanked_task_keeps_its_question_answer_and_identity_but_not_its_picture():
    from rftflow.components.data.images import blank_pictures, task_images
    from rftflow.components.data.tasksets import _to_task

    task = _to_task(vision_task_entries({}, 1, 0)[0], "{question}")
    blank = blank_pictures(task)
    assert (blank.task_id, blank.question, blank.prompt, blank.answer) == (task.task_id, task.question, task.prompt,
                                                                           task.answer)
    [before], [after] = task_images(task), task_images(blank)
    assert after.size == before.size and set(after.getdata()) == {BACKGROUND} != set(before.getdata())
    assert blank.metadata["images"][0]["sha256"] != task.metadata["images"][0]["sha256"]
