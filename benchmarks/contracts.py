"""What the data contracts cost: contract checking time as a share of a round of the default campaign.

Runs `--rounds` rounds of configs/arith-mix.yaml (no warm start: the round's work is the same) and
times, inside each round, the experience-contract check (great-expectations) against the whole
round (explore → verify → buffer → train → sync).

    python benchmarks/contracts.py --rounds 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import rftflow.flows  # noqa: F401  (quiet service defaults)
from rftflow.components.campaign.stages import Campaign
from rftflow.components.config import load_config
from rftflow.components.verify import check as check_module

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "arith-mix.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], help="config override, key=value")
    args = parser.parse_args()
    cfg = load_config(CONFIG, ["trainer.warmup_steps=0", *args.set])
    spent = []
    check = check_module.check_experiences

    def timed_check(*a, **kw):
        start = time.perf_counter()
        try:
            return check(*a, **kw)
        finally:
            spent.append(time.perf_counter() - start)

    check_module.check_experiences = timed_check  # measure the call the verify stage makes (check_round's)
    with tempfile.TemporaryDirectory() as run_dir:
        campaign = Campaign.from_config(cfg, run_dir)
        campaign.prepare()
        spent.clear()
        campaign.run_round(1)  # the first check builds the GX context: report it apart
        first = spent[0]
        spent.clear()
        rounds = []
        for r in range(2, args.rounds + 2):
            start = time.perf_counter()
            metrics = campaign.run_round(r)
            rounds.append(time.perf_counter() - start)
    rows = int(metrics["contract/accepted"] + metrics["verify/quarantined"])
    contract, total = sum(spent), sum(rounds)
    shares = sorted(c / r for c, r in zip(spent, rounds))
    print(f"{args.rounds} rounds of the default campaign, {rows} rows checked per round")
    print(f"round (all stages): {total / len(rounds) * 1000:.0f} ms   contract check: "
          f"{contract / len(rounds) * 1000:.1f} ms   share: {100 * contract / total:.1f}% "
          f"(per round: median {100 * shares[len(shares) // 2]:.1f}%, max {100 * shares[-1]:.1f}%)")
    print(f"first check of the process (builds the GX context): {first * 1000:.0f} ms")


if __name__ == "__main__":
    main()
