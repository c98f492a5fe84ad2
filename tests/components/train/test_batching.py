import copy

import pytest
import torch

from rftflow.components.train import batching
from rftflow.components.train.batching import batch_tensors, behaviour_logprobs, response_logprobs


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


def _padded(batch: dict) -> dict:
    """The batch without its packed layout."""
    return {k: v for k, v in batch.items() if not k.startswith(("packed_", "logit_"))}


@pytest.mark.parametrize("bin_size", [512, 24, 12])
def test_packed_layout_gives_the_padded_layouts_logprobs_and_gradients(tiny, monkeypatch, bin_size):
    model, tokenizer = tiny
    monkeypatch.setattr(batching, "BIN_SIZES", (bin_size,))
    policy = copy.deepcopy(model).train()
    # given 4 prompts with 4 responses each, of different lengths
    rows = _rows(tokenizer, groups=4, per_group=4)
    batch = batch_tensors(rows, tokenizer.pad_token_id)
    # then the packed layout holds the real response tokens, and each prompt once per bin its rows are in
    bins = batching.cheapest_bins(rows, batching.PAIR_COST)
    prompts = sum(len(prompt) for units in bins for prompt, _, _ in units)
    assert int((batch["packed_ids"] != tokenizer.pad_token_id).sum()) == prompts + sum(len(r["response_ids"]) for r in rows)
    longest_row = max(len(r["prompt_ids"]) + len(r["response_ids"]) for r in rows)  # a bin holds one at least
    assert batch["packed_ids"].shape[1] <= max(bin_size, longest_row)
    if bin_size == 512:  # one bin, each prompt once
        assert batch["packed_ids"].shape[0] == 1 and prompts == sum(len(p) for p in {tuple(r["prompt_ids"]) for r in rows})
    else:  # groups cut into units: some prompt is in more than one bin
        assert batch["packed_ids"].shape[0] > 1 and len({u[0] for units in bins for u in units}) < sum(map(len, bins))
    # and its log-probs and gradients are the padded layout's
    packed_logprobs, packed_grads = _logprobs_and_grads(policy, batch)
    padded_logprobs, padded_grads = _logprobs_and_grads(policy, _padded(batch))
    assert torch.allclose(packed_logprobs, padded_logprobs, atol=1e-5)
    assert float((packed_grads - padded_grads).norm() / padded_grads.norm()) < 1e-4
    assert float(padded_grads.norm()) > 0


def test_the_cheapest_layout_is_chosen_by_its_cost():
    # given 8 prompts of 15 tokens with 8 responses of 30 tokens each
    rows = [{"prompt_ids": [g + 3] * 15, "response_ids": [5] * 30} for g in range(8) for _ in range(8)]
    costs = {size: batching.bins_cost(_bins_of(rows, size), 1e-3) for size in batching.BIN_SIZES}
    chosen = batching.cheapest_bins(rows, 1e-3)
    # then the chosen bins cost the least of the sizes tried (here a group a bin: 8 × 255)
    assert batching.bins_cost(chosen, 1e-3) == min(costs.values()) == costs[256]
    assert [sum(u[2] for u in units) for units in chosen] == [255] * 8
    # and the layout is packed when it costs less than the padded one, which attention makes dearer
    assert "packed_ids" in batch_tensors(rows, pad_id=0, pair_cost=1e-3)
    assert batching.layout_cost(64, 45, 1e-3) > costs[256] and batching.layout_cost(64, 45, 0) > 8 * 255
    # and with attention ten times dearer, a row a bin (its prompt with it) is cheapest: the padded
    # layout's cost, so the padded layout is kept
    assert [sum(u[2] for u in units) for units in batching.cheapest_bins(rows, 1e-2)] == [45] * 64
    assert "packed_ids" not in batch_tensors(rows, pad_id=0, pair_cost=1e-2)


def _bins_of(rows, size):
    import unittest.mock

    with unittest.mock.patch.object(batching, "BIN_SIZES", (size,)):
        return batching.cheapest_bins(rows, 1e-3)


def test_pair_cost_of_a_model(tiny):
    model, _ = tiny
    c = model.config
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    expected = 2 * c.num_hidden_layers * c.num_attention_heads * (c.hidden_size // c.num_attention_heads) / linear
    assert batching.attention_pair_cost(model) == pytest.approx(expected) and 0 < expected < 0.01
    # a model whose config names no layers or heads falls back to builtin:tiny's
    bare = torch.nn.Sequential(torch.nn.Linear(4, 4))
    bare.config = object()
    assert batching.attention_pair_cost(bare) == batching.PAIR_COST


def test_a_model_that_does_not_pack_gets_no_packed_layout_worked_out(tiny, monkeypatch):
    from rftflow.components.algorithms import resolve
    from rftflow.components.config import TrainerConfig
    from rftflow.components.train.trainer import Trainer

    model, tokenizer = tiny
    rows = _rows(tokenizer, groups=4, per_group=4)
    assert "packed_ids" in batch_tensors(rows, tokenizer.pad_token_id)
    assert "packed_ids" not in batch_tensors(rows, tokenizer.pad_token_id, pair_cost=None)
    # a trainer over a model that takes a 4-D mask packs; over one that does not, it never bins its rows
    assert "packed_ids" in Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(),
                                   resolve("grpo"))._batch(rows)
    windowed = copy.deepcopy(model)
    windowed.config.layer_types = ["sliding_attention"] * len(windowed.config.layer_types)
    trainer = Trainer(windowed, tokenizer.pad_token_id, TrainerConfig(), resolve("grpo"))
    monkeypatch.setattr(batching, "cheapest_bins", lambda *a: pytest.fail("binned rows for a model that does not pack"))
    assert trainer.pair_cost is None and "packed_ids" not in trainer._batch(rows)


