"""A round's time with its store writes behind the compute (``storage.write_behind``) or in the
stages that make them, on file://, on S3 (a local moto server) and on that S3 server behind the
tests' ``FaultProxy`` holding each request ``--latency-ms`` (a remote store).

The work is ``benchmarks/vs_trl.py``'s (8 prompts x 8 responses, 8 new tokens, GRPO, one optimizer
step a round) on ``builtin:tiny``; each setting runs ``--rounds`` rounds of ``Campaign.run_round``
per run, ``--repeats`` runs each way, interleaved; the median ms per round is printed. On moto the
"IO" is moto's Python, on the same cores as the campaign: it measures the client and that server.

    python benchmarks/write_behind.py
    python benchmarks/write_behind.py --latency-ms 20 --backends s3-latency
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
sys.path.insert(0, str(ROOT))  # for tests.s3server and tests.faultproxy (the tests' moto server and proxy)


def run_rounds(args) -> None:
    """One run, in this process: prints ``RESULT <ms per round>``."""
    import torch

    import rftflow.flows  # noqa: F401  (quiet service defaults)
    from benchmarks.vs_trl import CONFIG, overrides
    from rftflow.components.campaign.stages import Campaign

    torch.set_num_threads(args.threads)
    store = [f"storage.url={args.url}", "storage.addressing_style=path"] if args.url else []
    sets = ["name=write-behind", *overrides("builtin:tiny", 8, args.rounds, 0, args.threads, 1e-4), *store,
            f"storage.write_behind={args.write_behind}", *args.sets]
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(CONFIG, run_dir, sets)
        campaign.prepare()
        campaign.warm_start()
        start = time.perf_counter()
        for r in range(1, args.rounds + 1):
            campaign.run_round(r)
        print(f"RESULT {1000 * (time.perf_counter() - start) / args.rounds:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=10.0, help="added to each request on s3-latency")
    parser.add_argument("--backends", default="file,s3,s3-latency")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of each run (smoke sizes: taskset.size, ...)")
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--write-behind", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_behind is not None:
        return run_rounds(args)

    from tests.faultproxy import FaultProxy
    from tests.s3server import S3TestServer

    rows = []
    with S3TestServer() as server, FaultProxy(int(server.endpoint_url.rsplit(":", 1)[1])) as proxy:
        proxy.forward(delay=args.latency_ms / 1000)  # each chunk a client sends: a request of headers + body waits twice
        endpoints = {"s3": server.endpoint_url, "s3-latency": proxy.endpoint_url}
        for backend in args.backends.split(","):
            times: dict[str, list[float]] = {"true": [], "false": []}
            for _ in range(args.repeats):
                for behind in times:
                    url = None if backend == "file" else f"s3://{server.new_bucket()}/bench"
                    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
                           **({"AWS_ENDPOINT_URL": endpoints[backend]} if url else {})}
                    done = subprocess.run([sys.executable, __file__, "--write-behind", behind, "--rounds", str(args.rounds),
                                           "--threads", str(args.threads), *(["--url", url] if url else []),
                                           *(a for s in args.sets for a in ("--set", s))],
                                          capture_output=True, text=True, env=env, cwd=ROOT)
                    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                    if done.returncode or not lines:
                        raise SystemExit(f"{backend}, write_behind={behind} failed:\n{done.stderr[-3000:]}")
                    times[behind].append(float(lines[-1].split()[1]))
                    print(f"{backend}, write_behind={behind}: {times[behind][-1]:.1f} ms a round", flush=True)
            rows.append((backend, statistics.median(times["true"]), statistics.median(times["false"])))
    print(f"\n{args.rounds} rounds of 8 x 8 responses on builtin:tiny, {args.threads} threads, median of {args.repeats} "
          f"runs each way; s3-latency: +{args.latency_ms:g} ms a request\n")
    print("| store | writes behind, ms a round | writes in their stages | behind / in stages |\n| --- | --- | --- | --- |")
    for backend, behind, inline in rows:
        print(f"| {backend} | {behind:.1f} | {inline:.1f} | {behind / inline:.2f} |")


if __name__ == "__main__":
    main()
