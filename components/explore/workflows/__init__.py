"""Workflows: how an agent works on a task (``taskset.workflow``), by name, like the algorithms.

- ``single_turn``: one response per task (the default).
- ``multi_turn``: turns in a gymnasium text environment.
- ``tool_use``: turns with tool calls until a final answer.

Each yields episodes, token in / token out (``episodes``), turned into experience rows
(``base.Workflow.explore``); a GRPO group is the episodes of one task.
"""

from __future__ import annotations

from rftflow.components.config import CampaignConfig
from rftflow.components.explore.workflows.base import Sampling, Workflow, episode_metrics, table_episode_metrics
from rftflow.components.explore.workflows.episodes import Episode
from rftflow.components.explore.workflows.multi_turn import MultiTurn
from rftflow.components.explore.workflows.single_turn import SingleTurn
from rftflow.components.explore.workflows.tool_use import ToolUse

WORKFLOWS: dict[str, type[Workflow]] = {w.name: w for w in (SingleTurn, MultiTurn, ToolUse)}


def make_workflow(cfg: CampaignConfig, tokenizer, *, reward_fn=None, context_limit: int | None = None) -> Workflow:
    """The campaign's workflow (``taskset.workflow``), configured by its ``workflow`` section."""
    name = cfg.taskset.workflow
    if name not in WORKFLOWS:
        raise ValueError(f"unknown workflow {name!r}; known: {', '.join(WORKFLOWS)}")
    kwargs = {"reward_fn": reward_fn} if name == "tool_use" else {}
    return WORKFLOWS[name](cfg.workflow, tokenizer, chat_template=cfg.model.chat_template, domain=cfg.taskset.domain,
                           context_limit=context_limit, **kwargs)


__all__ = ["Episode", "Sampling", "WORKFLOWS", "Workflow", "episode_metrics", "make_workflow", "table_episode_metrics"]
