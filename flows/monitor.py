"""What a campaign shows in the Prefect UI (and on its MLflow run) while it runs, so that its flow
run page answers "where is it, is it learning, which run is it, when will it end" without opening
anything:

- the flow run's **name**: the campaign, the day, its run dir's hash and the attempt
  (``arith-mix-2026-11-26-3f2a1c-a2``), attempts counted across ``--restart`` (``CampaignRun.attempt``),
  so two campaigns and two attempts never share one;
- its **tags**, shown beside the name in the header, kept current: during the warm start
  ``warm start 120/1500``, ``sft loss 0.423``, ``check 0.850`` (with ``trainer.warmup_until``) and
  ``eta ≤ 11 min (warm start)``; then ``round 8/25``, ``reward 0.531``, ``accuracy 0.950``
  (held-out) and ``eta 42 min`` (the campaign); always ``campaign <label>``, ``mlflow <run id>``,
  and at the end ``model <name> v<k> (<registry>)``. Tags are what the flow run page's header
  shows; a state message or a label is shown only on other tabs;
- its **artifacts**, one card per kind, each made once and then updated: ``…-mlflow`` (a link to the
  MLflow run's charts, when an MLflow server serves it, from the start), ``…-warm-start`` (its
  steps done, the step, loss and ETA in the description), ``…-progress`` (rounds done, the ETA),
  ``…-rounds`` (a table of every round's reward, loss, held-out accuracy, quarantined rows and
  seconds per stage, from round 0, "before"; with a multi-turn workflow also its episodes' turns,
  success, tool calls, tool errors and timeouts; with ``eval.shown_answers``, where each evaluated
  round's answers are in MLflow) and ``…-summary`` (markdown at the end, or the
  one line on why it stopped). Keys are ``<label>-a<attempt>-<kind>``;
- the MLflow run's tags ``rftflow.progress`` and ``rftflow.eta`` (columns of the experiment's runs
  table, ``tracking.experiment_url``), at most every ``MLFLOW_SECONDS``.

The table is read from the MLflow run's metrics (``Tracker.history``), so a resumed campaign shows
the rounds its earlier attempts did too. Prefect's views are updated after a warm-start step or a
round at most every ``UPDATE_SECONDS`` (and always after an evaluation, the warm start's first
and last step and the last round), by a background thread in the flow run's context, so the work
does not wait on the Prefect API; the summary waits for them first. Everything here is best
effort: a view that cannot be written is a warning, never a failed campaign.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

from prefect import get_client
from prefect.events import emit_event
from prefect.artifacts import (create_link_artifact, create_markdown_artifact, create_progress_artifact,
                               create_table_artifact, update_progress_artifact)
from prefect.client.schemas.actions import ArtifactUpdate

from rftflow.components.campaign.run import CampaignRun
from rftflow.components.campaign.schedule import ROUND, eval_due
from rftflow.components.tracking import (artifact_url, experiment_url, is_tracking_server, model_version_url,
                                         registry_name, run_url)
from rftflow.flows.alerts import ENDED_EVENT, ROUND_EVENT, campaign_resource
from rftflow.flows.progress import Pace, eta_text, warm_figures

UPDATE_SECONDS = 5.0
MLFLOW_SECONDS = 30.0  # the MLflow run's progress tags: a write to its store each time
# column → MLflow metric of the round (blank where a round has none: accuracy between evaluations)
COLUMNS = {"reward": "reward/mean", "loss": "loss/total", "accuracy": "accuracy/held_out",
           "quarantined": "verify/quarantined", **{f"{stage.value} s": f"time/{stage.value}_s" for stage in ROUND}}
# and, for a multi-turn workflow, its episodes
EPISODE_COLUMNS = {"turns": "episode/turns_mean", "success": "episode/success", "tool calls": "tool/calls",
                   "tool errors": "tool/errors", "timeouts": "episode/timeouts"}


def taskset_columns(cfg) -> dict[str, str]:
    """A mixture's columns: each part's reward and held-out accuracy."""
    return {f"{kind} {p.name}": f"{metric.format(p.name)}" for p in cfg.mixture
            for kind, metric in (("reward", "reward/{}/mean"), ("accuracy", "accuracy/{}/held_out"))}


# the tags this module owns (a deployment's own tags are kept as they are)
TAG_PREFIXES = ("round ", "reward ", "accuracy ", "campaign ", "mlflow ", "model ", "warm start ", "sft loss ",
                "check ", "eta ")
ATTEMPT_SUFFIX = re.compile(r"-a\d+$")


def _best_effort(method):
    """The UI is a view: an artifact that cannot be written is a warning, never a failed campaign."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001
            logging.getLogger("rftflow").warning("Prefect UI %s not written: %s", method.__name__.strip("_"), e)
    return wrapper


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower())


