"""Fast path == reference path: the engine's behaviour log-probs equal the trainer's recomputation."""

import torch
from torch.testing import assert_close

from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.train.batching import batch_tensors, response_logprobs


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


def test_evaluation_splits_accuracy_into_finished_answers_and_their_accuracy(tiny):
    import copy

    from rftflow.components.algorithms import resolve
    from rftflow.components.config import TrainerConfig
    from rftflow.components.data.tasksets import Task
    from rftflow.components.evaluation.greedy import evaluate
    from rftflow.components.train.trainer import Trainer

    model, tokenizer = tiny
    tasks = [Task(f"t{i}", f"{i} + {i}", f"{i} + {i} =", str(2 * i)) for i in range(5, 29)]
    # a few SFT steps teach "answer, then EOS", so some greedy answers end within the budget
    trainer = Trainer(copy.deepcopy(model), tokenizer.pad_token_id, TrainerConfig(lr=3e-3), resolve("sft"))
    rows = [{"prompt_ids": tokenizer(t.prompt, add_special_tokens=False)["input_ids"], "source": "expert",
             "response_ids": tokenizer(t.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id],
             "reward": 1.0, "group_id": t.task_id} for t in tasks]
    for _ in range(20):
        trainer.train(rows, [list(range(len(rows)))])
    engine = HFRolloutEngine(trainer.unwrapped, tokenizer)

    def reward(text: str, task: Task) -> float:  # scores some answers 1 and others 0, right or wrong
        return float(text.strip()[-1:] in "024")

    for budget in (2, 4, 12):
        metrics = evaluate(engine, tasks, reward, budget)
        rollouts = [g[0] for g in engine.generate([t.prompt for t in tasks], n=1, max_new_tokens=budget, greedy=True)]
        finished = [r.finished for r in rollouts]
        correct = [reward(r.text, t) == 1.0 for r, t in zip(rollouts, tasks)]
        assert metrics["accuracy/finished"] == sum(finished) / len(tasks)
        assert metrics["accuracy/held_out"] == sum(correct) / len(tasks)
        assert metrics["accuracy/of_finished"] == sum(c and f for c, f in zip(correct, finished)) / max(1, sum(finished))
    short, long = evaluate(engine, tasks, reward, 1), evaluate(engine, tasks, reward, 12)
    assert short["accuracy/finished"] < long["accuracy/finished"] and long["accuracy/finished"] > 0.5
    assert 0 < long["accuracy/of_finished"] < 1


def test_a_response_ends_at_any_eos_id_of_the_generation_config(tiny):
    """As generate, vLLM and TRL: an instruct model's config may list its end of turn beside its EOS."""
    import copy

    model, tok = tiny
    [[free]] = HFRolloutEngine(model, tok).generate(["12+3="], n=1, max_new_tokens=8, greedy=True)
    first = free.response_ids[0]
    assert first != tok.eos_token_id and len(free.response_ids) > 1
    listing = copy.deepcopy(model)
    listing.generation_config.eos_token_id = [tok.eos_token_id, first]
    [[cut]] = HFRolloutEngine(listing, tok).generate(["12+3="], n=1, max_new_tokens=8, greedy=True)
    assert cut.response_ids == [first] and cut.finished


def test_same_bits_compares_the_bytes_a_digest_hashes():
    from rftflow.components.explore.engines import same_bits, weights_digest

    a = torch.tensor([[1.0, -0.0], [float("nan"), 3.5]])
    assert same_bits(a, a.clone())  # a NaN is its own bit pattern
    assert not same_bits(a, torch.tensor([[1.0, 0.0], [float("nan"), 3.5]]))  # -0.0 is not 0.0
    assert not same_bits(a, a.double()) and not same_bits(a, a.reshape(4))
    for dtype in (torch.bfloat16, torch.int64, torch.uint8):
        b = torch.arange(6).reshape(2, 3).to(dtype)
        changed = b.clone()
        changed[1, 2] += 1
        assert same_bits(b, b.clone()) and not same_bits(b, changed)
        assert (weights_digest({"w": b}, ["w"]) == weights_digest({"w": changed}, ["w"])) == same_bits(b, changed)
