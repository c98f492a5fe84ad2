"""Rounds of a small campaign on the in-process ``vllm`` engine, run by ``test_server_engines.py``
in a process that has vLLM (``infra.vllm_server.in_process_python``): per round the sync check's
metrics, and the dtype vLLM runs in. Arguments: config, run dir, ``--set`` overrides."""

import json
import sys

from rftflow.components.campaign.schedule import ROUND
from rftflow.components.campaign.stages import Campaign
from rftflow.components.config import load_config

config, run_dir, *overrides = sys.argv[1:]
cfg = load_config(config, overrides)
campaign = Campaign.from_config(cfg, run_dir)
campaign.prepare()
campaign.warm_start()
rounds = []
for r in range(1, cfg.rounds + 1):
    metrics = {}
    for step in ROUND:
        metrics |= {f"{step.value}:{k}": v for k, v in campaign.stage(step, r).items()}
    rounds.append(metrics)
print("RESULT " + json.dumps({"engine": type(campaign.engine).__name__, "rounds": rounds,
                              "dtype": str(campaign.engine.llm.llm_engine.model_config.dtype)}))
