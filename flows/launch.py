"""A deployment's flow run with its trainer in several processes: the command a work pool's job
runs under ``accelerate launch`` (the pool's ``command`` job variable, see prefect.yaml's
``arith-mix-trainer``):

    accelerate launch --config_file infra/accelerate/ddp.yaml --num_processes 2 -m rftflow.flows.launch

Rank 0 runs the flow run as the worker's own ``python -m prefect.engine`` would; ranks > 0 read
its config and overrides from the Prefect API and step with rank 0's trainer
(``Trainer.follow``). One flow run, one writer.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys


def main() -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        runpy.run_module("prefect.engine", run_name="__main__", alter_sys=True)
        return
    from prefect import get_client

    from rftflow.components.config import load_config
    from rftflow.flows.campaign import _filled

    with get_client(sync_client=True) as client:
        parameters = client.read_flow_run(os.environ["PREFECT__FLOW_RUN_ID"]).parameters
    # rank 0 reports a bad config in its flow run; this process then waits for nothing and ends
    follow(load_config(parameters["config"], [_filled(o) for o in parameters.get("overrides") or []]))


def follow(cfg) -> None:
    """A trainer process of rank > 0 (under ``rftflow run``, ``accelerate launch`` or this module):
    step with rank 0's trainer until the campaign ends. A Ctrl-C, a cancel or the launcher passing
    on a SIGTERM is rank 0's to act on: it stops at a safe point and then releases this process
    (were this one to leave first, rank 0's update would fail half-way). Rank 0 gone: one line, exit 1."""
    import torch.distributed as dist

    from rftflow.components.campaign.assembly import follow_trainer

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        follow_trainer(cfg)
    except dist.DistBackendError as e:  # rank 0 is gone (killed, or failed in an update)
        print(f"trainer process {os.environ.get('RANK')}: rank 0 is gone ({str(e).splitlines()[0]})",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
