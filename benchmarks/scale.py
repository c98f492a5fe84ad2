"""Rollout throughput as explorer parts are added: samples/s with 1 and 2 of each, and the ratio.

``--rollout`` measures two things, each on the same work with one thread per replica or process:

1. **Server pool**: the ``openai`` engine over 1 and over 2 vLLM CPU servers (``infra/vllm_server.py``,
   each bound to its own core), sampling ``--prompts`` prompts × ``--n`` responses of up to
   ``--tokens`` tokens: two warm-up calls each, then ``--repeats`` timed calls each, alternating;
   the median call. Needs ``.venv-vllm``.
2. **Sharded explorers**: 1 and then 2 explorer processes (``mode: explore``, ``explorer.shards``
   = processes, ``hf`` engine, one torch thread each) exploring ``--rounds`` rounds of the default
   campaign's tasks. This process prepares the campaign and publishes its start weights, as a trainer
   would, and does not train (``sync.offset`` = rounds: the explorers never wait for newer weights),
   so the figure is the explorers' own. The clock runs from round 1 committed to the last round
   committed (start-up and the first round excluded), over rounds 2 … ``--rounds``; run 1, 2, 2,
   1 processes, the mean of each.

    python benchmarks/scale.py --rollout
    python benchmarks/scale.py --rollout --model /path/to/hf-model-dir --tokens 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rftflow.flows  # noqa: E402,F401  (quiet service defaults)

CONFIG = ROOT / "configs" / "arith-mix.yaml"


def server_pool(args, work: Path) -> list[tuple[str, int, float]]:
    """Responses per second of the ``openai`` engine over 1 and over 2 servers: after two warm-up
    calls each, the timed calls alternate between the two (``--repeats`` each), so both meet the
    same machine; the median call of each."""
    from rftflow.components.explore.engines import OpenAIRolloutEngine
    from rftflow.components.explore.models import load_model, resolve_model_path
    from rftflow.infra.vllm_server import vllm_servers

    model_dir = resolve_model_path(args.model)
    model, tokenizer = load_model(args.model)
    if not Path(model_dir).is_dir():  # a GGUF file (SmolLM2): the servers read its de-quantized HF directory
        model_dir = str(work / "model")
        model.save_pretrained(model_dir)
        tokenizer.save_pretrained(model_dir)
    del model
    prompts = [f"{a} + {b} =" for a, b in zip(range(args.prompts), range(7, 7 + args.prompts))]
    rates: dict[int, list[float]] = {1: [], 2: []}
    with vllm_servers(model_dir, 2, threads=1, served_model="m", log_dir=work, eager=False) as servers:
        engines = {1: OpenAIRolloutEngine([servers[0].url], "m", tokenizer),
                   2: OpenAIRolloutEngine([s.url for s in servers], "m", tokenizer)}
        for _ in range(2):
            for engine in engines.values():
                engine.generate(prompts, n=args.n, max_new_tokens=args.tokens)
        for _ in range(args.repeats):
            for count, engine in engines.items():
                start = time.perf_counter()
                groups = engine.generate(prompts, n=args.n, max_new_tokens=args.tokens)
                rates[count].append(args.prompts * args.n / (time.perf_counter() - start))
                assert sum(len(g) for g in groups) == args.prompts * args.n
    medians = {count: statistics.median(r) for count, r in rates.items()}
    print(f"server pool: 1 server {medians[1]:.1f} samples/s, 2 servers {medians[2]:.1f} samples/s", flush=True)
    return [("vLLM servers", count, rate) for count, rate in medians.items()]


def explorer_samples_per_second(processes: int, args, work: Path) -> float:
    """Responses per second of ``processes`` explorer processes sharing ``--rounds`` rounds."""
    from rftflow.components.campaign.stages import Campaign

    work = Path(tempfile.mkdtemp(dir=work))
    store = (work / f"store-{processes}").as_uri()
    overrides = [f"rounds={args.rounds}", "trainer.warmup_steps=0", "sync.method=checkpoint",
                 f"sync.offset={args.rounds}", f"algorithm.max_staleness={args.rounds}", f"storage.url={store}",
                 f"explorer.shards={processes}", f"explorer.tasks_per_round={args.tasks}", "threads=1",
                 f"explorer.max_new_tokens={args.tokens}", f"model.path={args.model}"]
    trainer = Campaign(CONFIG, work / f"trainer-{processes}", [*overrides, "mode=train"])
    trainer.prepare()
    trainer.warm_start()  # publishes the start weights: the explorers go
    code = ("import sys; import rftflow.flows; from rftflow.components.campaign.preflight import preflight; "
            "from rftflow.components.campaign.run import CampaignRun; "
            "CampaignRun(preflight(sys.argv[1], sys.argv[2], sys.argv[3:])).run()")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(CONFIG), str(work / f"explorer-{processes}-{i}"),
                               *overrides, "mode=explore"], env=env, stdout=subprocess.DEVNULL)
             for i in range(processes)]
    started = None
    while True:
        if any(p.poll() not in (None, 0) for p in procs):
            raise RuntimeError("an explorer process failed")
        if started is None and trainer.store.round_committed(1):
            started = time.perf_counter()
        if trainer.store.round_committed(args.rounds):
            done = time.perf_counter()
            break
        time.sleep(0.01)
    for p in procs:
        p.wait()
    store = trainer.store
    rows = sum(store.read_kind(kind, r).num_rows for kind in ("usual", "quarantine") for r in range(2, args.rounds + 1))
    return rows / (done - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollout", action="store_true", help="rollout samples/s with 1 and 2 servers and explorers")
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--prompts", type=int, default=64, help="server pool: prompts per call")
    parser.add_argument("--n", type=int, default=8, help="server pool: responses per prompt")
    parser.add_argument("--tokens", type=int, default=32, help="longest response")
    parser.add_argument("--repeats", type=int, default=7, help="server pool: timed calls of each")
    parser.add_argument("--rounds", type=int, default=12, help="explorers: rounds")
    parser.add_argument("--tasks", type=int, default=128, help="explorers: tasks per round (8 responses each)")
    args = parser.parse_args()
    if not args.rollout:
        parser.error("say what to measure: --rollout")
    from rftflow.infra.vllm_server import VLLM_VENV, vllm_available

    rows = []
    with tempfile.TemporaryDirectory() as work:
        if vllm_available():
            rows += server_pool(args, Path(work))
        else:
            print(f"(no vLLM CPU env at {VLLM_VENV}: the server pool rows are left out; infra/vllm_cpu_env.sh builds it)")
        explored: dict[int, list[float]] = {1: [], 2: []}
        for processes in (1, 2, 2, 1):  # ABBA: a drift of the machine's speed falls on both alike
            explored[processes].append(explorer_samples_per_second(processes, args, Path(work)))
            print(f"{processes} explorer process(es): {explored[processes][-1]:.1f} samples/s", flush=True)
        rows += [("explorer processes", count, statistics.mean(r)) for count, r in explored.items()]
    print(f"\nrollout samples/s, {args.model}, one thread per server or process, {os.cpu_count()} cores\n")
    print("| explorer parts | how many | samples/s | × one |")
    print("| --- | --- | --- | --- |")
    one = {}
    for kind, count, rate in rows:
        one.setdefault(kind, rate)
        print(f"| {kind} | {count} | {rate:.1f} | {rate / one[kind]:.2f} |")


if __name__ == "__main__":
    main()
