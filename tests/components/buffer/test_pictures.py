"""Pictures in the store: each stored once by its content hash however many rows show it, the rows
holding the hash and the key (read as plain Parquet), read back with their bytes, checked against
their hash; counted by ``buffer ls`` and collected by ``buffer gc`` once no kept row names them."""

import io
import random

import pyarrow.parquet as pq
import pytest
from PIL import Image

from rftflow.components.buffer import retention
from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.shards import ShardError
from rftflow.components.config import load_config
from rftflow.components.data.experience import make_experience, to_table
from rftflow.components.data.images import digest, png_bytes


def _picture(color: str) -> bytes:
    return png_bytes(Image.new("RGB", (8, 8), color))


def _noise(seed: int) -> bytes:
    """A picture PNG cannot shrink (random pixels): ~12 kB."""
    return png_bytes(Image.frombytes("RGB", (64, 64), random.Random(seed).randbytes(64 * 64 * 3)))


def _rows(round_no: int, pictures: list[bytes], per_picture: int = 16):
    """``per_picture`` rows (a GRPO group) per picture, each row showing its picture."""
    return to_table(make_experience(
        experience_id=f"r{round_no}-{i}-{j}", campaign="c", round=round_no, task_id=f"t{i}", group_id=f"g{i}",
        source="explorer", prompt="<image> how many?", response=str(j), reward=1.0, model_version=0,
        images=[{"sha256": digest(data), "data": data}]) for i, data in enumerate(pictures) for j in range(per_picture))


def _pictures_stored(store) -> list[str]:
    return store.list("c/images/")


@pytest.mark.parametrize("write_behind", [False, True])
def test_a_picture_shared_by_16_rows_is_stored_once_and_rows_read_back_with_its_bytes(store, write_behind):
    red, blue = _noise(0), _noise(1)
    buffer = ExperienceStore(store, "c", write_behind=write_behind)
    buffer.write_usual(1, _rows(1, [red, blue]))
    buffer.write_usual(2, _rows(2, [red]))  # the same picture asked again in a later round
    buffer.flush()
    assert _pictures_stored(store) == sorted(f"c/images/{digest(d)}" for d in (red, blue))
    assert store.get(f"c/images/{digest(red)}") == red

    # the shard itself holds the hash and the key, never the bytes: plain Parquet readers see that
    key = ExperienceStore(store, "c").usual_shards()[0]
    raw = pq.read_table(io.BytesIO(store.get(key)))
    images = raw.column("images").to_pylist()
    assert {(i["sha256"], i["key"], i["data"]) for row in images for i in row} == {
        (digest(d), f"images/{digest(d)}", None) for d in (red, blue)}
    assert len(store.get(key)) < len(red)  # not one of its 32 rows' pictures is in it

    # a reader in another process gets the rows as written, bytes and all
    again = ExperienceStore(store, "c")
    read = again.read_kind("usual")
    assert read.num_rows == 48
    assert [row[0]["data"] for row in read.column("images").to_pylist()] == [red] * 16 + [blue] * 16 + [red] * 16
    assert {"kind": "images", "round": None, "source": "store", "rows": 2} in again.counts()


def test_a_picture_altered_or_missing_in_the_store_fails_the_read_naming_its_key(store):
    red = _picture("red")
    ExperienceStore(store, "c").write_usual(1, _rows(1, [red], per_picture=2))
    store.put(f"c/images/{digest(red)}", _picture("green"))  # same key, other bytes
    with pytest.raises(ShardError, match=f"picture .*c/images/{digest(red)} is corrupt: its bytes have sha256"):
        ExperienceStore(store, "c").read_kind("usual")
    store.delete(f"c/images/{digest(red)}")
    with pytest.raises(ShardError, match=f"picture .*c/images/{digest(red)} is missing from the store"):
        ExperienceStore(store, "c").read_kind("usual")


def test_gc_deletes_the_pictures_only_dropped_rounds_showed(store, default_config):
    red, blue, green = _picture("red"), _picture("blue"), _picture("green")
    buffer = ExperienceStore(store, "c")
    buffer.write_usual(1, _rows(1, [red, blue], per_picture=2))
    buffer.write_usual(2, _rows(2, [red], per_picture=2))
    buffer.write_usual(3, _rows(3, [green], per_picture=2))
    config = load_config(default_config).model_dump(mode="json")
    gc = retention.plan(buffer, config, finished=True, keep_rounds=2)
    assert sorted(gc.deletions["images"]) == [f"c/images/{digest(blue)}"]  # red: round 2 still shows it
    retention.apply(buffer, gc)
    assert _pictures_stored(store) == sorted(f"c/images/{digest(d)}" for d in (red, green))
    kept = ExperienceStore(store, "c").read_kind("usual")
    assert sorted(kept.column("round").to_pylist()) == [2, 2, 3, 3]
    assert retention.plan(ExperienceStore(store, "c"), config, finished=True, keep_rounds=2).deletions["images"] == []
