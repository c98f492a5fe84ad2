"""The hf engine samples a real model's own distribution, as TRL's ``GRPOTrainer`` does: on
SmolLM2-135M-Instruct (raw-text prompts, temperature 1, 32 new tokens), the same seed draws the same
response from rftflow's decode loop as from transformers' ``generate`` with the generation config
TRL 1.16 builds (top_k 0, top_p 1, the tokenizer's and the generation config's EOS ids), and over
many prompts the two samplers' response lengths, stop shares and rewards agree."""

from __future__ import annotations

import random
from statistics import mean, stdev

import pytest
import torch

pytestmark = pytest.mark.slow  # a 135M-parameter model on CPU

TOKENS = 32


@pytest.fixture(scope="module")
def smollm2():
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.models import load_model

    torch.set_num_threads(1)
    model, tokenizer = load_model("builtin:smollm2-135m-instruct")
    return model, tokenizer, HFRolloutEngine(model, tokenizer)


def questions(count: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(count)]
    return [(f"Question: what is {a} + {b}? Answer:", a + b) for a, b in pairs]


def trl_sampling(model, tokenizer):
    """The generation config TRL 1.16's ``GRPOTrainer`` samples with on the transformers path
    (trl/trainer/grpo_trainer.py: its EOS ids are the generation config's plus the tokenizer's)."""
    from transformers import GenerationConfig

    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    eos = eos if tokenizer.eos_token_id in eos else [tokenizer.eos_token_id, *eos]
    return GenerationConfig(max_new_tokens=TOKENS, do_sample=True, pad_token_id=tokenizer.pad_token_id,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, temperature=1.0, top_p=1.0,
                            top_k=0, min_p=None, repetition_penalty=1.0, disable_compile=True), set(eos)


def generated(model, tokenizer, prompts: list[str], n: int) -> list[list[int]]:
    """``n`` responses per prompt from ``model.generate`` as TRL calls it (left-padded, no special
    tokens added), each cut after its first EOS as TRL's completion mask cuts it."""
    config, eos = trl_sampling(model, tokenizer)
    batch = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    batch = {k: v.repeat_interleave(n, 0) for k, v in batch.items()}
    out = model.generate(**batch, generation_config=config)[:, batch["input_ids"].shape[1]:].tolist()
    return [row[:next((i + 1 for i, t in enumerate(row) if t in eos), len(row))] for row in out]


def test_one_seed_draws_the_same_response_from_rftflow_and_from_generate(smollm2):
    model, tokenizer, engine = smollm2
    lengths = set()
    for seed, (prompt, _) in enumerate(questions(12, 0)):
        torch.manual_seed(seed)
        [[ours]] = engine.generate([prompt], n=1, max_new_tokens=TOKENS, temperature=1.0)
        torch.manual_seed(seed)
        [theirs] = generated(model, tokenizer, [prompt], 1)
        assert ours.response_ids == theirs, (seed, tokenizer.decode(ours.response_ids), tokenizer.decode(theirs))
        lengths.add(len(theirs))
    assert len(lengths) > 2  # responses that stopped early and late: both stop rules were exercised


def test_length_stop_and_reward_distributions_agree_over_many_prompts(smollm2):
    from rftflow.components.data.tasksets import Task
    from rftflow.components.verify.rewards import math_verify

    model, tokenizer, engine = smollm2
    _, eos = trl_sampling(model, tokenizer)
    asked, n = questions(16, 1), 8
    prompts = [p for p, _ in asked]
    torch.manual_seed(0)
    ours = [r.response_ids for group in engine.generate(prompts, n=n, max_new_tokens=TOKENS) for r in group]
    torch.manual_seed(1)
    theirs = generated(model, tokenizer, prompts, n)
    answers = [total for _, total in asked for _ in range(n)]

    def measures(responses):
        texts = [tokenizer.decode(r, skip_special_tokens=True) for r in responses]
        return {"length": [len(r) for r in responses], "stopped": [float(r[-1] in eos) for r in responses],
                "reward": [math_verify(t, Task("t", "q", "q", str(a))) for t, a in zip(texts, answers)]}

    ours, theirs = measures(ours), measures(theirs)
    for name in ours:  # two independent samples of one distribution: means within 4 standard errors
        error = (stdev(ours[name]) ** 2 / len(ours[name]) + stdev(theirs[name]) ** 2 / len(theirs[name])) ** 0.5
        assert abs(mean(ours[name]) - mean(theirs[name])) < 4 * error + 1e-9, (name, mean(ours[name]),
                                                                               mean(theirs[name]), error)
