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

``--train`` measures the trainer in 1 and 2 data-parallel processes (``accelerate launch``,
DDP over gloo, one thread each) on the same rounds: ``--rows`` rows of ``--tokens`` response
tokens a round in micro-batches of ``--micro``, one warm-up round, then ``--train-rounds`` timed
rounds; run 1, 2, 2, 1 processes, the mean of each. Beside each figure, the capacity model's
prediction (docs/capacity.md): a step of P processes takes C_P/P + A(P), C_P a one-process step
while P independent trainers compute at once (measured after each 2-process run) and A(P) an
all-reduce of the gradients among P processes (timed in the P-process run before it trains).
``--fsdp`` adds 2 processes that shard the model (``trainer.fsdp``) after each 2-process run.

    python benchmarks/scale.py --rollout
    python benchmarks/scale.py --rollout --model /path/to/hf-model-dir --tokens 64
    python benchmarks/scale.py --train
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
ORDER = {False: (1, 2, 2, 1), True: (1, 2)}  # the counts run, in order: ABBA; a smoke run once each


def server_pool(args, work: Path) -> list[tuple[str, int, float]]:
    """Responses per second of the ``openai`` engine over 1 and over 2 servers: after two warm-up
    calls each, the timed calls alternate between the two (``--repeats`` each), so both meet the
    same machine; the median call of each. A smoke run boots one server (the pool of 1)."""
    from rftflow.components.explore.engines import OpenAIRolloutEngine
    from rftflow.components.explore.models import load_model, model_directory
    from rftflow.infra.vllm_server import vllm_servers

    model_dir = model_directory(args.model)  # a GGUF (SmolLM2): the servers read its de-quantized directory
    _, tokenizer = load_model(args.model)
    prompts = [f"{a} + {b} =" for a, b in zip(range(args.prompts), range(7, 7 + args.prompts))]
    counts = (1,) if args.smoke else (1, 2)
    rates: dict[int, list[float]] = {count: [] for count in counts}
    with vllm_servers(model_dir, max(counts), threads=1, served_model="m", log_dir=work, eager=args.smoke) as servers:
        engines = {count: OpenAIRolloutEngine([s.url for s in servers[:count]], "m", tokenizer) for count in counts}
        for _ in range(1 if args.smoke else 2):
            for engine in engines.values():
                engine.generate(prompts, n=args.n, max_new_tokens=args.tokens)
        for _ in range(args.repeats):
            for count, engine in engines.items():
                start = time.perf_counter()
                groups = engine.generate(prompts, n=args.n, max_new_tokens=args.tokens)
                rates[count].append(args.prompts * args.n / (time.perf_counter() - start))
                assert sum(len(g) for g in groups) == args.prompts * args.n
    medians = {count: statistics.median(r) for count, r in rates.items()}
    print("server pool: " + ", ".join(f"{c} server(s) {m:.1f} samples/s" for c, m in medians.items()), flush=True)
    return [("vLLM servers", count, rate) for count, rate in medians.items()]


def explorer_samples_per_second(processes: int, args, work: Path) -> float:
    """Responses per second of ``processes`` explorer processes sharing ``--rounds`` rounds."""
    from rftflow.components.campaign.stages import Campaign

    work = Path(tempfile.mkdtemp(dir=work))
    store = (work / f"store-{processes}").as_uri()
    overrides = [f"rounds={args.rounds}", "trainer.warmup_steps=0", "sync.method=checkpoint",
                 f"sync.offset={args.rounds}", f"algorithm.max_staleness={args.rounds}", f"storage.url={store}",
                 f"explorer.shards={processes}", f"explorer.tasks_per_round={args.tasks}", "threads=1",
                 f"explorer.max_new_tokens={args.tokens}", f"model.path={args.model}", *args.sets]
    trainer = Campaign.from_config(CONFIG, work / f"trainer-{processes}", [*overrides, "mode=train"])
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


