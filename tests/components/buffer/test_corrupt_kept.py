"""A checkpoint found corrupt is set aside for someone to look at: out of the way of the checkpoint
its round writes again at the same version, past the collection after a campaign, until
``rftflow buffer gc`` lists and deletes it."""

import json

import pytest

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.retention import apply, plan
from rftflow.components.buffer.store import open_store
from rftflow.components.buffer.weights import CorruptCheckpoint, WeightStore
from rftflow.components.config import CampaignConfig


def test_a_corrupt_checkpoint_is_kept_aside_until_buffer_gc_deletes_it(tmp_path):
    store = ExperienceStore(open_store((tmp_path / "store").as_uri()), "c")
    weights = WeightStore(store.objects, "c")
    files = tmp_path / "files"
    files.mkdir()
    (files / "model.safetensors").write_bytes(b"w" * 100)
    (files / "campaign.json").write_text(json.dumps({"round": 2, "weight_version": 3, "buffer_state": {}}))
    weights.write_checkpoint(1, files, {"round": 0})
    weights.write_checkpoint(3, files, {"round": 2})
    store.objects.put("c/checkpoints/v000003/model.safetensors", b"w" * 10)  # truncated on the disk
    with pytest.raises(CorruptCheckpoint, match="model.safetensors has 10 bytes") as found:
        weights.read_checkpoint(3, tmp_path / "into")
    aside = weights.set_aside_checkpoint(3, str(found.value))
    assert [m["version"] for m in weights.checkpoints()] == [1]  # uncommitted: a resume takes v1
    weights.write_checkpoint(3, files, {"round": 2})  # the redone round writes its checkpoint again
    assert [m["version"] for m in weights.checkpoints()] == [1, 3]
    kept = weights.set_aside()
    assert [k["prefix"] for k in kept] == [aside] and "10 bytes" in kept[0]["reason"]
    assert store.objects.get(f"{aside}/model.safetensors") == b"w" * 10  # the corrupt bytes, for a look

    config = CampaignConfig().model_dump(mode="json")
    after_campaign = plan(store, config, finished=True)  # retention.after_campaign: kept
    assert not [k for k in after_campaign.deletions["checkpoints"] if k.startswith(aside)]
    gc = plan(store, config, finished=True, corrupt=True)  # `rftflow buffer gc`: listed by name, then deleted
    assert {k for k in gc.deletions["checkpoints"] if k.startswith(aside)} == {f"{aside}/corrupt.json",
                                                                              f"{aside}/model.safetensors",
                                                                              f"{aside}/campaign.json"}
    assert aside.rsplit("/", 1)[1] in gc.notes["checkpoints"]
    apply(store, gc)
    assert weights.set_aside() == [] and [m["version"] for m in weights.checkpoints()] == [1, 3]
