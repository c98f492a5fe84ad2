"""Ingestion of human feedback and expert demonstrations: JSONL/Parquet rows → validated experiences.

Row formats (one object per line):

- ``feedback``: ``prompt``, ``response`` and either a ``rating`` (a number within the reward
  bounds; stored as a ``human`` experience with that reward) or a ``correction`` (a better
  response; stored as an ``expert`` demonstration with the top reward, the original response in
  ``info``).
- ``expert``: ``prompt`` and ``response`` (a demonstration, stored as ``expert``).

Optional on both: ``task_id``. Every row lands either in the buffer or in quarantine with its
reason; a file whose bad fraction is above ``contracts.max_bad_fraction`` stores nothing
(``ContractError``). Ingest is idempotent by content: a row's ``experience_id`` hashes the whole
row (kind, prompt, response, rating or correction), and a row whose id is stored already (by any
earlier file, or earlier in this one) is not stored again, so a file re-sent with rows appended
adds only the new rows (a different rating of the same response is a new row). A file's new rows
go under ``ingest-<file hash>``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from rftflow.components.config import ContractsConfig
from rftflow.components.data.contracts import ContractBounds, Verdict, check_experiences, enforce
from rftflow.components.data.experience import SCHEMA, experience_id, make_experience, to_table
from rftflow.components.data.tasksets import read_rows, task_id
from rftflow.components.data.prompts import encode_prompt

INGEST_KINDS = ("feedback", "expert")


@dataclass
class IngestResult:
    file: str
    kind: str  # feedback or expert
    ingest_id: str
    accepted: pa.Table
    quarantined: pa.Table  # with ``reason``

    def report(self) -> dict[str, Any]:
        """``rows``, ``accepted``, ``quarantined`` and the reasons with their counts (the --report JSON)."""
        reasons = Counter(p for r in self.quarantined.column("reason").to_pylist() for p in r.split("; "))
        return {"file": self.file, "kind": self.kind, "ingest_id": self.ingest_id,
                "rows": self.accepted.num_rows + self.quarantined.num_rows, "accepted": self.accepted.num_rows,
                "quarantined": self.quarantined.num_rows, "reasons": dict(reasons.most_common()),
                "by_source": dict(Counter(self.accepted.column("source").to_pylist()))}

    def enforce(self, max_bad_fraction: float) -> None:
        """``ContractError`` when more than ``max_bad_fraction`` of the file's rows are bad (the file
        is then stored nothing of), naming its first bad rows by ``file:row``."""
        enforce(Verdict(self.accepted, self.quarantined), max_bad_fraction, f"file {self.file}",
                label=lambda row: f"{self.file}:{json.loads(row['info'])['row']}")


def _string(row: dict, key: str, required: bool = True) -> str | None:
    value = row.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key!r} must be a string, got {type(value).__name__}" if value is not None
                         else f"missing {key!r}")
    return value


def _experience(row: Any, kind: str, *, campaign: str, ingest_id: str, row_no: int, file: str, tokenizer,
                chat_template: bool, reward_max: float) -> dict[str, Any]:
    """One parsed row → an experience (``ValueError`` names what is wrong with the row)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected an object, got {type(row).__name__}")
    prompt, response = _string(row, "prompt"), _string(row, "response")
    info: dict[str, Any] = {"ingested_from": file, "row": row_no}
    source, reward = "expert", reward_max
    if kind == "feedback":
        correction, rating = _string(row, "correction", required=False), row.get("rating")
        if correction is not None:
            info["original_response"], response = response, correction
        elif rating is None:
            raise ValueError("feedback needs a 'rating' or a 'correction'")
        elif isinstance(rating, bool) or not isinstance(rating, (int, float)):
            raise ValueError(f"'rating' must be a number, got {type(rating).__name__}")
        else:
            try:
                source, reward = "human", float(rating)
            except OverflowError:  # an integer too large for a float; the contract checks the range
                raise ValueError(f"'rating' {str(rating)[:20]}… is out of range") from None
    tid = _string(row, "task_id", required=False) or task_id(prompt)
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    # the row's content, not its place in a file: the same row in a grown file gets the same id
    content = (kind, prompt, info.get("original_response", response), "correction" if "original_response" in info
               else "rating" if source == "human" else "", response if "original_response" in info else reward)
    return make_experience(
        experience_id=experience_id(campaign, "ingest", *content), campaign=campaign, round=0, task_id=tid,
        group_id=f"ingest-{ingest_id}-{row_no}", source=source, prompt=prompt, response=response,
        prompt_ids=encode_prompt(tokenizer, prompt, chat_template), response_ids=response_ids,
        response_mask=[1] * len(response_ids), reward=reward,
        rewards={"human" if source == "human" else "gold": reward}, model_version=0, info=info)


def validate_file(path: str | Path, kind: str, campaign: str, tokenizer, contracts: ContractsConfig, *,
                  chat_template: bool = False) -> IngestResult:
    """Read one feedback or expert file and check every row against its contract (stores nothing)."""
    if kind not in INGEST_KINDS:
        raise ValueError(f"unknown ingest kind {kind!r}; known: {', '.join(INGEST_KINDS)}")
    path = Path(path)
    rows = read_rows(path, f"{kind} file")
    ingest_id = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    parsed, unparsed = [], []
    for row_no, row, error in rows:
        if error is None:
            try:
                parsed.append(_experience(row, kind, campaign=campaign, ingest_id=ingest_id, row_no=row_no,
                                          file=path.name, tokenizer=tokenizer, chat_template=chat_template,
                                          reward_max=contracts.reward_max))
                continue
            except ValueError as e:
                error = str(e)
        unparsed.append(make_experience(
            experience_id=experience_id(campaign, "ingest", ingest_id, row_no), campaign=campaign, round=0,
            task_id="", group_id=f"ingest-{ingest_id}-{row_no}", source="human" if kind == "feedback" else "expert",
            info={"ingested_from": path.name, "row": row_no}) | {"reason": f"parse: {error}"})
    table = to_table(parsed)
    verdicts = [check_experiences(table.filter(pc.equal(table.column("source"), source)), ContractBounds.of(contracts),
                                  kind=source) for source in ("human", "expert")]
    quarantined = pa.concat_tables([
        *(v.quarantined for v in verdicts),
        pa.Table.from_pylist(unparsed, schema=SCHEMA.append(pa.field("reason", pa.string()))),
    ])
    file_rows = [json.loads(info)["row"] for info in quarantined.column("info").to_pylist()]
    quarantined = quarantined.take(pa.array(sorted(range(len(file_rows)), key=file_rows.__getitem__), pa.int64()))
    accepted = pa.concat_tables([SCHEMA.empty_table(), *(v.accepted for v in verdicts)])
    return IngestResult(str(path), kind, ingest_id, accepted, quarantined)


__all__ = ["INGEST_KINDS", "IngestResult", "validate_file"]
