"""Promotion through the MLflow model registry: the ``champion`` alias moves to a challenger only
when it is measurably better.

Both versions are evaluated on the same held-out tasks with the same greedy decoding
(the workflow's ``greedy_scores``); a task is solved when its task's own reward reaches its
threshold (``rewards.is_correct``; the rule is the tag ``promotion.accuracy_by``). The challenger
is promoted when its accuracy beats the champion's by
at least ``promotion.margin`` and an exact one-sided McNemar test on the paired per-task results
passes: with b = tasks only the champion solves and c = tasks only the challenger solves,
p = P(X ≥ c), X ~ Binomial(b + c, 1/2) (``scipy.stats.binomtest``), and p < ``promotion.alpha``.
With no champion yet, the first version whose accuracy reaches ``promotion.min_accuracy`` becomes
champion. In a mixture, a challenger that falls more than ``promotion.max_regression`` below the
champion on any one taskset is not promoted, whatever its overall result. Every decision is
recorded as tags on both versions (scores, per-taskset scores, p-value, decision, reason).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from rftflow.components.campaign.bench import BenchModelError, eval_engine, held_out
from rftflow.components.data.tasksets import by_part, taskset_of
from rftflow.components.explore.workflows import make_workflow
from rftflow.components.evaluation.verdicts import is_correct
from rftflow.components.verify.rewards import campaign_rewards
from rftflow.components.campaign.preflight import Preflight

ALIAS = "champion"


@dataclass(frozen=True)
class Decision:
    model: str
    challenger: str  # version
    champion: str | None  # version, None: there was none
    challenger_accuracy: float
    champion_accuracy: float | None
    only_challenger: int  # c: tasks only the challenger solves
    only_champion: int  # b
    p_value: float | None
    promoted: bool
    reason: str
    tasksets: dict[str, tuple[float, float | None]] = field(default_factory=dict)  # a mixture: part → (its, champion's)
    accuracy_by: str = ""  # what accuracy counts (``Rewards.accuracy_rule``)

    def line(self) -> str:
        """The decision in one line."""
        verdict = "promoted to @champion" if self.promoted else "not promoted"
        return f"{self.model} v{self.challenger}: {verdict} ({self.reason})"


def mcnemar_p(only_champion: int, only_challenger: int) -> float:
    """One-sided exact McNemar p-value that the challenger is better: P(X ≥ c), X ~ Bin(b + c, ½)."""
    from scipy.stats import binomtest

    n = only_champion + only_challenger
    return 1.0 if n == 0 else float(binomtest(only_challenger, n, 0.5, alternative="greater").pvalue)


def decide(model: str, challenger: str, challenger_solved: list[bool], champion: str | None,
           champion_solved: list[bool] | None, *, margin: float, alpha: float, min_accuracy: float) -> Decision:
    """The promotion rule (see the module docstring) on paired per-task results."""
    acc = sum(challenger_solved) / len(challenger_solved)
    if champion is None or champion_solved is None:
        ok = acc >= min_accuracy
        reason = f"no champion yet; accuracy {acc:.3f} {'≥' if ok else '<'} promotion.min_accuracy {min_accuracy}"
        return Decision(model, challenger, None, acc, None, 0, 0, None, ok, reason)
    base = sum(champion_solved) / len(champion_solved)
    b = sum(x and not y for x, y in zip(champion_solved, challenger_solved))
    c = sum(y and not x for x, y in zip(champion_solved, challenger_solved))
    p = mcnemar_p(b, c)
    if acc - base < margin:
        reason = f"accuracy {acc:.3f} vs champion v{champion} {base:.3f}: gain {acc - base:+.3f} < margin {margin}"
        return Decision(model, challenger, champion, acc, base, c, b, p, False, reason)
    ok = p < alpha
    reason = (f"accuracy {acc:.3f} vs champion v{champion} {base:.3f} (+{acc - base:.3f}); McNemar p = {p:.4f} "
              f"{'<' if ok else '≥'} alpha {alpha} ({c} tasks only it solves, {b} only the champion)")
    return Decision(model, challenger, champion, acc, base, c, b, p, ok, reason)


def taskset_accuracies(parts: list[str | None], solved: list[bool]) -> dict[str, float]:
    """Each mixture part's share of solved tasks (``parts``: each task's part; None outside a mixture)."""
    out: dict[str, list[bool]] = {}
    for part, ok in zip(parts, solved):
        if part is not None:
            out.setdefault(part, []).append(ok)
    return {part: sum(v) / len(v) for part, v in sorted(out.items())}


def guard_regressions(decision: Decision, parts: list[str | None], challenger_solved: list[bool],
                      champion_solved: list[bool] | None, max_regression: float) -> Decision:
    """``decision`` with each mixture part's accuracies, and not promoted when the challenger falls
    more than ``max_regression`` below the champion on any part (the reason names the parts)."""
    mine = taskset_accuracies(parts, challenger_solved)
    theirs = taskset_accuracies(parts, champion_solved) if champion_solved is not None else {}
    tasksets = {part: (acc, theirs.get(part)) for part, acc in mine.items()}
    worse = [f"{part} {acc:.3f} vs {base:.3f}" for part, (acc, base) in tasksets.items()
             if base is not None and base - acc > max_regression]
    if worse and decision.promoted:
        return replace(decision, promoted=False, tasksets=tasksets, reason=(
            f"regresses on taskset {', '.join(worse)} (more than promotion.max_regression {max_regression}); "
            f"overall: {decision.reason}"))
    return replace(decision, tasksets=tasksets)


def promote(checked: Preflight, version: str | None = None) -> Decision:
    """Evaluate the challenger (``version``, default the newest) against the ``champion`` of
    ``tracking.registered_model`` on the campaign's held-out tasks; move the alias if it wins; tag
    both versions. ``BenchModelError`` (one line) when there is no such model or version."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    cfg, uri = checked.cfg, checked.tracking_uri
    name, rules = cfg.tracking.registered_model, cfg.promotion
    client = MlflowClient(uri, registry_uri=uri)
    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException as e:
        raise BenchModelError(f"tracking.registered_model {name!r}: {str(e).splitlines()[0]}") from None
    if not versions:
        raise BenchModelError(f"tracking.registered_model {name!r}: no versions in {uri}")
    challenger = version or str(max(int(v.version) for v in versions))
    if challenger not in {str(v.version) for v in versions}:
        raise BenchModelError(f"{name} has no version {challenger}; versions: "
                              + ", ".join(sorted((str(v.version) for v in versions), key=int)))
    try:
        champion = str(client.get_model_version_by_alias(name, ALIAS).version)
    except MlflowException:
        champion = None
    tasks = held_out(checked, None)
    reward_fn = campaign_rewards(cfg)

    parts = cfg.part_tasksets()
    groups = by_part(tasks)  # the tasks each workflow runs: a mixture part's, or (None) the campaign's

    def solved(v: str) -> list[bool]:  # (a models:/ reference never reads the campaign's store)
        engine = eval_engine(f"models:/{name}/{v}", None, uri, cfg)
        out = [False] * len(tasks)
        for part, rows in groups.items():
            part_cfg = cfg.model_copy(update={"taskset": parts[part]}) if part else cfg
            workflow = make_workflow(part_cfg, engine.tokenizer, reward_fn=reward_fn,
                                     context_limit=getattr(engine.model.config, "max_position_embeddings", None))
            scores = workflow.greedy_scores(engine, [tasks[i] for i in rows], reward_fn, cfg.reward.function,
                                            cfg.eval.max_new_tokens)
            for i, s in zip(rows, scores):
                out[i] = is_correct(s)
        return out

    try:
        if champion == challenger:
            decision = Decision(name, challenger, champion, float("nan"), None, 0, 0, None, False,
                                f"v{challenger} is already the champion")
        else:
            mine, theirs = solved(challenger), solved(champion) if champion else None
            decision = decide(name, challenger, mine, champion, theirs,
                              margin=rules.margin, alpha=rules.alpha, min_accuracy=rules.min_accuracy)
            decision = guard_regressions(decision, [taskset_of(t) for t in tasks], mine, theirs,
                                         rules.max_regression)
    finally:
        reward_fn.close()
    decision = replace(decision, accuracy_by=reward_fn.accuracy_rule)
    _record(client, decision, len(tasks))
    if decision.promoted:
        client.set_registered_model_alias(name, ALIAS, challenger)
    return decision