def train_worker(args) -> None:
    """In each process of an ``accelerate launch`` (or alone): the trainer on ``--train-rounds``
    timed rounds after a warm-up one; rank 0 writes {step_seconds, allreduce_seconds, rows}."""
    import json
    import random

    import torch
    import torch.distributed as dist

    from rftflow.components.algorithms import resolve
    from rftflow.components.config import TrainerConfig
    from rftflow.components.explore.models import load_model
    from rftflow.components.train.trainer import Trainer

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tokenizer = load_model(args.model)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = Trainer(model, tokenizer.pad_token_id, TrainerConfig(lr=1e-5, micro_batch_size=args.micro,
                                                                   processes=processes, fsdp=args.fsdp),
                      resolve("grpo"))
    rng = random.Random(0)
    vocab = model.config.vocab_size
    rows = [{"prompt_ids": [rng.randrange(3, vocab) for _ in range(16)],
             "response_ids": [rng.randrange(3, vocab) for _ in range(args.tokens)], "source": "explorer",
             "group_id": f"g{i // 8}", "reward": float(rng.random() < 0.5),
             "response_logprobs": [-3.0] * args.tokens} for i in range(args.rows)]
    steps = [list(range(s, min(s + args.micro, args.rows))) for s in range(0, args.rows, args.micro)]
    allreduce = 0.0
    if processes > 1:  # the gradients' all-reduce alone: A(P) of the capacity model
        flat = torch.zeros(sum(p.numel() for p in model.parameters() if p.requires_grad))
        times = []
        for _ in range(5):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(flat)
            times.append(time.perf_counter() - start)
        allreduce = statistics.median(times)
    trainer.train(rows, steps)  # warm-up
    start = time.perf_counter()
    for _ in range(args.train_rounds):
        trainer.train(rows, steps)
    seconds = (time.perf_counter() - start) / (args.train_rounds * len(steps))
    if trainer.rank == 0:
        Path(args.out).write_text(json.dumps({"step_seconds": seconds, "allreduce_seconds": allreduce,
                                              "rows_per_step": args.rows / len(steps)}))


