"""The tasksets of the built-in game and tool (``builtin:guess_number``, ``builtin:calculator``):
task entries generated from a seed. Explore's environments and tools (``explore.environments``) play
them; the gold answers are computed here."""

from __future__ import annotations

import random
from typing import Any

_NAMES = ("Ann", "Bo", "Cy", "Dee", "Eli", "Flo")
_PROBLEMS = {  # operator → word problem
    "+": "{n} has {a} bags of {b} nuts and {c} loose nuts. How many nuts?",
    "-": "{n} buys {a} boxes of {b} pens and gives away {c}. How many pens are left?",
}


def builtin_task_entries(name: str, params: dict[str, Any], size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` task entries (question, answer, metadata) of built-in taskset ``name``:

    - ``guess_number``: a game per task, its secret uniform in [low, high] (params ``low``, ``high``);
      the question names the game, not the secret (prompt templates use ``{low}``, ``{high}``).
    - ``calculator``: arithmetic problems a·b ± c (a, b from ``min_value`` (default 11) and c from
      11 to ``max_value``), as word problems (``style: words``) or bare expressions (``style: plain``,
      short enough for builtin:tiny's context); the answer is the value of a·b ± c, what the
      ``calculator`` tool computes; ``metadata.operator`` is + or −, ``metadata.tool_calls`` the expert's call.
    """
    rng = random.Random(seed)
    if name == "guess_number":
        low, high = int(params.get("low", 1)), int(params.get("high", 32))
        return [{"question": f"Game {i}: guess my number from {low} to {high}.", "answer": str(secret),
                 "metadata": {"low": low, "high": high, "secret": secret}}
                for i, secret in enumerate(rng.randint(low, high) for _ in range(size))]
    if name == "calculator":
        low, top = int(params.get("min_value", 11)), int(params.get("max_value", 99))
        style = params.get("style", "words")
        if not 1 <= low <= top:
            raise ValueError(f"params.min_value must be from 1 to params.max_value ({top}), got {low}")
        if style not in ("words", "plain"):
            raise ValueError(f"params.style must be 'words' or 'plain', got {style!r}")
        entries = []
        for _ in range(size):
            a, b, c = rng.randint(low, top), rng.randint(low, top), rng.randint(11, top)
            sign = rng.choice("+-")
            expression = f"{a}*{b}{sign}{c}"
            question = (_PROBLEMS[sign].format(n=rng.choice(_NAMES), a=a, b=b, c=c) if style == "words"
                        else f"What is {expression}?")
            entries.append({"question": question,
                            "answer": str(a * b + c if sign == "+" else a * b - c),
                            "metadata": {"expression": expression, "operator": sign, "tool_calls": [
                                {"name": "calculator", "arguments": {"expression": expression}}]}})
        return entries
    raise ValueError(f"unknown built-in taskset {name!r}; built in: guess_number, calculator")
