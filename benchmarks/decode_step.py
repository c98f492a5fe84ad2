"""The rollout engine's decode steps: the model's own forward against ``LeanSteps``.

For ``--rows`` rows (``--prompts`` prompts x the rest as their group) after one prefill, times
``--steps`` decode steps each way (``components.explore.decode``: ``CacheSteps`` through
``model(...)`` and a ``DynamicCache``, ``LeanSteps`` as direct tensor calls with K/V buffers), and
a whole sampled ``HFRolloutEngine.generate`` of the same prompts each way (rows leave as they
end). Prints ms per step, the ratio, and the largest logit difference between the two.

    python benchmarks/decode_step.py                          # builtin:tiny, 64 rows, 8 and 32 steps
    python benchmarks/decode_step.py --model builtin:smollm2-135m-instruct --rows 16
    python benchmarks/decode_step.py --device cuda --dtype bfloat16   # on a GPU (timed after a synchronize)
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import torch

import rftflow.flows  # noqa: F401  (quiet library defaults)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--steps", default="8,32", help="decode steps, one setting per value")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per side; the median is reported")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def clock() -> float:
        """Seconds, once the device's queued work is done."""
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter()

    from rftflow.components.explore import decode
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.models import load_model

    model, tokenizer = load_model(args.model, dtype=args.dtype)
    model.to(args.device).eval()
    where = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else f"CPU, {args.threads} threads"
    unsupported = decode.lean_unsupported(model)
    lean = "used" if unsupported is None else f"not possible: {unsupported}"
    print(f"{args.model} ({args.dtype}): lean steps {lean}; {args.rows} rows; {where}")
    n = args.rows // args.prompts
    prompts = [f"{17 * i % 90 + 3} + {31 * i % 70 + 5} =" for i in range(args.prompts)]
    encoded = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]

    @torch.inference_mode()
    def steps(kind, count: int, fed: list[torch.Tensor] | None = None) -> tuple[float, list[torch.Tensor]]:
        """Seconds for ``count`` steps after a prefill (not timed), and their logits; each step feeds
        the last step's argmax, or ``fed``'s tokens (the same tokens each way, for the comparison)."""
        _, cache, attention, last = decode.prefill(model, encoded, tokenizer.pad_token_id or 0)
        walker = kind(model, cache, attention, n, count)
        token = torch.full((len(encoded) * n,), encoded[0][0], dtype=torch.long, device=args.device)
        position, logits = last.repeat_interleave(n, 0), []
        start = clock()
        for _ in range(count):
            position = position + 1
            logits.append(walker.step(token, position))
            token = logits[-1].argmax(-1) if fed is None else fed[len(logits) - 1].argmax(-1)
        return clock() - start, logits

    for count in (int(s) for s in args.steps.split(",")):
        times: dict[str, list[float]] = {"model": [], "lean": []}
        for _ in range(args.repeats):  # interleaved, so a slow spell of the machine hits both
            for name, kind in (("model", decode.CacheSteps), ("lean", decode.LeanSteps)):
                times[name].append(steps(kind, count)[0])
        reference = steps(decode.CacheSteps, count)[1]
        apart = max((a - b).abs().max().item() for a, b in zip(reference, steps(decode.LeanSteps, count, reference)[1]))
        model_ms, lean_ms = (median(times[k]) / count * 1e3 for k in ("model", "lean"))
        print(f"{count} steps of {args.rows} rows: model(...) {model_ms:.2f} ms a step, lean {lean_ms:.2f} "
              f"({model_ms / lean_ms:.2f}x); largest logit difference {apart:.1e}")

    engines = {"model": HFRolloutEngine(model, tokenizer, lean_steps=False), "lean": HFRolloutEngine(model, tokenizer)}
    count = max(int(s) for s in args.steps.split(","))
    generate = {"model": [], "lean": []}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            torch.manual_seed(0)
            start = clock()
            engine.generate(prompts, n=n, max_new_tokens=count)
            generate[name].append(clock() - start)
    model_s, lean_s = median(generate["model"]), median(generate["lean"])
    print(f"generate (sampled, up to {count} tokens): model(...) {model_s * 1e3:.1f} ms, lean {lean_s * 1e3:.1f} "
          f"({model_s / lean_s:.2f}x)")


if __name__ == "__main__":
    main()