def test_sizes_after_one_bin_are_not_tried(monkeypatch):
    # given rows that fit one bin of the smallest size
    rows = [{"prompt_ids": [3, 4], "response_ids": [5, 6]} for _ in range(4)]
    tried = []
    real = batching.bins_cost
    monkeypatch.setattr(batching, "bins_cost", lambda bins, c: tried.append(len(bins)) or real(bins, c))
    bins = batching.cheapest_bins(rows, batching.PAIR_COST)
    # then one size was tried, and its one bin holds the prompt once and the four responses
    assert tried == [1] and [sum(u[2] for u in units) for units in bins] == [2 + 4 * 2]


def test_hand_built_packed_layout():
    # given two responses to one prompt and a second prompt with one
    rows = [{"prompt_ids": [7, 8], "response_ids": [3]}, {"prompt_ids": [9], "response_ids": [4, 5, 6]},
            {"prompt_ids": [7, 8], "response_ids": [4, 5]}]
    batch = batching._packed(rows, batching.cheapest_bins(rows, batching.PAIR_COST), pad_id=0)
    # then the larger group comes first, each prompt once, positions continue each prompt
    assert batch["packed_ids"].tolist() == [[7, 8, 3, 4, 5, 9, 4, 5, 6]]
    assert batch["packed_positions"].tolist() == [[0, 1, 2, 2, 3, 0, 1, 2, 3]]
    # and a response sees its prompt and itself, not the other response to the same prompt
    allowed = batching.packed_allowed(batch)[0].int().tolist()
    assert allowed[3] == [1, 1, 0, 1, 0, 0, 0, 0, 0]  # row 2's first token
    assert allowed[4] == [1, 1, 0, 1, 1, 0, 0, 0, 0]
    assert allowed[7] == [0, 0, 0, 0, 0, 1, 1, 1, 0]  # row 1's second token
    # and each response token is predicted by the position before it
    assert batch["logit_for"].tolist() == [[0, 0], [2, 0], [2, 1], [1, 0], [1, 1], [1, 2]]
    assert batch["logit_at"].tolist() == [[0, 1], [0, 1], [0, 3], [0, 5], [0, 6], [0, 7]]


def test_rows_packing_would_not_shorten_keep_the_padded_layout_alone(tiny):
    _, tokenizer = tiny
    rows = [{"prompt_ids": [5 + g, 6, 7], "response_ids": [8, 9]} for g in range(8)]  # distinct prompts, one length
    assert "packed_ids" not in batch_tensors(rows, tokenizer.pad_token_id)
    assert "packed_ids" in batch_tensors(rows[:2] * 4, tokenizer.pad_token_id)


def test_models_whose_mask_or_positions_packing_would_change_keep_the_padded_layout(tiny):
    from transformers import BloomConfig, BloomForCausalLM, MistralConfig, MistralForCausalLM

    model, _ = tiny
    assert batching.packs(model)
    windowed = copy.deepcopy(model)
    windowed.config.layer_types = ["sliding_attention"] * len(windowed.config.layer_types)
    assert not batching.packs(windowed)
    small = {"vocab_size": 32, "hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1}
    mistral = MistralForCausalLM(MistralConfig(**small, num_key_value_heads=2, intermediate_size=32, sliding_window=4))
    assert not batching.packs(mistral)  # a window named only by ``sliding_window``
    assert not batching.packs(BloomForCausalLM(BloomConfig(vocab_size=32, hidden_size=16, n_head=2, n_layer=1)))  # ALiBi


def test_numpy_and_tuple_rows_pack_like_lists(tiny):
    import numpy as np

    _, tokenizer = tiny
    rows = _rows(tokenizer, groups=2, per_group=3)
    as_arrays = [{"prompt_ids": tuple(r["prompt_ids"]), "response_ids": np.array(r["response_ids"])} for r in rows]
    lists, arrays = (batch_tensors(x, tokenizer.pad_token_id) for x in (rows, as_arrays))
    assert all(torch.equal(lists[k], arrays[k]) for k in lists)


@pytest.mark.parametrize("length", [1, 2])
def test_one_and_two_token_responses_packed(tiny, length):
    model, tokenizer = tiny
    rows = [{**r, "response_ids": r["response_ids"][:length]} for r in _rows(tokenizer, groups=2, per_group=3, seed=1)]
    batch = batch_tensors(rows, tokenizer.pad_token_id)
    assert "packed_ids" in batch
    with torch.no_grad():
        assert torch.allclose(response_logprobs(model, batch) * batch["mask"],
                              response_logprobs(model, _padded(batch)) * batch["mask"], atol=1e-5)


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
