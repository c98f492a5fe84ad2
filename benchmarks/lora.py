"""LoRA against full weights on the same batches: peak memory, seconds per train step, checkpoint
size and sync time.

Each variant runs in a process of its own (its peak resident memory is its own): the model loaded,
a ``Trainer`` (GRPO, AdamW) built full-weight or with ``model.lora``'s adapter, ``--steps`` optimizer
steps on the same fixed batches (``--rows`` rows of ``--prompt`` + ``--response`` tokens), then a
checkpoint (``save_trainer``: the weights or the adapter, the optimizer state) and ``--syncs`` weight
syncs into an ``hf`` engine's copy (``MemoryWeightSync``: the policy's tensors, or the base with the
adapter merged in). Peak memory is the process's max RSS on CPU, ``max_memory_allocated`` on a GPU.

    python benchmarks/lora.py                                    # SmolLM2-135M-Instruct, rank 16
    python benchmarks/lora.py --model builtin:tiny --rank 8 --steps 5
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def variant(args: argparse.Namespace) -> dict:
    """One variant's figures (run in a process of its own)."""
    import torch

    from rftflow.components.algorithms import resolve
    from rftflow.components.config import LoraConfig, TrainerConfig
    from rftflow.components.explore.engines import HFRolloutEngine
    from rftflow.components.explore.models import load_model
    from rftflow.components.explore.sync import MemoryWeightSync
    from rftflow.components.train.checkpoints import save_trainer
    from rftflow.components.train.trainer import Trainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    explorer = HFRolloutEngine(copy.deepcopy(model), tokenizer)
    gpu = torch.cuda.is_available()
    if gpu:
        explorer.model.to("cuda")
    lora = LoraConfig(rank=args.rank, alpha=2.0 * args.rank) if args.variant == "lora" else None
    trainer = Trainer(model, tokenizer.pad_token_id, TrainerConfig(lr=1e-5, micro_batch_size=args.rows),
                      resolve("grpo"), lora=lora)
    vocab = len(tokenizer)
    generator = torch.Generator().manual_seed(1)
    rows = [{"prompt_ids": torch.randint(3, vocab, (args.prompt,), generator=generator).tolist(),
             "response_ids": torch.randint(3, vocab, (args.response,), generator=generator).tolist(),
             "response_logprobs": [-2.0] * args.response, "source": "explorer", "group_id": f"g{i // 4}",
             "reward": float(i % 2)} for i in range(args.rows)]
    steps = [list(range(len(rows)))]
    trainer.train(rows, steps)  # warm-up: allocations, the optimizer's state
    began = time.perf_counter()
    for _ in range(args.steps):
        trainer.train(rows, steps)
    step_s = (time.perf_counter() - began) / args.steps
    with tempfile.TemporaryDirectory() as out:
        save_trainer(trainer, Path(out), base=args.model)
        checkpoint = sum(p.stat().st_size for p in Path(out).rglob("*") if p.is_file())
    sync = MemoryWeightSync(trainer.policy_weights, explorer)
    began = time.perf_counter()
    for version in range(args.syncs):
        sync.publish(version)
    sync_s = (time.perf_counter() - began) / args.syncs
    peak = (torch.cuda.max_memory_allocated() if gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    trainable = sum(p.numel() for p in trainer.unwrapped.parameters() if p.requires_grad)
    return {"variant": args.variant, "peak_bytes": peak, "step_s": step_s, "checkpoint_bytes": checkpoint,
            "sync_s": sync_s, "trainable": trainable, "device": "cuda" if gpu else "cpu"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:smollm2-135m-instruct")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (alpha = 2 × rank, all linear layers)")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", choices=("full", "lora"), help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(variant(args)))
        return
    results = {}
    for name in ("full", "lora"):  # one after the other: neither shares the cores with the other
        child = [a for a in sys.argv[1:]] + ["--variant", name]
        done = subprocess.run([sys.executable, __file__, *child], capture_output=True, text=True, check=True)
        results[name] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = results["full"], results["lora"]
    print(f"model: {args.model}; rank {args.rank}; {args.rows} rows × {args.prompt}+{args.response} tokens; "
          f"device: {full['device']}; threads: {args.threads}")
    print(f"{'':<22}{'full':>12}{'LoRA':>12}{'full / LoRA':>13}")
    lines = [("trainable params", "trainable", 1, "{:,.0f}"), ("peak memory MiB", "peak_bytes", 2**20, "{:.0f}"),
             ("s / train step", "step_s", 1, "{:.3f}"), ("checkpoint MiB", "checkpoint_bytes", 2**20, "{:.2f}"),
             ("s / sync", "sync_s", 1, "{:.4f}")]
    for label, key, unit, form in lines:
        a, b = full[key] / unit, lora[key] / unit
        print(f"{label:<22}{form.format(a):>12}{form.format(b):>12}{a / b:>12.2f}x")


if __name__ == "__main__":
    main()
