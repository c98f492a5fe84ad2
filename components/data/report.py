"""The validation report of a campaign: one line per checked batch, totals per stage, reasons.

Every batch that crosses a contract (a task file, the demonstrations, a round, an ingested file)
adds a ``ValidationEntry``; ``validation_report`` renders them as markdown
(``<run dir>/validation/validation.md``, also logged to the MLflow run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass
class ValidationEntry:
    """One checked batch: which stage and round, rows in, accepted, quarantined, reason counts."""

    stage: str
    round: int
    rows: int
    accepted: int
    quarantined: int
    reasons: dict[str, int]


def validation_report(entries: list[ValidationEntry], campaign: str) -> str:
    """The campaign's validation report as markdown: totals per stage, then every batch that
    quarantined rows, with its reasons. Rows in = accepted + quarantined on every line."""
    totals: dict[str, list[int]] = {}
    reasons: dict[str, Counter] = {}
    for e in entries:
        t = totals.setdefault(e.stage, [0, 0, 0, 0])
        t[0] += 1
        t[1] += e.rows
        t[2] += e.accepted
        t[3] += e.quarantined
        reasons.setdefault(e.stage, Counter()).update(e.reasons)
    lines = [f"# Validation report: {campaign}", "",
             "| stage | batches | rows | accepted | quarantined |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {stage} | {b} | {n} | {a} | {q} |" for stage, (b, n, a, q) in totals.items()]
    bad = [e for e in entries if e.quarantined]
    if bad:
        lines += ["", "## Batches with quarantined rows", "", "| stage | round | rows | quarantined | reasons |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {e.stage} | {e.round} | {e.rows} | {e.quarantined} | "
                  + ", ".join(f"{k} ×{v}" for k, v in sorted(e.reasons.items(), key=lambda kv: -kv[1])) + " |"
                  for e in bad]
    else:
        lines += ["", "No row broke a contract."]
    return "\n".join(lines) + "\n"
