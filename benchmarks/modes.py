"""Wall time and final held-out accuracy of one campaign run in mode ``both`` and in mode ``async``
(the explorer one round ahead, overlapping the trainer), and the ratios.

The campaign is the default one (configs/arith-mix.yaml) cut to ``--rounds`` rounds after a
``--warmup``-step warm start; each mode runs in a fresh run dir, in this process, without Prefect
(``CampaignRun.run``: async runs its two lanes in threads); where ``.venv-vllm`` exists, also
``both`` with the ``openai`` engine against a vLLM CPU server started here. Torch threads: ``both`` uses all
cores; ``async`` gives each lane one share (``threads`` = cores // 2), as two processes on one
machine would. Times are the rounds' wall time (the warm start, identical in both, excluded).

    python benchmarks/modes.py
    python benchmarks/modes.py --rounds 20 --set explorer.tasks_per_round=64
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rftflow.flows  # noqa: E402,F401  (quiet service defaults)
from rftflow.components.campaign.preflight import preflight  # noqa: E402
from rftflow.components.campaign.run import CampaignRun  # noqa: E402
from rftflow.infra.vllm_server import VLLM_VENV, vllm_available, vllm_server  # noqa: E402

CONFIG = ROOT / "configs" / "arith-mix.yaml"


def timed_campaign(work: Path, mode: str, overrides: list[str], label: str) -> dict[str, float]:
    """Run the campaign in ``mode`` (in ``work/<label>``); the rounds' wall time, final accuracy and
    max staleness (also printed)."""
    import torch

    run = CampaignRun(preflight(CONFIG, work / label.replace(" ", "-"), [*overrides, f"mode={mode}"]))
    summary = run.run()
    history = run.tracker.client.get_metric_history(run.tracker.run_id, "sample/staleness_max")
    torch.set_num_threads(os.cpu_count() or 1)  # the next campaign starts from the default again
    result = {"rounds_s": summary["rounds_wall_seconds"], "accuracy": summary["eval_accuracy_after"],
              "staleness_max": max((m.value for m in history), default=0.0)}
    print(label, result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=300, help="warm-start steps")
    parser.add_argument("--set", action="append", default=[], help="config override, key=value")
    parser.add_argument("--no-openai", action="store_true", help="leave out the openai engine rows (no vLLM server)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    base = [f"rounds={args.rounds}", f"trainer.warmup_steps={args.warmup}", "eval.every=1000",
            "checkpoint.every=1000", *args.set]
    results = {}
    with tempfile.TemporaryDirectory() as work:
        results["both"] = timed_campaign(Path(work), "both", base, "both")
        results["async"] = timed_campaign(Path(work), "async", [*base, f"threads={max(1, cores // 2)}",
                                                                "sync.offset=1"], "async")
        if not args.no_openai and vllm_available():  # the explorer samples from a vLLM CPU server (reloaded per sync)
            from rftflow.components.explore.models import resolve_model_path

            with vllm_server(resolve_model_path("builtin:tiny"), served_model="tiny", threads=max(1, cores // 2),
                             log=Path(work) / "vllm.log", eager=False) as url:  # compiled: serving speed counts here
                served = [*base, "explorer.engine=openai", f"explorer.base_url={url}", "explorer.served_model=tiny",
                          f"threads={max(1, cores // 2)}"]
                results["both, openai engine (vLLM CPU)"] = timed_campaign(Path(work), "both", served, "openai")
                # async: the server generates round t + 1 while this process trains round t
                results["async, openai engine (vLLM CPU)"] = timed_campaign(Path(work), "async", [
                    *served, "sync.offset=1"], "openai-async")
        elif not args.no_openai:
            print(f"(no vLLM CPU env at {VLLM_VENV}: the openai engine row is left out; infra/vllm_cpu_env.sh builds it)")
    print(f"\n{args.rounds} rounds of the default campaign after {args.warmup} warm-start steps, {cores} cores\n")
    print("| mode | rounds wall s | held-out accuracy | max staleness |")
    print("| --- | --- | --- | --- |")
    for mode, r in results.items():
        print(f"| {mode} | {r['rounds_s']:.1f} | {r['accuracy']:.3f} | {r['staleness_max']:.0f} |")
    for mode in list(results)[1:]:
        print(f"{mode} / both wall time: {results[mode]['rounds_s'] / results['both']['rounds_s']:.2f}")


if __name__ == "__main__":
    main()
