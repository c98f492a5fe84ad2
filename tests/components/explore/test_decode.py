import copy

import pytest
import torch
from torch.testing import assert_close

from rftflow.components.explore.decode import CacheSteps, LeanSteps, decode_steps, lean_unsupported, prefill


def both_ways(model, prompts, n: int, steps: int, vocab: int, drop_at: int):
    """Logits of ``steps`` decode steps (random tokens; at ``drop_at`` every third row leaves) through
    the model's own forward and through ``LeanSteps``, from one prefill each."""
    torch.manual_seed(0)
    device = next(model.parameters()).device
    tokens = torch.randint(3, vocab, (steps, len(prompts) * n)).to(device)
    seen = {}
    for kind in (CacheSteps, LeanSteps):
        with torch.inference_mode():
            _, cache, attention, last = prefill(model, prompts, pad_id=0)
            walker = kind(model, cache, attention, n, steps)
            active, position, out = torch.arange(len(prompts) * n, device=device), last.repeat_interleave(n, 0), []
            for s in range(steps):
                if s == drop_at:
                    keep = torch.tensor([i for i in range(len(active)) if i % 3 != 1], device=device)
                    walker.keep(keep)
                    active, position = active[keep], position[keep]
                position = position + 1
                out.append(walker.step(tokens[s, active], position))
        seen[kind] = out
    return seen[CacheSteps], seen[LeanSteps]


def test_lean_steps_give_the_models_own_logits_qwen2(tiny):
    model, tokenizer = tiny
    assert lean_unsupported(model) is None
    prompts = [tokenizer("12+7=")["input_ids"], tokenizer("3+45+6=")["input_ids"], tokenizer("9=")["input_ids"]]
    reference, lean = both_ways(model.eval(), prompts, n=4, steps=6, vocab=len(tokenizer), drop_at=3)
    assert [r.shape for r in reference] == [x.shape for x in lean] and lean[3].shape[0] == 8  # rows left
    for r, x in zip(reference, lean):
        assert_close(x, r, atol=2e-5, rtol=1e-4)
    assert (reference[0] - reference[1]).abs().max() > 0.1  # the steps differ: the check can fail


def test_lean_steps_give_the_models_own_logits_llama_with_biases_gqa_and_rope_scaling():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=2, max_position_embeddings=128, attention_bias=True, mlp_bias=True,
                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # biases start at zero: make them count
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.2)
    assert lean_unsupported(model) is None
    reference, lean = both_ways(model, [[5, 6, 7, 8, 9], [10, 11]], n=3, steps=5, vocab=97, drop_at=2)
    for r, x in zip(reference, lean):
        assert_close(x, r, atol=2e-5, rtol=1e-4)


def test_other_models_take_their_own_forward(tiny):
    from transformers import GPT2Config, GPT2LMHeadModel

    model, _ = tiny
    windowed = copy.deepcopy(model)
    windowed.config.use_sliding_window, windowed.config.sliding_window = True, 4
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    assert "sliding" in lean_unsupported(windowed)
    assert "GPT2LMHeadModel" in lean_unsupported(gpt2)
    with torch.inference_mode():
        _, cache, attention, _ = prefill(gpt2, [[1, 2, 3]], pad_id=0)
    assert isinstance(decode_steps(gpt2, cache, attention, 2, 4), CacheSteps)


@pytest.mark.parametrize("greedy", [True, False])
def test_engine_samples_the_same_through_either_steps(tiny, greedy):
    """The engine's rollouts (tokens and log-probs) do not depend on which steps it takes."""
    from rftflow.components.explore.engines import HFRolloutEngine

    model, tokenizer = tiny
    prompts = ["12+7=", "3+45+6=", "9="]

    def sample(lean_steps: bool):
        torch.manual_seed(3)
        engine = HFRolloutEngine(model, tokenizer, lean_steps=lean_steps)
        return engine.generate(prompts, n=4, max_new_tokens=12, greedy=greedy)

    lean = sample(True)
    reference = sample(False)
    for lean_group, reference_group in zip(lean, reference):
        for a, b in zip(lean_group, reference_group):
            assert a.response_ids == b.response_ids
            assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=2e-5, rtol=1e-4)
    assert any(len(r.response_ids) > 1 for g in lean for r in g)


def test_a_hooked_or_adapted_model_takes_its_own_forward(tiny):
    model, _ = tiny
    hooked = copy.deepcopy(model)
    hooked.lm_head.register_forward_hook(lambda module, args, out: out)
    adapted = copy.deepcopy(model)
    adapted.model.layers[1].mlp.up_proj = torch.nn.Sequential(adapted.model.layers[1].mlp.up_proj)
    from accelerate.hooks import ModelHook, add_hook_to_module

    offloaded = copy.deepcopy(model)
    add_hook_to_module(offloaded.model.layers[0], ModelHook())
    assert lean_unsupported(hooked) == "forward hooks"
    assert lean_unsupported(offloaded) == "accelerate hooks"
    assert lean_unsupported(adapted) == "projections other than nn.Linear"


