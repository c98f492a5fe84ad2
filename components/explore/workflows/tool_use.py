"""``tool_use``: the model calls tools until it answers.

Tools are Python callables (``workflow.tools``) with a JSON schema. The model sees them through
its chat template's ``tools=`` when the template renders tools; otherwise (a template without a
tool format, as SmolLM2-135M-Instruct's plain ChatML) a system message lists them in the one
documented format, Hermes-style, which builtin:tiny (raw prompts, no system message: its 256
positions) learns from demonstrations::

    <tool_call>{"name": "calculator", "arguments": {"expression": "47*38+12"}}</tool_call>

Each call in a model turn runs (bounded by ``workflow.timeout_seconds``) and its result comes
back as one ``tool`` turn (mask 0), ``<tool_response>result</tool_response>`` per call. A call that
is not valid JSON, names an unknown tool, raises or times out returns ``error: …`` to the model and
is counted (``tool/errors``). A model turn without a call is the final answer: the episode ends
and the verifier scores that text.
"""

from __future__ import annotations

import json
import re

from rftflow.components.data.tasksets import Task
from rftflow.components.evaluation.verdicts import is_correct
from rftflow.components.explore.environments import tool_functions, tool_schema
from rftflow.components.explore.workflows.base import Sampling, Workflow
from rftflow.components.explore.workflows.episodes import Episode, call_with_timeout

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
HERMES_SYSTEM = (
    "You may call functions to help answer. The functions, as JSON schemas:\n<tools>\n{tools}\n</tools>\n"
    "To call one, write <tool_call>{{\"name\": <function-name>, \"arguments\": <args-json-object>}}</tool_call>; "
    "its result comes back in <tool_response></tool_response>. When you know the answer, write only the answer."
)


def format_call(call: dict) -> str:
    """A call in the documented format (compact JSON), as an expert writes it."""
    return f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"


class ToolUse(Workflow):
    name = "tool_use"

    def __init__(self, cfg, tokenizer, *, reward_fn=None, **kwargs):
        super().__init__(cfg, tokenizer, **kwargs)
        self.tools = tool_functions(cfg.tools)
        self.schemas = [tool_schema(fn) for fn in self.tools.values()]
        self.reward_fn = reward_fn
        template = getattr(tokenizer, "chat_template", None) or ""
        self.template_has_tools = "tools" in template

    def prompt_ids(self, task: Task, engine) -> list[int]:
        if not self.chat_template:
            return engine.encode(task.prompt)
        messages = [{"role": "user", "content": task.prompt}]
        kwargs = {"tools": self.schemas} if self.template_has_tools else {}
        if not self.template_has_tools:
            tools = "\n".join(json.dumps(s) for s in self.schemas)
            messages.insert(0, {"role": "system", "content": HERMES_SYSTEM.format(tools=tools)})
        return list(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                       return_dict=True, **kwargs)["input_ids"])

    def call(self, episode: Episode, text: str) -> str:
        """One call's result, or ``error: …`` (counted)."""
        episode.tool_calls += 1
        try:
            call = json.loads(text)
            name, arguments = call["name"], call.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if name not in self.tools:
                raise LookupError(f"unknown tool {name!r}; tools: {', '.join(self.tools)}")
            if not isinstance(arguments, dict):
                raise TypeError("arguments must be an object")
            return str(call_with_timeout(lambda: self.tools[name](**arguments), self.cfg.timeout_seconds))
        except TimeoutError:
            episode.tool_errors += 1
            return f"error: the tool did not return within {self.cfg.timeout_seconds:g} s"
        except json.JSONDecodeError as e:
            episode.tool_errors += 1
            return f"error: the call is not valid JSON ({e.msg})"
        except Exception as e:  # noqa: BLE001 — the model learns from the error, the episode goes on
            episode.tool_errors += 1
            return f"error: {type(e).__name__}: {e}"

    def act(self, episode: Episode) -> None:
        calls = TOOL_CALL.findall(episode.text)
        if not calls:  # the final answer
            episode.success = bool(self.reward_fn and is_correct(self.reward_fn(episode.text, episode.task)))
            episode.end(finished=True)
            return
        content = "\n".join(f"<tool_response>{self.call(episode, c)}</tool_response>" for c in calls)
        episode.add_env_turn("tool", content, self.format.turn_ids("tool", content))

    def run(self, tasks: list[Task], engine, *, n: int, sampling: Sampling) -> list[list[Episode]]:
        return self.step_episodes([[Episode(task, self.prompt_ids(task, engine), turns=[]) for _ in range(n)]
                                   for task in tasks], engine, sampling, self.act)

    def experts(self, tasks: list[Task], engine) -> list[Episode]:
        """For tasks whose ``metadata.tool_calls`` hold the right calls: those calls, then the gold answer."""
        episodes = []
        for task in tasks:
            calls = task.metadata.get("tool_calls")
            if not calls:
                continue
            episode = Episode(task, self.prompt_ids(task, engine), turns=[])
            for text in [*(format_call(c) for c in calls), task.answer]:
                self.expert_turn(episode, text)
                self.act(episode)
            if episode.success and not episode.tool_errors:
                episodes.append(episode)
        return episodes
