"""Checkpoint save and load time on file:// and on S3 (a local moto server), and the share of round
time they take at the default interval.

Builds the default campaign (configs/arith-mix.yaml, no warm start), runs ``--rounds`` rounds to
time a round, then saves and restores a checkpoint ``--repeat`` times on each backend (what
``CampaignRun.checkpoint`` and a resume do: the trainer's weights and optimizer, RNG and buffer
state, written to a temp dir and committed to the store). The share is
(save + MLflow log) / (checkpoint.every × round time): the cost per round of checkpointing every
k rounds (the campaign also logs each checkpoint to its MLflow run; timed once, on local artifacts).

    python benchmarks/checkpoint.py
    python benchmarks/checkpoint.py --set model.path=/models/SmolLM2-135M-Instruct --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for tests.s3server (the moto helper the tests use)

import rftflow.flows  # noqa: E402,F401  (quiet service defaults)
from rftflow.components.campaign.stages import Campaign  # noqa: E402
from rftflow.components.tracking import Tracker  # noqa: E402

CONFIG = ROOT / "configs" / "arith-mix.yaml"


def time_checkpoints(campaign: Campaign, repeat: int) -> tuple[list[float], list[float], int]:
    """(save seconds, load seconds, bytes) of ``repeat`` checkpoint round trips."""
    saves, loads, size = [], [], 0
    for i in range(repeat):
        with tempfile.TemporaryDirectory() as out, tempfile.TemporaryDirectory() as into:
            start = time.perf_counter()
            manifest = campaign.checkpoint(1000 + i, Path(out))
            saves.append(time.perf_counter() - start)
            size = sum(f["bytes"] for f in campaign.weight_store.checkpoints()[-1]["files"].values())
            start = time.perf_counter()
            campaign.restore(manifest["weight_version"], Path(into))
            loads.append(time.perf_counter() - start)
        campaign.weight_store.delete_checkpoint(manifest["weight_version"])
        campaign.policy_version += 1  # the next one is another version
    return saves, loads, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds timed for the round time")
    parser.add_argument("--repeat", type=int, default=5, help="checkpoint round trips per backend")
    parser.add_argument("--set", action="append", default=[], help="config override, key=value")
    args = parser.parse_args()
    from tests.s3server import S3TestServer

    results = {}
    with S3TestServer() as server, tempfile.TemporaryDirectory() as work:
        bucket = server.new_bucket()
        for backend, store in (("file://", []), ("s3:// (moto)", [f"storage.url=s3://{bucket}/bench",
                                                                  f"storage.endpoint_url={server.endpoint_url}",
                                                                  "storage.addressing_style=path"])):
            campaign = Campaign.from_config(CONFIG, Path(work) / backend[:2],
                                            ["trainer.warmup_steps=0", *store, *args.set])
            campaign.prepare()
            rounds = []
            for r in range(1, args.rounds + 1):
                start = time.perf_counter()
                campaign.run_round(r)
                rounds.append(time.perf_counter() - start)
            saves, loads, size = time_checkpoints(campaign, args.repeat)
            results[backend] = (statistics.median(rounds), statistics.median(saves), statistics.median(loads), size)
            every = campaign.cfg.checkpoint.every
        tracker = Tracker(f"sqlite:///{Path(work) / 'mlflow.db'}", "bench", "bench", artifact_root=Path(work) / "art")
        with tempfile.TemporaryDirectory() as out:
            campaign.checkpoint(2000, Path(out))
            start = time.perf_counter()
            tracker.log_artifacts(out, "checkpoints/bench")
            mlflow_s = time.perf_counter() - start
    print(f"checkpoint of the default campaign ({size / 1e6:.1f} MB), every {every} rounds; "
          f"median of {args.repeat} round trips, round time median of {args.rounds} rounds\n")
    print(f"logging a checkpoint to the MLflow run (local artifacts): {mlflow_s:.3f} s\n")
    print(f"| backend | round s | save s | load s | save + MLflow log, share of {every} rounds |")
    print("| --- | --- | --- | --- | --- |")
    for backend, (round_s, save_s, load_s, _) in results.items():
        share = 100 * (save_s + mlflow_s) / (every * round_s)
        print(f"| {backend} | {round_s:.3f} | {save_s:.3f} | {load_s:.3f} | {share:.1f}% |")


if __name__ == "__main__":
    main()