def trainer_run(processes: int, args, work: Path, *, apart: bool = False, sharded: bool = False) -> list[dict]:
    """A ``train_worker`` run in ``processes`` data-parallel processes (rank 0's figures; ``sharded``:
    with ``trainer.fsdp``), or with ``apart`` as many independent one-process trainers at once, each
    on its share (1/``processes``) of every micro-batch (each one's figures)."""
    import json

    outs = [work / f"train-{processes}-{k}-{time.monotonic_ns()}.json" for k in range(processes if apart else 1)]

    def worker(out: Path) -> list[str]:
        return [str(Path(__file__).resolve()), "--train-worker", "--out", str(out), "--model", args.model,
                "--rows", str(args.rows), "--micro", str(args.micro // processes if apart else args.micro),
                "--tokens", str(args.tokens), "--train-rounds", str(args.train_rounds), *(["--fsdp"] * sharded)]

    if apart or processes == 1:
        launches = [[sys.executable, *worker(out)] for out in outs]
    else:
        launches = [[sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                     str(ROOT / "infra" / "accelerate" / "ddp.yaml"), "--num_processes", str(processes),
                     *worker(outs[0])]]
    # TMPDIR: the launcher's log folders go with ``work``
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")} | {"OMP_NUM_THREADS": "1",
                                                                                       "TMPDIR": str(work)}
    procs = [subprocess.Popen(launch, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for launch in launches]
    if any(p.wait() != 0 for p in procs):
        raise RuntimeError("a trainer run failed")
    return [json.loads(out.read_text()) for out in outs]


def trainer_scaling(args, work: Path) -> list[tuple[str, int, float, float]]:
    """(kind, processes, measured samples/s, predicted samples/s) of the trainer in 1 and 2 processes.

    The capacity model: a data-parallel step of P processes takes S_P + A(P), where S_P is a
    one-process step on 1/P of the micro-batch while P such trainers run at once (its share of the
    rows, the whole optimizer step, and what the cores, caches and memory give each: measured with
    P independent trainers) and A(P) the gradients' all-reduce. With ``--fsdp``, 2 processes that
    shard the model too: their step moves the weights twice (gathered for the forward and again for
    the backward) and the gradients once (reduce-scattered), 3 model volumes where the all-reduce
    moves 2, so the model's step is S_2 + 1.5 A(2)."""
    runs: dict[int, list[dict]] = {1: [], 2: []}
    apart, sharded = [], []
    for processes in ORDER[args.smoke]:  # ABBA, as for the explorers
        runs[processes] += trainer_run(processes, args, work)
        figures = runs[processes][-1]
        print(f"{processes} trainer process(es): {figures['rows_per_step'] / figures['step_seconds']:.1f} samples/s "
              f"(all-reduce of the gradients {figures['allreduce_seconds'] * 1e3:.1f} ms)", flush=True)
        if processes == 2:
            apart += trainer_run(2, args, work, apart=True)
            print(f"2 independent trainers at once, micro-batches of {args.micro // 2}: "
                  f"{statistics.mean(f['step_seconds'] for f in apart[-2:]) * 1e3:.0f} ms a step each", flush=True)
            if args.fsdp:
                sharded += trainer_run(2, args, work, sharded=True)
                figures = sharded[-1]
                rate = figures["rows_per_step"] / figures["step_seconds"]
                print(f"2 trainer processes, the model sharded: {rate:.1f} samples/s", flush=True)
    rows_per_step = runs[1][0]["rows_per_step"]
    compute = {1: statistics.mean(r["step_seconds"] for r in runs[1]),
               2: statistics.mean(r["step_seconds"] for r in apart)}
    out = []
    for processes, measured in runs.items():
        step = statistics.mean(r["step_seconds"] for r in measured)
        allreduce = statistics.mean(r["allreduce_seconds"] for r in measured)
        out.append(("trainer processes", processes, rows_per_step / step, rows_per_step / (compute[processes] + allreduce)))
    if sharded:
        step = statistics.mean(r["step_seconds"] for r in sharded)
        allreduce = statistics.mean(r["allreduce_seconds"] for r in runs[2])
        out.append(("sharded (fsdp)", 2, rows_per_step / step, rows_per_step / (compute[2] + 1.5 * allreduce)))
    print(f"capacity model: S_1 {compute[1] * 1e3:.0f} ms, S_2 {compute[2] * 1e3:.0f} ms a step", flush=True)
    return out


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
    parser.add_argument("--train", action="store_true", help="trainer samples/s with 1 and 2 processes")
    parser.add_argument("--rows", type=int, default=256, help="trainer: rows a round")
    parser.add_argument("--micro", type=int, default=64, help="trainer: rows a micro-batch (an optimizer step)")
    parser.add_argument("--train-rounds", type=int, default=3, help="trainer: timed rounds")
    parser.add_argument("--fsdp", action="store_true", help="trainer: and 2 processes that shard the model")
    parser.add_argument("--smoke", action="store_true", help="the smallest run that prints every table (tests): "
                        "each count once (one eager server), 2 rounds of 4 tasks, one timed call and round")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="explorers: a config override of the campaign (smoke sizes: taskset.size, ...)")
    parser.add_argument("--train-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.n, args.tokens, args.repeats, args.rounds, args.tasks = 4, 2, 4, 1, 2, 4
        args.rows, args.micro, args.train_rounds = 16, 8, 1
    if args.train_worker:
        train_worker(args)
        return
    if not (args.rollout or args.train):
        parser.error("say what to measure: --rollout, --train")
    if args.train:
        with tempfile.TemporaryDirectory() as work:
            rows = trainer_scaling(args, Path(work))
        print(f"\ntrainer samples/s, {args.model}, {args.rows} rows of {args.tokens} response tokens a round in "
              f"micro-batches of {args.micro}, one thread per process, {os.cpu_count()} cores\n")
        print("| trainer | processes | samples/s | × one | capacity model | measured / model |")
        print("| --- | --- | --- | --- | --- | --- |")
        one = rows[0][2]
        for kind, count, rate, predicted in rows:
            print(f"| {kind} | {count} | {rate:.1f} | {rate / one:.2f} | {predicted:.1f} | {rate / predicted:.2f} |")
        if not args.rollout:
            return
    from rftflow.infra.vllm_server import VLLM_VENV, vllm_available

    rows = []
    with tempfile.TemporaryDirectory() as work:
        if vllm_available():
            rows += server_pool(args, Path(work))
        else:
            print(f"(no vLLM CPU env at {VLLM_VENV}: the server pool rows are left out; infra/vllm_cpu_env.sh builds it)")
        explored: dict[int, list[float]] = {1: [], 2: []}
        for processes in ORDER[args.smoke]:  # ABBA: a drift of the machine's speed falls on both alike
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
