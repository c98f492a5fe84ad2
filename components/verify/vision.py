"""The ``vision`` reward: the response is the picture's answer, exactly (``vision_answer``).

Visual question answering with a short gold answer — a count, a digit, a word (``left``) — is
scored on the whole response, not on a number found somewhere in it: a policy rewarded for the
last number in its text learns to list every number, one rewarded for containing the word learns
to write both. A response scores only when, stripped of surrounding whitespace, lower-cased and
without one final period, it is the gold answer: equal as a number when the gold answer is a
number (``3`` = ``3.0`` = ``03``; ASCII digits, no exponent), else the same text.
"""

from __future__ import annotations

import re
from decimal import Decimal

NUMBER = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?")
MAX_CHARS = 64  # longer responses are not a short answer (and are never parsed)


def normalized(text: str) -> str:
    """Stripped, lower-cased, one final period dropped."""
    text = text.strip().lower()
    return text[:-1].rstrip() if text.endswith(".") else text


def vision_answer(response: str, task) -> float:
    """1.0 when ``response`` is ``task.answer`` (see the module docstring), else 0.0."""
    if len(response) > MAX_CHARS:
        return 0.0
    answer, gold = normalized(response), normalized(task.answer)
    if NUMBER.fullmatch(gold):
        return float(NUMBER.fullmatch(answer) is not None and Decimal(answer) == Decimal(gold))
    return float(answer == gold and answer != "")
