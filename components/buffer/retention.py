"""Retention: what ``rftflow buffer gc`` deletes from a campaign's store, and what it never does.

A campaign writes every round and deletes little while it runs (old checkpoints past
``checkpoint.keep_last``, published weights past the newest few, state generations). ``plan``
lists what else can go, kind by kind; ``apply`` deletes it. The rule for each kind:

- ``staging`` (``staging/round=N``): explore's hand-off to verify, and the round's shard leases
  (``leases/round=N``, several explorer processes). Deleted for the rounds whose
  experiences are committed, at or before the oldest kept checkpoint (all of them once the campaign
  finished): a resume redoes only later rounds (one whose hand-off is gone explores again; its
  stored rows stay). A finished campaign never resumes, so nothing below is kept for a resume.
- ``experiences`` (``experiences/usual/round=N``) and their quarantine (``quarantine/round=N``,
  ``quarantine/failed/round=N``): kept, unless ``retention.keep_rounds`` is set; then rounds
  older than the newest ``keep_rounds`` go, except every round a resume or a replay still needs:
  from the oldest kept checkpoint's FIFO cursor on, and (``buffer.sampling: replay``) each round
  with a group that checkpoint's use counts still allow (``buffer.reuse_limit``) and that is not
  past ``algorithm.max_staleness``.
- ``weights`` (``weights/vNNNNNN``, ``sync.method: checkpoint``): every version but the newest.
- ``checkpoints``: those past ``checkpoint.keep_last`` / ``keep_best`` (a changed setting), and the
  files of checkpoints a crash left uncommitted; those set aside as corrupt
  (``checkpoints/corrupt/``, with the reason in ``corrupt.json``) only by ``rftflow buffer gc``
  itself, listed by name: the campaign's own rotation and its collection after the campaign
  (``retention.after_campaign``) keep them for someone to look at. The warm start's own
  checkpoint (``warm_start/``) once a checkpoint after it exists.
- ``uncommitted`` shards (``part-*.parquet`` with no commit marker: a writer killed mid-shard).
- ``images`` (``images/<sha256>``): the pictures that no row of a shard left after the above names
  (every round that showed them deleted, or a writer killed before its shard was committed).

Never deleted: tasksets, demonstrations and human feedback, the state, kept checkpoints, the
quarantine of tasks, demonstrations and ingested files, and anything in MLflow (registered model
versions keep their files there, so no version depends on the store). Nothing is deleted while
another process runs the campaign.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from rftflow.components.buffer.experiences import ExperienceStore
from rftflow.components.buffer.images import IMAGES_DIR, referenced
from rftflow.components.buffer.weights import CORRUPT_DIR, WARM_START_DIR, WeightStore

from rftflow.components.buffer.layout import CHECKPOINT_MANIFEST, WEIGHTS_MANIFEST, shard_order
from rftflow.components.buffer.shards import COMMIT_DIR

KINDS = ("staging", "experiences", "quarantine", "weights", "checkpoints", "uncommitted", "images")


@dataclass
class GcPlan:
    """What ``apply`` would delete: kind → keys, and why each kind keeps what it keeps."""

    campaign: str
    deletions: dict[str, list[str]] = field(default_factory=lambda: {kind: [] for kind in KINDS})
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(len(keys) for keys in self.deletions.values())

    def rows(self) -> list[tuple[str, int, str]]:
        """(kind, objects to delete, what is kept and why), one per kind."""
        return [(kind, len(self.deletions[kind]), self.notes.get(kind, "")) for kind in KINDS]


def _rounds(keys: list[str]) -> dict[int, list[str]]:
    """Keys under ``…/round=N/…`` grouped by N."""
    grouped: dict[int, list[str]] = {}
    for key in keys:
        if "/round=" in key:
            grouped.setdefault(shard_order(key)[0], []).append(key)
    return grouped


def _resume_state(weights: WeightStore, version: int) -> dict[str, Any]:
    """The buffer state and weight version a checkpoint resumes with (its ``campaign.json``)."""
    return json.loads(weights.objects.get(f"{weights.checkpoint_prefix(version)}/campaign.json"))


def _replayable(table, uses: dict[str, int], limit: int, bound: int | None, version: int) -> bool:
    """Whether a replay at weight ``version`` may still draw a group of ``table``: used fewer than
    ``limit`` times and not older than ``bound`` versions."""
    stats = table.group_by("group_id").aggregate([("model_version", "max")])
    return any(uses.get(gid, 0) < limit and (bound is None or v >= version - bound)
               for gid, v in zip(stats.column("group_id").to_pylist(), stats.column("model_version_max").to_pylist()))


def _needed_from(store: ExperienceStore, oldest: dict[str, Any] | None, config: dict[str, Any]) -> int | None:
    """The oldest round of explorer experiences that a resume from ``oldest`` (a kept checkpoint's
    ``campaign.json``) may read: every round after its own (redone, their stored rows reused), and
    before it, from the FIFO cursor on or (replay) each round with a group a replay may still
    draw. None when there is nothing to resume."""
    if oldest is None:
        return None
    state, after = oldest["buffer_state"], oldest["round"] + 1
    if config["buffer"]["sampling"] != "replay":
        cursor = (state.get("fifo_cursor") or {}).get("shard", "")
        return min(after, shard_order(cursor)[0] if cursor else 1)
    uses = state.get("replay_uses") or {}
    limit, bound = config["buffer"]["reuse_limit"], config["algorithm"].get("max_staleness")
    committed = _rounds(store.usual_shards())
    for round_no in sorted(r for r in committed if r < after):
        if any(_replayable(store.shard(k), uses, limit, bound, oldest["weight_version"]) for k in committed[round_no]):
            return round_no
    return after


def plan(store: ExperienceStore, config: dict[str, Any], *, finished: bool, keep_rounds: int | None = None,
         corrupt: bool = False) -> GcPlan:
    """What can go from ``store``'s campaign under the rules of the module docstring. ``config``:
    the campaign's (as in its state); ``finished``: the campaign ended (its newest weights are
    then superseded too); ``keep_rounds`` overrides ``retention.keep_rounds``; ``corrupt``: the
    checkpoints set aside as corrupt go too (``rftflow buffer gc``)."""
    result = GcPlan(store.campaign)
    keep_rounds = keep_rounds if keep_rounds is not None else (config.get("retention") or {}).get("keep_rounds")
    keys = store.objects.list(store.key(""))
    under = lambda *parts: [k for k in keys if k.startswith(store.key(*parts) + "/")]  # noqa: E731

    weights = WeightStore(store.objects, store.campaign)
    checkpoints = weights.checkpoints()
    keep_last, keep_best = config["checkpoint"]["keep_last"], config["checkpoint"]["keep_best"]
    kept = {m["version"] for m in checkpoints[-keep_last:]}
    scored = [m for m in checkpoints if m.get("eval_accuracy") is not None]
    if keep_best and scored:
        kept.add(max(scored, key=lambda m: (m["eval_accuracy"], m["version"]))["version"])
    kept_prefixes = {weights.checkpoint_prefix(v) + "/" for v in kept}
    set_aside = [m["prefix"].rsplit("/", 1)[1] for m in weights.set_aside()]
    if not corrupt:
        kept_prefixes.add(store.key(*CORRUPT_DIR) + "/")
    for key in under("checkpoints"):
        if not any(key.startswith(p) for p in kept_prefixes):
            result.deletions["checkpoints"].append(key)
    if finished or checkpoints:  # the warm start's own checkpoint: superseded by the one after the warm start
        result.deletions["checkpoints"] += under(WARM_START_DIR)
    result.notes["checkpoints"] = (f"kept: {', '.join(f'v{v:06d}' for v in sorted(kept)) or 'none'}"
                                   + (f"; set aside as corrupt ({'deleted' if corrupt else 'kept'}): "
                                      f"{', '.join(set_aside)}" if set_aside else ""))
    # what a resume may read: from the oldest kept checkpoint on (it is the fallback when newer ones
    # are corrupt); a finished campaign never resumes
    oldest_kept = min(kept) if kept and not finished else None
    oldest = _resume_state(weights, oldest_kept) if oldest_kept is not None else None
    oldest_round = oldest["round"] if oldest else None

    usual = _rounds(under("experiences", "usual"))
    committed_rounds = {r for r, ks in usual.items() if any(f"/{COMMIT_DIR}/" in k for k in ks)}
    staging = _rounds(under("staging") + under("leases"))  # a round's hand-off and its shards' leases
    for round_no, ks in staging.items():
        if (finished or oldest_round is not None and round_no <= oldest_round) and round_no in committed_rounds:
            result.deletions["staging"] += ks
    result.notes["staging"] = ("kept: none (the campaign finished)" if finished else
                               f"kept: rounds after {oldest_round} (a resume may redo them)" if oldest_round is not None
                               else "kept: all (no checkpoint yet)")

    if keep_rounds is None:
        result.notes["experiences"] = result.notes["quarantine"] = "kept: all (retention.keep_rounds is null)"
    else:
        newest = max(usual, default=0)
        needed = _needed_from(store, oldest, config)
        first_kept = newest - keep_rounds + 1 if needed is None else min(newest - keep_rounds + 1, needed)
        for round_no, ks in usual.items():
            if round_no < first_kept:
                result.deletions["experiences"] += ks
        for prefix in (("quarantine",), ("quarantine", "failed")):
            for round_no, ks in _rounds([k for k in under(*prefix)
                                         if k.startswith(store.key(*prefix, "round="))]).items():
                if round_no < first_kept:
                    result.deletions["quarantine"] += ks
        result.notes["experiences"] = result.notes["quarantine"] = (
            f"kept: rounds {first_kept}-{newest} (the newest {keep_rounds}"
            + (f"; a resume or replay needs {needed} on" if needed is not None and needed < newest - keep_rounds + 1
               else "") + ")")
    result.notes["quarantine"] = result.notes["quarantine"] + "; tasks, demonstrations, ingested files: kept"

    published = weights.published_weights()
    superseded = published if finished else published[:-1]
    for version in superseded:
        result.deletions["weights"] += under("weights", f"v{version:06d}")
    if finished and published:
        result.deletions["weights"] += [store.key("weights", "latest.json")]
    result.notes["weights"] = ("kept: none (the campaign finished; its model is in MLflow and the run dir)" if finished
                               else f"kept: v{published[-1]:06d}" if published else "none published")

    markers = {k for k in keys if f"/{COMMIT_DIR}/" in k}
    for key in keys:
        if key.endswith(".parquet") and "/part-" in key:
            prefix, name = key.rsplit("/", 1)
            if f"{prefix}/{COMMIT_DIR}/{name.removesuffix('.parquet')}.json" not in markers:
                result.deletions["uncommitted"].append(key)
    counted = Counter(k.split("/", 2)[1] for k in result.deletions["uncommitted"])
    result.notes["uncommitted"] = ", ".join(f"{n} under {where}/" for where, n in counted.items())
    _unseen_pictures(store, keys, result)
    return result


def _unseen_pictures(store: ExperienceStore, keys: list[str], result: GcPlan) -> None:
    """The pictures no shard left after ``result``'s other deletions names go too (read from each
    such shard's ``images`` column; nothing is read for a campaign without pictures)."""
    pictures = [k for k in keys if k.startswith(store.key(IMAGES_DIR) + "/")]
    if not pictures:
        return
    going = {k for kind in KINDS for k in result.deletions[kind]}
    named: set[str] = set()
    for key in keys:
        if key.endswith(".parquet") and key not in going:
            shard = pq.ParquetFile(io.BytesIO(store.objects.get(key)))
            if "images" in shard.schema_arrow.names:
                named |= referenced(shard.read(columns=["images"]))
    result.deletions["images"] = [k for k in pictures if k.removeprefix(store.key("")) not in named]
    result.notes["images"] = f"kept: {len(pictures) - len(result.deletions['images'])} named by the rows kept"


def apply(store: ExperienceStore, gc_plan: GcPlan) -> int:
    """Delete what ``gc_plan`` lists, commit markers and manifests first (a reader then never
    trusts what is left of a shard or checkpoint being deleted); the number of objects deleted."""
    keys = [k for kind in KINDS for k in gc_plan.deletions[kind]]
    first = [k for k in keys if f"/{COMMIT_DIR}/" in k or k.endswith((f"/{CHECKPOINT_MANIFEST}", f"/{WEIGHTS_MANIFEST}"))]
    for key in first + [k for k in keys if k not in set(first)]:
        store.objects.delete(key)
    return len(keys)


__all__ = ["GcPlan", "KINDS", "apply", "plan"]
