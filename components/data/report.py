"""The validation report of a campaign: one line per checked batch, totals per stage, reasons.

Every batch that crosses a contract (a task file, the demonstrations, a round, an ingested file)
adds a ``ValidationEntry`` to the campaign's ``ValidationLog``; ``validation_report`` renders them as markdown
(``<run dir>/validation/validation.md``, also logged to the MLflow run).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa


@dataclass
class ValidationEntry:
    """One checked batch: which stage and round, rows in, accepted, quarantined, reason counts."""

    stage: str
    round: int
    rows: int
    accepted: int
    quarantined: int
    reasons: dict[str, int]


@dataclass
class ValidationLog:
    """This run's checked batches, in order (a checkpoint keeps them, a restore brings them back)."""

    entries: list[ValidationEntry] = field(default_factory=list)

    def record(self, stage: str, round_no: int, rows: int, rejected: pa.Table) -> None:
        """Add the line of a batch of ``rows`` rows of which ``rejected`` (with ``reason``, "; "-joined)
        were turned away; a retried stage replaces its earlier line for the same round."""
        reasons = rejected.column("reason").to_pylist() if rejected.num_rows else []
        self.entries = [e for e in self.entries if (e.stage, e.round) != (stage, round_no)]
        self.entries.append(ValidationEntry(stage, round_no, rows, rows - rejected.num_rows, len(reasons),
                                            dict(Counter(p for r in reasons for p in r.split("; ")))))

    def with_ingested(self, reports: list[dict[str, Any]]) -> list[ValidationEntry]:
        """Every checked batch for the validation report: the files ingested into the campaign's
        store (``reports``: the store's ingest reports, by ``rftflow ingest``), then this run's."""
        files = [ValidationEntry(f"ingested {r['kind']} file", 0, r["rows"], r["accepted"], r["quarantined"],
                                 r["reasons"]) for r in reports]
        return [*files, *self.entries]

    def to_state(self) -> list[dict[str, Any]]:
        return [asdict(e) for e in self.entries]

    def restore(self, state: list[dict[str, Any]]) -> None:
        """The entries as ``to_state`` returned them (a checkpoint's)."""
        self.entries = [ValidationEntry(**e) for e in state]


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
