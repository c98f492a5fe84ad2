"""The vision-language policy: builtin:tiny-vlm is an Idefics3 directory loaded by the Auto classes;
the hf engine samples with each prompt's picture and the trainer's log-probs of the same tokens with
the same picture equal the engine's (the sync check's comparison); another picture changes them;
the image placeholder is never sampled; a saved checkpoint directory is a model.path; what cannot
take images refuses them in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

from rftflow.components.config import CampaignConfig, SyncConfig
from rftflow.components.data.images import blank_like, images_argument, task_images
from rftflow.components.data.tasksets import _to_task
from rftflow.components.data.vision_tasks import vision_task_entries
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.train.trainer import Trainer


@pytest.fixture(scope="module")
def tasks():
    return [_to_task(e, "{question}") for e in vision_task_entries({}, 6, 0)]


def _trainer(model, tokenizer, processor, temperature=1.0) -> Trainer:
    cfg = CampaignConfig()
    return Trainer(model, tokenizer.pad_token_id, cfg.trainer, cfg.algorithm.resolve(), temperature=temperature,
                   processor=processor)


def test_builtin_tiny_vlm_is_an_idefics3_directory_loaded_by_the_auto_classes(tiny_vlm):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from rftflow.components.explore.models import resolve_model_path

    model, tokenizer, processor = tiny_vlm
    path = resolve_model_path("builtin:tiny-vlm")
    assert type(AutoModelForImageTextToText.from_pretrained(path)).__name__ == "Idefics3ForConditionalGeneration"
    assert type(AutoProcessor.from_pretrained(path)).__name__ == "Idefics3Processor"
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    assert processor.image_seq_len == 9  # 48-pixel pictures, 8-pixel patches, pixel shuffle by 2


def test_a_prompt_is_encoded_as_the_processor_encodes_it_with_its_picture(tiny_vlm, tasks):
    """The engine reuses a prompt's expansion for pictures of one size: the ids are the processor's own."""
    model, tokenizer, processor = tiny_vlm
    engine = HFRolloutEngine(model, tokenizer, chat_template=True, processor=processor)
    for task in tasks:
        images = task_images(task)
        text = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": task.prompt}]}],
            add_generation_prompt=True)
        assert text == f"User:<image>{task.prompt}\nAssistant:"
        assert engine.encode(task.prompt, images) == list(processor(text=[text], images=[images])["input_ids"][0])
    bare = HFRolloutEngine(model, tokenizer, processor=processor).encode(tasks[0].prompt, task_images(tasks[0]))
    assert tokenizer.decode(bare[-len(tasks[0].prompt):]) == tasks[0].prompt
    assert bare.count(processor.image_token_id) == processor.image_seq_len


def test_the_engine_samples_with_the_picture_and_the_trainer_reads_the_same_log_probs(tiny_vlm, tasks):
    model, tokenizer, processor = tiny_vlm
    torch.manual_seed(0)
    engine = HFRolloutEngine(copy.deepcopy(model), tokenizer, chat_template=True, processor=processor, batch_size=8)
    groups = engine.generate([t.prompt for t in tasks], **images_argument(tasks), n=4, max_new_tokens=6,
                             temperature=0.9)
    trainer = _trainer(model, tokenizer, processor, temperature=0.9)
    for task, group in zip(tasks, groups):
        assert len(group) == 4
        for rollout in group:
            assert rollout.prompt_ids.count(processor.image_token_id) == processor.image_seq_len
            ours = trainer.logprobs_of(rollout.prompt_ids, rollout.response_ids, task_images(task))
            assert_close(ours, torch.tensor(rollout.logprobs), atol=1e-4, rtol=1e-4)
    # a row whose prompt has image tokens but which lost its picture is refused, not read blind
    with pytest.raises(ValueError, match="its prompt has image tokens but the row has no images"):
        trainer.logprobs_of(groups[0][0].prompt_ids, groups[0][0].response_ids, [])
    # the picture is read: a blank one, or another task's, gives other log-probs for the same tokens
    rollout, picture = groups[0][0], task_images(tasks[0])[0]
    for other in (blank_like(picture), task_images(tasks[1])[0]):
        diff = (trainer.logprobs_of(rollout.prompt_ids, rollout.response_ids, [other])
                - torch.tensor(rollout.logprobs)).abs().max()
        assert diff > 1e-3


def test_the_sync_check_compares_log_probs_with_the_picture(tiny_vlm, tasks):
    from rftflow.components.explore.sync import MemoryWeightSync, SyncMismatch, check_sync

    model, tokenizer, processor = tiny_vlm
    trainer = _trainer(copy.deepcopy(model), tokenizer, processor)
    engine = HFRolloutEngine(copy.deepcopy(model), tokenizer, chat_template=True, processor=processor)
    MemoryWeightSync(trainer.policy_weights, engine).publish(1)
    images = task_images(tasks[0])
    probe = engine.encode(tasks[0].prompt, images)
    tolerance = SyncConfig().logprob_tolerance
    metrics = check_sync(trainer, engine, 1, 1, probe, logprobs=True, tolerance=tolerance, temperature=1.0,
                         images=images)
    assert metrics["sync/logprob_max_diff"] <= 1e-4
    # a trainer that reads another picture than the engine sampled with fails the check
    with pytest.raises(SyncMismatch, match="log-probs differ"):
        check_sync(trainer, _BlindEngine(engine), 1, 1, probe, logprobs=True, tolerance=1e-3, temperature=1.0,
                   images=images)


class _BlindEngine:
    """The engine, sampling with a blank picture whatever it is given."""

    def __init__(self, engine):
        self.engine = engine

    def generate_ids(self, encoded, *, images=None, **sampling):
        return self.engine.generate_ids(encoded, images=[[blank_like(i) for i in some] for some in images], **sampling)


def test_the_image_placeholder_is_never_sampled_nor_counted_by_the_trainer(tiny_vlm, tasks):
    """A response holding the placeholder would take an image's place in the trainer's forward;
    with its logit made the likeliest by far, the engine still never samples it, and the log-probs
    of what it samples are the trainer's."""
    model, tokenizer, processor = tiny_vlm
    favoured = copy.deepcopy(model)
    with torch.no_grad():
        favoured.lm_head.weight[processor.image_token_id] *= 0  # tied: the embedding row too
        favoured.lm_head.weight[processor.image_token_id] += 5 * favoured.lm_head.weight.abs().max()
    torch.manual_seed(0)
    engine = HFRolloutEngine(favoured, tokenizer, chat_template=True, processor=processor)
    groups = engine.generate([t.prompt for t in tasks[:2]], **images_argument(tasks[:2]), n=8, max_new_tokens=6)
    rollouts = [(t, r) for t, g in zip(tasks, groups) for r in g]
    assert not any(processor.image_token_id in r.response_ids for _, r in rollouts)
    trainer = _trainer(favoured, tokenizer, processor)
    for task, r in rollouts[:4]:
        assert_close(trainer.logprobs_of(r.prompt_ids, r.response_ids, task_images(task)), torch.tensor(r.logprobs),
                     atol=1e-4, rtol=1e-4)


