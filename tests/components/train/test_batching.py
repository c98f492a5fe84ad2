import copy

import pytest
import torch

from components.train.batching import batch_tensors, behaviour_logprobs, response_logprobs


def _rows(tokenizer, *, groups: int, per_group: int, seed: int = 0) -> list[dict]:
    """``groups`` prompts of different lengths, ``per_group`` responses of different lengths each."""
    rng = torch.Generator().manual_seed(seed)
    rows = []
    for g in range(groups):
        prompt = tokenizer(f"{g * 7} + {g * 13 % 97} =", add_special_tokens=False)["input_ids"][: 5 + g % 4]
        for _ in range(per_group):
            length = int(torch.randint(1, 8, (1,), generator=rng))
            rows.append({"prompt_ids": prompt, "response_ids": torch.randint(5, 20, (length,), generator=rng).tolist()})
    return rows


def _logprobs_and_grads(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    model.zero_grad()
    logprobs = response_logprobs(model, batch, temperature=0.8) * batch["mask"]  # (B, R)
    (logprobs.sum() / batch["mask"].sum()).backward()
    return logprobs.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])


def test_rows_sharing_prompts_run_each_prompt_once_with_the_same_logprobs_and_gradients(tiny):
    model, tokenizer = tiny
    policy = copy.deepcopy(model).train()
    rows = _rows(tokenizer, groups=4, per_group=4)
    batch = batch_tensors(rows, tokenizer.pad_token_id)
    assert batch["shared_prompt_ids"].shape[0] == 4 and batch["prompt_index"].tolist() == [g for g in range(4) for _ in range(4)]
    full = {k: v for k, v in batch.items() if k not in ("shared_prompt_ids", "shared_prompt_attention", "prompt_index")}
    shared_logprobs, shared_grads = _logprobs_and_grads(policy, batch)
    full_logprobs, full_grads = _logprobs_and_grads(policy, full)
    assert torch.allclose(shared_logprobs, full_logprobs, atol=1e-5)
    assert float((shared_grads - full_grads).norm() / full_grads.norm()) < 1e-4
    assert float(full_grads.norm()) > 0


def test_rows_with_distinct_prompts_keep_the_full_layout(tiny):
    _, tokenizer = tiny
    assert "prompt_index" not in batch_tensors(_rows(tokenizer, groups=8, per_group=1), tokenizer.pad_token_id)
    shared = batch_tensors(_rows(tokenizer, groups=2, per_group=1) * 2, tokenizer.pad_token_id)
    assert shared["prompt_index"].tolist() == [0, 1, 0, 1]


@pytest.mark.parametrize("length", [1, 2])
def test_one_and_two_token_responses_over_shared_prompts(tiny, length):
    model, tokenizer = tiny
    rows = [{**r, "response_ids": r["response_ids"][:length]} for r in _rows(tokenizer, groups=2, per_group=3, seed=1)]
    batch = batch_tensors(rows, tokenizer.pad_token_id)
    full = {k: v for k, v in batch.items() if k not in ("shared_prompt_ids", "shared_prompt_attention", "prompt_index")}
    with torch.no_grad():
        assert torch.allclose(response_logprobs(model, batch) * batch["mask"],
                              response_logprobs(model, full) * batch["mask"], atol=1e-5)


def test_layout_and_behaviour_logprobs_of_hand_built_rows():
    # given two rows of different prompt and response lengths, one with a mask and log-probs
    rows = [{"prompt_ids": [7, 8], "response_ids": [3], "response_logprobs": [-0.5]},
            {"prompt_ids": [9], "response_ids": [4, 5], "response_mask": [1, 0]}]
    batch = batch_tensors(rows, pad_id=0)
    # then prompts are left-padded, responses right-padded, positions count real tokens only
    assert batch["input_ids"].tolist() == [[7, 8, 3, 0], [0, 9, 4, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [0, 1, 1, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 2], [0, 0, 1, 2]]
    assert batch["response_ids"].tolist() == [[3, 0], [4, 5]] and batch["mask"].tolist() == [[1, 0], [1, 0]]
    # and recorded log-probs replace the fallback where a row has them, the rest keeps it
    fallback = torch.tensor([[-1.0, -2.0], [-3.0, -4.0]], requires_grad=True)
    old = behaviour_logprobs(rows, fallback)
    assert old.tolist() == [[-0.5, -2.0], [-3.0, -4.0]] and not old.requires_grad