def test_fused_weights_follow_a_weight_sync(tiny):
    """The concatenated weights are kept between generate batches, and made again after the
    model's weights change in place (as a weight sync does)."""
    from rftflow.components.explore.decode import fused_weights

    model = copy.deepcopy(tiny[0]).eval()
    first = fused_weights(model)
    assert fused_weights(model) is first  # nothing changed: kept
    with torch.no_grad():
        model.model.layers[2].self_attn.k_proj.weight.add_(1.0)
    again = fused_weights(model)
    assert again is not first
    attn = model.model.layers[2].self_attn
    q_rows = attn.q_proj.out_features
    assert_close(again[2].qkv[:, q_rows:q_rows + attn.k_proj.out_features], attn.k_proj.weight.t())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="decoding on a GPU needs one (none here)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_steps_on_a_gpu_give_the_models_own_logits(tiny, dtype):
    """On the GPU, in float32 and in bfloat16: the lean step within the model's own rounding of
    its float32 logits (TF32 matmuls included), rows leaving mid-way."""
    model, tokenizer = tiny
    prompts = [tokenizer("12+7=")["input_ids"], tokenizer("3+45+6=")["input_ids"], tokenizer("9=")["input_ids"]]
    exact, _ = both_ways(copy.deepcopy(model).eval(), prompts, n=4, steps=6, vocab=len(tokenizer), drop_at=3)
    on_gpu = copy.deepcopy(model).to("cuda", dtype).eval()
    reference, lean = both_ways(on_gpu, prompts, n=4, steps=6, vocab=len(tokenizer), drop_at=3)
    for e, r, x in zip(exact, reference, lean):
        assert x.device.type == "cuda" and x.dtype == dtype
        model_error = (r.float().cpu() - e).abs().max()
        assert (x.float().cpu() - e).abs().max() <= 2 * model_error + 1e-4
    assert (exact[0] - exact[1]).abs().max() > 0.1  # the steps differ: the check can fail


def test_lean_steps_in_bfloat16_stay_as_close_as_the_models_own_forward(tiny):
    """Half precision (as on a GPU): the lean step keeps RMSNorm's mean of squares and the
    softmax in float32 like the model does, so it lands within bfloat16's rounding of the model's
    own bfloat16 logits (both measured against float32)."""
    model, tokenizer = tiny
    half = copy.deepcopy(model).to(torch.bfloat16).eval()
    prompts = [tokenizer("12+7=")["input_ids"], tokenizer("3+45+6=")["input_ids"]]
    exact, _ = both_ways(model.eval(), prompts, n=2, steps=4, vocab=len(tokenizer), drop_at=2)
    reference, lean = both_ways(half, prompts, n=2, steps=4, vocab=len(tokenizer), drop_at=2)
    for e, r, x in zip(exact, reference, lean):
        model_error = (r.float() - e).abs().max()
        assert (x.float() - e).abs().max() <= 2 * model_error + 1e-2
        assert x.dtype == torch.bfloat16


@pytest.mark.parametrize("which", ["qwen2", "gpt2"])
def test_prompts_prefilled_in_chunks_decode_as_from_one_forward(tiny, monkeypatch, which):
    """Prompts of unequal length prefilled in chunks of similar length, their caches joined, give
    the one forward's last logits and the same decode steps after, in the prompts' order."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rftflow.components.explore import decode

    torch.manual_seed(2)
    model = tiny[0].eval() if which == "qwen2" else GPT2LMHeadModel(
        GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=2, n_positions=64)).eval()
    prompts = [[int(t) for t in torch.randint(3, 50, (length,))] for length in (9, 2, 5, 3, 9, 7, 4)]
    forwards = []
    real_forward = decode.forward_with_cache
    monkeypatch.setattr(decode, "forward_with_cache", lambda *a, **k: forwards.append(1) or real_forward(*a, **k))
    runs = {}
    for budget in (10_000, 14):
        monkeypatch.setattr(decode, "PREFILL_TOKENS", budget)
        forwards.clear()
        torch.manual_seed(0)
        tokens = torch.randint(3, 50, (4, len(prompts)))
        with torch.inference_mode():
            last, cache, attention, position = prefill(model, prompts, pad_id=0)
            chunks = len(forwards)
            steps, out = decode_steps(model, cache, attention, 1, 4), [last]
            for s in range(4):
                position = position + 1
                out.append(steps.step(tokens[s], position))
        runs[budget] = chunks, out
    (one, whole), (several, chunked) = runs[10_000], runs[14]
    assert one == 1 and several >= 4
    for a, b in zip(whole, chunked):
        assert_close(b, a, atol=2e-5, rtol=1e-4)
    assert (whole[0][0] - whole[0][1]).abs().max() > 0.1  # rows differ: a row put back in the wrong place fails