def test_a_saved_checkpoint_directory_is_a_model_path_that_samples_the_same(tiny_vlm, tasks, tmp_path):
    from rftflow.components.explore.models import check_model_path, load_model, load_processor

    model, tokenizer, processor = tiny_vlm
    model.save_pretrained(tmp_path / "ckpt")
    processor.save_pretrained(tmp_path / "ckpt")
    check_model_path(str(tmp_path / "ckpt"))
    again, again_tokenizer = load_model(str(tmp_path / "ckpt"))
    again_processor = load_processor(str(tmp_path / "ckpt"))
    assert type(again).__name__ == "Idefics3ForConditionalGeneration"
    args = dict(**images_argument(tasks[:3]), n=1, max_new_tokens=6, greedy=True)
    ours = HFRolloutEngine(again, again_tokenizer, chat_template=True, processor=again_processor).generate(
        [t.prompt for t in tasks[:3]], **args)
    theirs = HFRolloutEngine(model, tokenizer, chat_template=True, processor=processor).generate(
        [t.prompt for t in tasks[:3]], **args)
    assert [g[0].response_ids for g in ours] == [g[0].response_ids for g in theirs]
    assert [g[0].prompt_ids for g in ours] == [g[0].prompt_ids for g in theirs]


def test_what_cannot_take_images_refuses_them_in_one_line(tiny, tiny_vlm, tasks):
    from rftflow.components.explore.engines import OpenAIRolloutEngine
    from rftflow.components.explore.models import check_images

    model, tokenizer = tiny
    images = task_images(tasks[0])
    with pytest.raises(ValueError, match="Qwen2ForCausalLM is a text model: it takes no images"):
        HFRolloutEngine(model, tokenizer).encode(tasks[0].prompt, images)
    with pytest.raises(ValueError, match="the openai engine's model m is a text model: it takes no images"):
        OpenAIRolloutEngine("http://127.0.0.1:9", "m", tokenizer).generate([tasks[0].prompt], images=[images])
    algorithm = CampaignConfig().algorithm.resolve()
    base = {"taskset": {"source": "builtin:vision"}, "model": {"path": "builtin:tiny-vlm"}}
    check_images(CampaignConfig.model_validate(base), {None: tasks[:1]}, algorithm)  # fine
    check_images(CampaignConfig.model_validate({**base, "model": {**base["model"], "lora": {"rank": 4}}}),
                 {None: tasks[:1]}, algorithm)  # LoRA on its language side: fine too
    for change, why in (({"model": {"path": "builtin:tiny"}}, "model.path builtin:tiny is a text model"),
                        ({"explorer": {"engine": "vllm"}}, "explorer.engine vllm samples text only")):
        with pytest.raises(ValueError, match=f"^taskset builtin:vision has images: {why}"):
            check_images(CampaignConfig.model_validate({**base, **change}), {None: tasks[:1]}, algorithm)
    with pytest.raises(ValueError, match="critic reads no images"):
        check_images(CampaignConfig.model_validate(base), {None: tasks[:1]},
                     CampaignConfig.model_validate({"algorithm": {"name": "ppo"}}).algorithm.resolve())
