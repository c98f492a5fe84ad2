"""Fast path == reference path: the engine's behaviour log-probs equal the trainer's recomputation."""

import torch
from torch.testing import assert_close

from components.explore.engines import HFRolloutEngine
from components.train.batching import batch_tensors, response_logprobs


def test_behaviour_logprobs_match_trainer_recomputation(tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)
    engine = HFRolloutEngine(model, tokenizer, batch_size=5)
    groups = engine.generate(["1 + 2 =", "34 - 5 ="], n=4, max_new_tokens=6, temperature=0.9)
    rollouts = [r for g in groups for r in g]
    assert len(groups) == 2 and all(len(g) == 4 for g in groups)
    assert all(len(r.response_ids) == len(r.logprobs) > 0 for r in rollouts)
    batch = batch_tensors([{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in rollouts],
                          tokenizer.pad_token_id)
    with torch.no_grad():
        recomputed = response_logprobs(model, batch, temperature=0.9)  # (B, R)
    for i, r in enumerate(rollouts):
        assert_close(recomputed[i, :len(r.logprobs)], torch.tensor(r.logprobs), atol=2e-4, rtol=1e-4)
    assert batch["mask"].sum() == sum(len(r.response_ids) for r in rollouts)


def test_greedy_generation_is_deterministic_and_decodes_text(tiny):
    model, tokenizer = tiny
    engine = HFRolloutEngine(model, tokenizer)
    a = engine.generate(["12 + 3 ="], greedy=True, max_new_tokens=5)[0][0]
    b = engine.generate(["12 + 3 ="], greedy=True, max_new_tokens=5)[0][0]
    assert a.response_ids == b.response_ids
    assert a.text == tokenizer.decode(a.response_ids, skip_special_tokens=True)


def test_sampling_draws_from_the_full_distribution_not_top_k(tiny):
    # The untrained model is close to uniform over 259 tokens: 512 draws of the first token show far
    # more than the 50 distinct tokens a default top-k would allow.
    model, tokenizer = tiny
    torch.manual_seed(0)
    groups = HFRolloutEngine(model, tokenizer).generate(["7 ="], n=512, max_new_tokens=1, temperature=1.0)
    assert len({g.response_ids[0] for g in groups[0]}) > 100


def test_rows_that_finish_early_leave_the_batch_and_keep_exact_logprobs(tiny):
    # A hook makes EOS likely at every step (in generation and in the recomputation alike), so rows
    # end at different lengths: the loop drops them from its batch and KV cache as they finish.
    model, tokenizer = tiny
    eos = tokenizer.eos_token_id

    def favour_eos(_module, _inputs, logits):
        logits[..., eos] += 5.0
        return logits

    hook = model.lm_head.register_forward_hook(favour_eos)
    try:
        torch.manual_seed(1)
        groups = HFRolloutEngine(model, tokenizer).generate(["1 + 2 =", "34 - 5 ="], n=8, max_new_tokens=8)
        rollouts = [r for g in groups for r in g]
        lengths = {len(r.response_ids) for r in rollouts}
        assert len(lengths) > 2, lengths  # rows finished at several different steps
        for r in rollouts:
            assert r.finished == (r.response_ids[-1] == eos) and (r.finished or len(r.response_ids) == 8)
            assert eos not in r.response_ids[:-1]
        batch = batch_tensors([{"prompt_ids": r.prompt_ids, "response_ids": r.response_ids} for r in rollouts],
                              tokenizer.pad_token_id)
        with torch.no_grad():
            recomputed = response_logprobs(model, batch)  # (B, R)
    finally:
        hook.remove()
    for i, r in enumerate(rollouts):
        assert_close(recomputed[i, :len(r.logprobs)], torch.tensor(r.logprobs), atol=2e-4, rtol=1e-4)
