"""Fixtures of the workflow and reward tests: the built-in game and tool task, a briefly warmed builtin:tiny, code tasks."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from rftflow.components.config import CampaignConfig
from rftflow.components.data.tasksets import load_tasks
from rftflow.components.explore.engines import HFRolloutEngine
from rftflow.components.explore.workflows import make_workflow
from rftflow.components.verify.rewards import make_rewards

GUESS = {"taskset": {"source": "builtin:guess_number", "workflow": "multi_turn", "size": 64, "eval_size": 8,
                     "prompt_template": "guess {low}-{high}:"},
         "reward": {"function": "env_return"}, "workflow": {"max_turns": 5}}
TOOLS = {"taskset": {"source": "builtin:calculator", "workflow": "tool_use", "size": 64, "eval_size": 8},
         "workflow": {"max_turns": 3}}


class RecordingEngine(HFRolloutEngine):
    """The hf engine, keeping what each ``generate_ids`` call was given and returned."""

    calls: list

    def generate_ids(self, encoded, **sampling):
        out = super().generate_ids(encoded, **sampling)
        self.calls.append((copy.deepcopy(encoded), copy.deepcopy(out)))
        return out


@pytest.fixture(scope="session")
def warm(tiny, tmp_path_factory):
    """builtin:tiny after a few SFT steps on binary-search games: it answers with a number and EOS,
    so its sampled episodes have environment turns. (model, tokenizer, its directory)"""
    from rftflow.components.algorithms import resolve
    from rftflow.components.config import TrainerConfig
    from rftflow.components.train.trainer import Trainer

    torch.manual_seed(0)
    _, engine, workflow, tasks = _setup(tiny, GUESS)
    rows = workflow.expert_table(engine, tasks, campaign="c").to_pylist()
    trainer = Trainer(copy.deepcopy(tiny[0]), tiny[1].pad_token_id, TrainerConfig(micro_batch_size=16),
                      resolve("sft"))
    trainer.warm_start([rows[i:i + 16] for i in range(0, len(rows), 16)] * 10, 2e-3)
    out = tmp_path_factory.mktemp("warm")
    trainer.unwrapped.save_pretrained(out)
    tiny[1].save_pretrained(out)
    return trainer.unwrapped.eval(), tiny[1], out


def _setup(tiny, config: dict):
    cfg = CampaignConfig.model_validate(config)
    engine = RecordingEngine(copy.deepcopy(tiny[0]), tiny[1])
    engine.calls = []
    reward_fn = make_rewards(cfg.reward, cfg.taskset)
    workflow = make_workflow(cfg, tiny[1], reward_fn=reward_fn, context_limit=256)
    return cfg, engine, workflow, load_tasks(cfg.taskset, 0).train




def write_code_tasks(path, sums: bool = False) -> str:
    """A JSONL taskset of 40 code tasks (write f(x) = x + k, with tests), and with ``sums`` 40 math
    tasks (k + k) between them; returns its path."""
    rows = []
    for k in range(1, 41):
        rows.append({"question": f"f(x)=x+{k}", "answer": f"    return x + {k}\n", "domain": "code",
                     "code_prompt": "def f(x):\n", "entry_point": "f", "tests": f"assert f(1) == {1 + k}\n"})
        if sums:
            rows.append({"question": f"{k} + {k} =", "answer": str(2 * k), "domain": "math"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)