def _record(client, d: Decision, tasks: int) -> None:
    """Tags on the challenger (its evaluation and the decision) and the champion (what it faced)."""
    tags = {"promotion.decision": "promoted" if d.promoted else "rejected", "promotion.reason": d.reason,
            "promotion.tasks": str(tasks), "promotion.champion": d.champion or "none",
            "promotion.accuracy_by": d.accuracy_by}
    if d.challenger_accuracy == d.challenger_accuracy:  # not NaN
        tags["promotion.accuracy"] = f"{d.challenger_accuracy:.4f}"
    if d.champion_accuracy is not None:
        tags["promotion.champion_accuracy"] = f"{d.champion_accuracy:.4f}"
    if d.p_value is not None:
        tags["promotion.p_value"] = f"{d.p_value:.6f}"
    for part, (acc, base) in d.tasksets.items():
        tags[f"promotion.accuracy.{part}"] = f"{acc:.4f}"
        if base is not None:
            tags[f"promotion.champion_accuracy.{part}"] = f"{base:.4f}"
    for key, value in tags.items():
        client.set_model_version_tag(d.model, d.challenger, key, value)
    if d.champion and d.champion != d.challenger:
        client.set_model_version_tag(d.model, d.champion, f"promotion.defended.v{d.challenger}",
                                     "lost" if d.promoted else "kept")


def decision_dict(d: Decision) -> dict:
    return asdict(d)