def mlflow_links(ui: str | None, tracking_uri: str, experiment_id: str, run_id: str, model: str | None,
                 version: str | None) -> tuple[str, str | None]:
    """Markdown for the MLflow run and model version: links into MLflow's training view where an
    MLflow server shows them (``ui``), else the ids and how to open the store in a browser
    (``rftflow up``)."""
    if ui:
        run = f"[run {run_id}]({run_url(ui, experiment_id, run_id)})"
        return run, f"[{model} v{version}]({model_version_url(ui, model, version)})" if version else None
    hint = f" in `{tracking_uri}` (`rftflow up` serves it)"
    return f"run `{run_id}`{hint}", f"`models:/{model}/{version}`" if version else None


def mlflow_ui(run: CampaignRun) -> str | None:
    """Where a browser shows this campaign's MLflow run: its tracking server, else the MLflow server
    ``rftflow up`` started over its run dir (while it runs); None if neither."""
    from rftflow.flows.servers import served

    uri = run.tracker.uri
    return uri.rstrip("/") if is_tracking_server(uri) else served(run.run_dir).get("mlflow")


class UIMonitor:
    """The name, tags and artifacts of one flow run of ``run``, and its MLflow run's progress tags."""

    def __init__(self, run: CampaignRun, flow_run_id: str | None):
        self.run, self.flow_run_id = run, flow_run_id
        self.label, self.attempt = run.checked.label, run.attempt
        self.key = lambda kind: artifact_key(self.label, f"a{self.attempt}", kind)  # noqa: E731
        self.ui = mlflow_ui(run)
        self._progress_id = self._table_id = self._warm_id = None
        self._own_tags: list[str] = []  # the flow run's other tags (a deployment's), kept as they are
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="rftflow-ui")  # updates, in order
        self._updated_at = self._mlflow_at = -float("inf")  # when Prefect's views, MLflow's tags were last written
        self._warm_pace, self._round_pace = Pace(run.cfg.trainer.warmup_steps), Pace(run.cfg.rounds)
        self._check: float | None = None  # the warm start's last warmup_until check
        self._named()
        self._link()

    def _percent(self, done: int, total: int) -> float:
        return round(100.0 * done / max(1, total), 1)

    @_best_effort
    def _named(self) -> None:
        """The flow run's name with this attempt (in place of a Prefect retry's earlier one), and its first tags."""
        if not self.flow_run_id:
            return
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(UUID(self.flow_run_id))
            self._own_tags = [t for t in flow_run.tags if not t.startswith(TAG_PREFIXES)]
            client.update_flow_run(flow_run.id, name=f"{ATTEMPT_SUFFIX.sub('', flow_run.name)}-a{self.attempt}")
        self._tag()

    def _tag(self, *progress: str) -> None:
        run = self.run
        tags = [*self._own_tags, f"campaign {self.label}", f"mlflow {run.tracker.run_id}", *progress]
        if run.state.model_version:
            registry = registry_name(run.tracker.uri)
            tags.append(f"model {run.cfg.tracking.registered_model} v{run.state.model_version} ({registry})")
        with get_client(sync_client=True) as client:
            client.update_flow_run(UUID(self.flow_run_id), tags=tags)

    @_best_effort
    def _link(self) -> None:
        """The link to the MLflow run's charts, from the start (the warm start has none yet)."""
        if self.ui:
            create_link_artifact(run_url(self.ui, self.run.tracker.experiment_id, self.run.tracker.run_id),
                                 link_text=f"MLflow run {self.run.tracker.run_name} ({self.label})",
                                 key=self.key("mlflow"), description=f"campaign {self.label}: its MLflow run's charts")

    def _mlflow_progress(self, progress: str, eta: str | None, last: bool = False) -> None:
        """The MLflow run's ``rftflow.progress`` and ``rftflow.eta``, at most every ``MLFLOW_SECONDS``
        (in the caller's thread: the campaign's own writes to its store come from there too)."""
        now = time.monotonic()
        if not last and now - self._mlflow_at < MLFLOW_SECONDS:
            return
        self._mlflow_at = now
        try:
            self.run.tracker.set_tags({"rftflow.progress": progress, "rftflow.eta": eta or "-"})
        except Exception as e:  # noqa: BLE001 — a view
            logging.getLogger("rftflow").warning("MLflow progress tags not written: %s", e)

    def _due(self, last: bool) -> bool:
        now = time.monotonic()
        if not last and now - self._updated_at < UPDATE_SECONDS:
            return False
        self._updated_at = now
        return True

    # the warm start ----------------------------------------------------------------------------
    def warmup(self, step: int, metrics: dict[str, float]) -> None:
        """After warm-start step ``step`` (the warm start's progress callback): its tags, progress
        card and MLflow tags when due; the ETA is an upper bound where ``trainer.warmup_until`` can
        end it early."""
        tc = self.run.cfg.trainer
        edge = self._warm_pace.done <= self._warm_pace.first_done() or step == tc.warmup_steps  # first or last
        self._warm_pace.update(step)
        self._check = metrics.get("warmup/check_accuracy", self._check)
        seconds = self._warm_pace.seconds_left() if step < tc.warmup_steps else None
        figures, bound = warm_figures(metrics, self._check), tc.warmup_until
        where = f"warm start {step}/{tc.warmup_steps}"
        eta, when = eta_text(seconds, bound is not None), eta_text(seconds, bound is not None, clock=True)
        self._mlflow_progress(f"{where}: {', '.join(figures)}" if figures else where,
                              when and f"{when} (the warm start; then {self.run.cfg.rounds} rounds)", last=edge)
        if not self._due(edge):
            return
        tags = [where, *figures, *([f"eta {eta} (warm start)"] if eta else [])]
        description = (f"campaign {self.label}: warm start, step {step} of {tc.warmup_steps}"
                       + (f": {', '.join(figures)}" if figures else "") + (f"; eta {when}" if when else "")
                       + (f"; trainer.warmup_until {bound:g} may end it sooner" if bound is not None else ""))
        context = contextvars.copy_context()
        self._writer.submit(context.run, self._write_warm, tags, self._percent(step, tc.warmup_steps), description)

    @_best_effort
    def _write_warm(self, tags: list[str], percent: float, description: str) -> None:
        if self.flow_run_id:
            self._tag(*tags)
        if self._warm_id is None:
            self._warm_id = create_progress_artifact(percent, key=self.key("warm-start"), description=description)
        else:
            update_progress_artifact(self._warm_id, percent, description=description)

    # the rounds --------------------------------------------------------------------------------
    @_best_effort
    def start(self, rounds_done: int) -> None:
        """Before the first round of this attempt (``rounds_done`` by earlier attempts)."""
        self._round_pace.update(rounds_done)
        self._progress_id = create_progress_artifact(
            self._percent(rounds_done, self.run.cfg.rounds), key=self.key("progress"),
            description=f"campaign {self.label}: rounds done of {self.run.cfg.rounds}")
        self._mlflow_progress(f"round {rounds_done}/{self.run.cfg.rounds}", None, last=True)

    def round_done(self, round_no: int) -> None:
        """Tags, progress and the table as of ``round_no``, when due (see the module docstring),
        written in the background (in the flow run's context, so they belong to it)."""
        self._round_pace.update(round_no)
        last = round_no == self.run.cfg.rounds
        tags = self._progress(round_no)
        eta = None if last else eta_text(self._round_pace.seconds_left(), clock=True)
        self._mlflow_progress(", ".join(tags), eta, last=last or eval_due(self.run.cfg, round_no))
        # every round's event, due or not: the stall alert (flows.alerts) hears the campaign by them
        self._writer.submit(contextvars.copy_context().run, self._round_event, round_no)
        if not self._due(last or eval_due(self.run.cfg, round_no)):
            return
        if eta:
            tags.append(f"eta {eta_text(self._round_pace.seconds_left())}")
        rows, context = self.rows(), contextvars.copy_context()
        description = f"campaign {self.label}: rounds done of {self.run.cfg.rounds}" + (f"; eta {eta}" if eta else "")
        self._writer.submit(context.run, self._write_round, round_no, rows, tags, description)

    def _progress(self, rounds_done: int) -> list[str]:
        """The tags of where the campaign is: round, the latest reward, the newest held-out accuracy."""
        run, tags = self.run, [f"round {rounds_done}/{self.run.cfg.rounds}"]
        if run.last_reward is not None:
            tags.append(f"reward {run.last_reward:.3f}")
        if run.accuracy_last is not None:
            tags.append(f"accuracy {run.accuracy_last:.3f}")
        return tags

    def _event(self, event: str, **payload: Any) -> None:
        """A campaign event (``flows.alerts``: a round, the end), tied to this flow run."""
        related = [{"prefect.resource.id": f"prefect.flow-run.{self.flow_run_id}", "prefect.resource.role": "flow-run"}]
        emit_event(event, resource=campaign_resource(self.label), related=related if self.flow_run_id else None,
                   payload={"campaign": self.run.cfg.name, "attempt": self.attempt, **payload})

    @_best_effort
    def _round_event(self, round_no: int) -> None:
        self._event(ROUND_EVENT, round=round_no, rounds=self.run.cfg.rounds)

    @_best_effort
    def _write_round(self, round_no: int, rows: list[dict[str, Any]], tags: list[str], description: str) -> None:
        if self.flow_run_id:
            self._tag(*tags)
        if self._progress_id is not None:
            update_progress_artifact(self._progress_id, self._percent(round_no, self.run.cfg.rounds),
                                     description=description)
        self._table(rows)

    def _table(self, rows: list[dict[str, Any]]) -> None:
        """The rounds' table: made once, then its data replaced (one card, not one per update)."""
        if self._table_id is None:
            self._table_id = create_table_artifact(
                rows, key=self.key("rounds"),
                description=f"campaign {self.label}: metrics of each round (MLflow run {self.run.tracker.run_id})")
            return
        with get_client(sync_client=True) as client:
            client.update_artifact(self._table_id, ArtifactUpdate(data=json.dumps(rows)))  # as create_table_artifact stores it

    def rows(self) -> list[dict[str, Any]]:
        """One row per round done, and round 0 (before the rounds: its held-out accuracy):
        ``COLUMNS`` from the MLflow run's metrics of that step."""
        history = self.run.tracker.history
        done = [r for r in sorted(history) if r >= 1 and any(f"time/{s.value}_s" in history[r] for s in ROUND)]
        cfg = self.run.cfg
        episodes = EPISODE_COLUMNS if cfg.workflows() != {"single_turn"} else {}
        columns = {**COLUMNS, **episodes, **taskset_columns(cfg)}
        return [{"round": r, **{col: _cell(history.get(r, {}).get(key)) for col, key in columns.items()},
                 **({"answers": self._answers_link(r)} if cfg.eval.shown_answers else {})}
                for r in ([0] if 0 in history else []) + done]

    def _answers_link(self, round_no: int) -> str:
        """Where the round's evaluation shows its answers (``eval.shown_answers``): the MLflow table's
        page, or its artifact path in the run without an MLflow UI; "" for a round not evaluated here."""
        tracker = self.run.tracker
        paths = self.run.answers_shown.get(round_no, [])
        return " ".join(artifact_url(self.ui, tracker.experiment_id, tracker.run_id, p) if self.ui else p for p in paths)

    @_best_effort
    def summary(self, summary: dict[str, Any] | None = None, stopped: str | None = None) -> None:
        """The end: the summary's key figures, or ``stopped`` (why it ended early), with links."""
        self._writer.shutdown()  # waits for the rounds' updates: the last table comes before the summary
        run = self.run
        self._event(ENDED_EVENT, outcome="stopped" if stopped else "finished")
        version = run.state.model_version if summary else None
        run_link, model_link = mlflow_links(self.ui, run.tracker.uri, run.tracker.experiment_id, run.tracker.run_id,
                                            run.cfg.tracking.registered_model, version)
        lines = [f"# Campaign `{run.cfg.name}` ({self.label}, attempt {self.attempt})", ""]
        if stopped:
            lines += [f"**Stopped:** {stopped}", ""]
        lines += ["| | |", "| --- | --- |", f"| MLflow | {run_link} |"]
        if self.ui:
            lines.append(f"| experiment | [{run.cfg.tracking.experiment}]"
                         f"({experiment_url(self.ui, run.tracker.experiment_id)}) (every campaign's runs) |")
        if model_link:
            lines.append(f"| model | {model_link} |")
        if summary and summary.get("promotion"):
            lines.append(f"| promotion | {summary['promotion']} |")
        before, after = run.accuracy_before, run.accuracy_last
        if before is not None:
            lines.append(f"| held-out accuracy | {before:.3f} → {after:.3f} |")
        rounds_done = run.state.rounds_done or 0
        lines.append(f"| rounds | {rounds_done} of {run.cfg.rounds} |")
        if summary:
            lines += [f"| wall time | {summary['wall_seconds']:.0f} s |",
                      f"| attempts | {summary['attempts']} (resumed from round {summary['resumed_from_round']})"
                      if summary["resumed_from_round"] is not None else f"| attempts | {summary['attempts']} |",
                      f"| store | `{summary['store_url']}` |", f"| validation report | `{summary['validation_report']}` |"]
        create_markdown_artifact("\n".join(lines) + "\n", key=self.key("summary"),
                                 description=f"campaign {self.label}: " + ("stopped" if stopped else "summary"))
        if self.flow_run_id:  # the final tags: where it ended, and the registered model
            self._tag(*self._progress(rounds_done))
        self._mlflow_progress(("stopped at " if stopped else "finished, ") + ", ".join(self._progress(rounds_done)),
                              None, last=True)


def _cell(value: float | None) -> float | str:
    return "" if value is None else round(value, 4)
