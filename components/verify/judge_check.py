"""Whether a judge can be trusted, before a campaign: its scores against a team's own labels.

A labels file is JSONL, one labelled response a line: ``question``, ``response``, ``score`` (the
label, an integer in [0, max_score]) and optionally ``answer`` (the gold answer the rubric may
show). ``check_judge`` has the configured judge score every response and reports how it agrees
with the labels over the responses it scored: the share of exact matches, the share within one
point, and Spearman's rank correlation (scipy). Replies the judge's grammar cannot read are
counted apart (in a campaign they would be quarantined).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rftflow.components.data.tasksets import Task


@dataclass(frozen=True)
class Agreement:
    """How a judge's scores agree with labels (``rows`` labelled, ``read`` of them scored)."""

    rows: int
    read: int
    exact: float
    within_one: float
    spearman: float  # nan when either side is constant
    unreadable: dict[str, int]  # reason → rows

    def lines(self) -> list[str]:
        rho = "n/a (a constant side)" if math.isnan(self.spearman) else f"{self.spearman:.3f}"
        lines = [f"labelled responses     {self.rows}", f"scored                 {self.read}"]
        if self.read:
            shares = [("exact agreement", self.exact), ("within 1", self.within_one)]
            lines += [f"{name:<23}{share:.3f} ({round(share * self.read)}/{self.read})" for name, share in shares]
            lines.append(f"Spearman's rho         {rho}")
        lines += [f"not scored             {n}: {reason}" for reason, n in self.unreadable.items()]
        return lines


def read_labels(path: Path, max_score: int) -> list[tuple[Task, str, int]]:
    """(task, response, label) per line of ``path``; ``ValueError`` naming the file and line of a bad one."""
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ValueError(f"labels file {path}: {e.strerror}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e})") from None
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not isinstance(
                row.get("response"), str):
            raise ValueError(f"{path}:{number}: needs the strings question and response")
        label = row.get("score")
        if type(label) is not int or not 0 <= label <= max_score:
            raise ValueError(f"{path}:{number}: score {label!r} is not an integer in [0, {max_score}]")
        question, answer = row["question"], str(row.get("answer", ""))
        rows.append((Task(f"label-{number}", question, question, answer), row["response"], label))
    if not rows:
        raise ValueError(f"labels file {path}: no labelled responses")
    return rows


def agreement(labels: list[int], scores: list[int | None], reasons: list[str | None]) -> Agreement:
    """The agreement of ``scores`` (None: not scored, for ``reasons``) with ``labels``."""
    from scipy.stats import spearmanr

    pairs = [(label, score) for label, score in zip(labels, scores) if score is not None]
    unreadable: dict[str, int] = {}
    for score, reason in zip(scores, reasons):
        if score is None:
            unreadable[reason] = unreadable.get(reason, 0) + 1
    n = len(pairs)
    exact = sum(a == b for a, b in pairs) / n if n else math.nan
    within = sum(abs(a - b) <= 1 for a, b in pairs) / n if n else math.nan
    constant = n < 2 or len({a for a, _ in pairs}) < 2 or len({b for _, b in pairs}) < 2
    rho = math.nan if constant else float(spearmanr([a for a, _ in pairs], [b for _, b in pairs]).statistic)
    return Agreement(len(labels), n, exact, within, rho, unreadable)


def check_judge(settings, path: Path) -> Agreement:
    """Score the labelled responses of ``path`` with the judge of ``settings`` (``reward.judge``)."""
    from rftflow.components.verify.judge import JudgeReward

    rows = read_labels(path, settings.max_score)
    judge = JudgeReward(settings)
    try:
        scores = judge.score_many([response for _, response, _ in rows], [task for task, _, _ in rows])
    finally:
        judge.close()
    values = [None if s.value is None else round(s.value * settings.max_score) for s in scores]
    reasons = [None if s.value is not None else _general(s.reason or "") for s in scores]
    return agreement([label for _, _, label in rows], values, reasons)


def _general(reason: str) -> str:
    """A reason without the reply it quotes, so that rows group by cause."""
    return reason.split("): '", 1)[0] + ")" if "): '" in reason else reason.split(": '", 1)[0]
