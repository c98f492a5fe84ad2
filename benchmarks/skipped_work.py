"""Two cuts of work that change no result, each against the work done in full, in one command.

1. The prefill of a taskset's held-out prompts (the greedy evaluation's first forward): in chunks
   of similar length (``components.explore.decode.prefill``, ``PREFILL_TOKENS`` padded tokens a
   chunk) against one forward over all of them left-padded to the longest. Prints seconds, the
   ratio, the share of the one forward that was padding, and the largest difference of the last
   logits.
2. A GRPO round whose groups all scored alike (advantages all 0) on the config's model: the
   trainer's step on zero gradients without forward and backward (``Trainer._idle``) against the
   computed step. Prints seconds, the ratio, and whether the weights came out equal.

    python benchmarks/skipped_work.py                          # gsm8k-smollm2: 200 prompts, 16 rows
    python benchmarks/skipped_work.py --config humaneval-smollm2 --prompts 82
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

import rftflow.flows  # noqa: F401  (quiet library defaults)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="gsm8k-smollm2")
    parser.add_argument("--prompts", type=int, default=200, help="held-out prompts prefilled")
    parser.add_argument("--rows", type=int, default=16, help="rows in the round without advantage")
    parser.add_argument("--response-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per side; the fastest is reported")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from rftflow.components.config import load_config
    from rftflow.components.data.tasksets import load_tasks
    from rftflow.components.explore import decode
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.models import load_model
    from rftflow.components.train.trainer import Trainer

    cfg = load_config(args.config)
    model, tokenizer = load_model(cfg.model.path)
    model.eval()
    engine = HFRolloutEngine(model, tokenizer, chat_template=cfg.model.chat_template)
    tasks = load_tasks(cfg.taskset.model_copy(update={"eval_size": args.prompts}), cfg.seed).held_out
    encoded = [engine.encode(t.prompt) for t in tasks[:args.prompts]]
    lengths = [len(p) for p in encoded]
    padding = 1 - sum(lengths) / (len(lengths) * max(lengths))
    print(f"{args.config}: {cfg.model.path}, {len(encoded)} held-out prompts of {min(lengths)} to {max(lengths)} "
          f"tokens (one forward: {padding:.0%} padding); CPU, {args.threads} threads")

    @torch.inference_mode()
    def prefill(budget: int) -> tuple[float, torch.Tensor]:
        decode.PREFILL_TOKENS = budget
        start = time.perf_counter()
        last = decode.prefill(model, encoded, tokenizer.pad_token_id)[0]
        return time.perf_counter() - start, last

    chunked_budget = decode.PREFILL_TOKENS
    times: dict[str, list[float]] = {"one forward": [], "chunks": []}
    for _ in range(args.repeats):  # interleaved, so a slow spell of the machine hits both
        one_s, one_last = prefill(10**9)
        chunked_s, chunked_last = prefill(chunked_budget)
        times["one forward"].append(one_s)
        times["chunks"].append(chunked_s)
    one_s, chunked_s = min(times["one forward"]), min(times["chunks"])
    apart = (one_last - chunked_last).abs().max().item()
    print(f"prefill: one forward {one_s:.1f} s, chunks of <= {chunked_budget} tokens {chunked_s:.1f} s "
          f"({one_s / chunked_s:.2f}x); largest last-logit difference {apart:.1e}")

    prompt = encoded[0]
    vocab = min(1000, model.config.vocab_size)  # token ids the model has (builtin:tiny's vocabulary is small)
    rows = [{"prompt_ids": prompt, "response_ids": [int(t) for t in torch.randint(vocab // 10, vocab,
                                                                                  (args.response_tokens,))],
             "response_logprobs": [-2.0] * args.response_tokens, "source": "explorer", "reward": 0.0,
             "group_id": f"g{i // 4}"} for i in range(args.rows)]
    steps = [list(range(args.rows))]
    trainers = {}
    for name in ("computed", "skipped"):
        trainer = Trainer(copy.deepcopy(model).train(), tokenizer.pad_token_id, cfg.trainer.model_copy(
            update={"micro_batch_size": args.rows}), cfg.algorithm.resolve())
        if name == "computed":
            trainer._idle = lambda *_: False
        trainers[name] = trainer
    train_times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(args.repeats):
        for name, trainer in trainers.items():
            start = time.perf_counter()
            trainer.train(rows, steps)
            train_times[name].append(time.perf_counter() - start)
    computed_s, skipped_s = min(train_times["computed"]), min(train_times["skipped"])
    equal = all(torch.equal(a, b) for a, b in zip(trainers["computed"].model.parameters(),
                                                  trainers["skipped"].model.parameters()))
    print(f"a round of {args.rows} rows without advantage ({len(prompt)} + {args.response_tokens} tokens each): "
          f"computed {computed_s:.2f} s, skipped {skipped_s:.2f} s ({computed_s / skipped_s:.1f}x); "
          f"weights equal after {args.repeats} rounds: {equal}")


if __name__ == "__main__":
    main()
