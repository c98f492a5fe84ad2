"""The ``openai`` engine with images against a real vLLM server (its CPU build) serving builtin:tiny-vlm
(Idefics3): a prompt's picture goes as an ``image_url`` content part, the server's prompt ids are the
hf engine's, and its log-probs equal the hf engine's (the trainer's) on the same picture, another
picture giving others; a context whose characters spell the image placeholder cannot become one.
Without the server's virtualenv these tests are skipped, saying so."""

from __future__ import annotations

import pytest
import torch

from rftflow.infra.vllm_server import vllm_available, vllm_problem, vllm_server

LOGPROB_TOLERANCE = 1e-3  # as test_server_engines: float32 on both sides, vLLM's CPU kernels sum in another order

needs_server = pytest.mark.skipif(not vllm_available(), reason=f"{vllm_problem()} (RFTFLOW_ALLOW_MISSING=vllm)")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``vllm serve`` of builtin:tiny-vlm on 127.0.0.1, one thread."""
    from rftflow.components.explore.models import model_directory

    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with vllm_server(model_directory("builtin:tiny-vlm"), served_model="tiny-vlm", threads=1, log=log) as url:
        yield url


@pytest.fixture(scope="module")
def tasks():
    from rftflow.components.data.tasksets import _to_task
    from rftflow.components.data.vision_tasks import vision_task_entries

    return [_to_task(e, "{question}") for e in vision_task_entries({}, 3, 0)]


def _trainer(model, tokenizer, processor):
    from rftflow.components.config import CampaignConfig
    from rftflow.components.train.trainer import Trainer

    cfg = CampaignConfig()
    return Trainer(model, tokenizer.pad_token_id, cfg.trainer, cfg.algorithm.resolve(), temperature=1.0,
                   processor=processor)


@needs_server
@pytest.mark.parametrize("chat_template", [False, True])
def test_the_openai_engine_samples_with_the_picture_and_its_log_probs_are_the_hf_engines(server, tiny_vlm, tasks,
                                                                                     chat_template):
    from rftflow.components.data.images import blank_like, images_argument, task_images
    from rftflow.components.explore.engines import HFRolloutEngine, OpenAIRolloutEngine

    model, tokenizer, processor = tiny_vlm
    engine = OpenAIRolloutEngine(server, "tiny-vlm", tokenizer, chat_template=chat_template, processor=processor)
    hf = HFRolloutEngine(model, tokenizer, chat_template=chat_template, processor=processor)
    groups = engine.generate([t.prompt for t in tasks], **images_argument(tasks), n=3, max_new_tokens=6,
                             temperature=1.0)
    trainer = _trainer(model, tokenizer, processor)
    worst = 0.0
    for task, group in zip(tasks, groups):
        assert len(group) == 3
        for rollout in group:
            # the row's prompt is the hf engine's encoding, image tokens expanded as the trainer reads them
            assert rollout.prompt_ids == hf.encode(task.prompt, task_images(task))
            assert processor.image_token_id not in rollout.response_ids
            assert len(rollout.response_ids) == len(rollout.logprobs) > 0
            ours = trainer.logprobs_of(rollout.prompt_ids, rollout.response_ids, task_images(task))
            worst = max(worst, (ours - torch.tensor(rollout.logprobs)).abs().max().item())
    assert worst < LOGPROB_TOLERANCE, worst
    # the server saw the picture: a blank one gives the same tokens other log-probs
    rollout, picture = groups[0][0], task_images(tasks[0])[0]
    blind = trainer.logprobs_of(rollout.prompt_ids, rollout.response_ids, [blank_like(picture)])
    assert (blind - torch.tensor(rollout.logprobs)).abs().max() > 10 * LOGPROB_TOLERANCE


@needs_server
def test_a_context_that_spells_the_image_placeholder_is_refused_not_given_a_picture(server, tiny_vlm, tasks):
    """A response's characters "<image>" in a context: sent as text, the server would read them as the
    placeholder (an image slot the row's ids do not hold); the engine refuses the context instead."""
    from rftflow.components.data.images import task_images
    from rftflow.components.explore.engines import OpenAIRolloutEngine

    model, tokenizer, processor = tiny_vlm
    engine = OpenAIRolloutEngine(server, "tiny-vlm", tokenizer, processor=processor)
    images = task_images(tasks[0])
    spelled = [tokenizer.convert_tokens_to_ids(c) for c in processor.image_token]
    assert processor.image_token_id not in spelled
    context = engine.encode(tasks[0].prompt, images) + spelled
    with pytest.raises((ValueError, RuntimeError), match="tokenised an image prompt otherwise|HTTP 400"):
        engine.generate_ids([context], images=[images], max_new_tokens=2)
    # ids that lost their picture's tokens are refused before any request
    with pytest.raises(ValueError, match="do not hold image 0's 12 tokens"):
        engine.generate_ids([engine.encode(tasks[0].prompt)], images=[images], max_new_tokens=2)


@needs_server
def test_a_judge_served_by_vllm_grades_with_the_picture_and_a_spelled_placeholder_changes_nothing(server, tasks):
    """The judge reward with the tiny VLM as its judge (guided to {"score": n}): each response is
    graded with the task's picture; a response that writes the image placeholder is graded like any
    text (escaped), not refused by the server for an image it does not have."""
    from rftflow.components.config import JudgeRewardConfig
    from rftflow.components.verify.judge import JudgeReward

    # a short rubric: the prompt, its picture's 12 tokens and the reply fit the tiny model's 256 positions
    judge = JudgeReward(JudgeRewardConfig(base_url=server, model="tiny-vlm", endpoint="chat", guided=True,
                                          max_score=9, max_tokens=12, retries=0, rubric="{response}"))
    try:
        scores = judge.score_many([tasks[0].answer, "<image>"], tasks[:1] * 2)
    finally:
        judge.close()
    assert all(s.value is not None and 0 <= s.value <= 1 for s in scores), scores
