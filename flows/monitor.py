"""What a campaign shows in the Prefect UI while it runs (the flow run's Artifacts tab):

- ``<campaign>-progress``: a progress artifact, rounds done out of ``rounds``;
- ``<campaign>-rounds``: a table artifact of per-round metrics (reward, loss, held-out accuracy,
  quarantined rows, seconds per stage), a new version with every progress update;
- ``<campaign>-summary``: a markdown summary at the end — or the one line on why it stopped —
  linking the MLflow run and the registered model version.

The table is read from the MLflow run's metrics (``Tracker.history``), so a resumed campaign shows
the rounds its earlier attempts did too. Both are updated after a round at most every
``UPDATE_SECONDS`` (and always after an evaluation and the last round): the table holds every
round, so rounds of a fraction of a second would otherwise store a growing table many times a
second. They are written by a background thread, so the next round does not wait on the Prefect
API for them (two calls); the summary waits for them first.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact
from prefect.artifacts import update_progress_artifact

from rftflow.components.campaign.schedule import ROUND, eval_due
from rftflow.components.campaign.run import CampaignRun
from rftflow.components.tracking import is_tracking_server

UPDATE_SECONDS = 5.0
# column → MLflow metric of the round (blank where a round has none: accuracy between evaluations)
COLUMNS = {"reward": "reward/mean", "loss": "loss/total", "accuracy": "eval/accuracy",
           "accepted": "contract/accepted", "quarantined": "contract/quarantined",
           **{f"{stage.value} s": f"time/{stage.value}_s" for stage in ROUND}}


def _best_effort(method):
    """The UI is a view: an artifact that cannot be written is a warning, never a failed campaign."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:  # noqa: BLE001
            logging.getLogger("rftflow").warning("Prefect UI artifact %s not written: %s", method.__name__, e)
    return wrapper


def artifact_key(campaign: str, what: str) -> str:
    """Prefect artifact keys take lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{campaign.lower()}-{what}")


def mlflow_links(tracking_uri: str, experiment_id: str, run_id: str, model: str | None,
                 version: str | None) -> tuple[str, str | None]:
    """Markdown for the MLflow run and model version: links on an MLflow server (``http(s)://``),
    else the ids and how to open the store in a browser (``rftflow up``)."""
    if is_tracking_server(tracking_uri):
        base = tracking_uri.rstrip("/")
        # workflowType: MLflow 3's UI opens in its GenAI view otherwise
        run = f"[run {run_id}]({base}/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning)"
        return run, f"[{model} v{version}]({base}/#/models/{model}/versions/{version})" if version else None
    hint = f" in `{tracking_uri}` (`rftflow up` serves it)"
    return f"run `{run_id}`{hint}", f"`models:/{model}/{version}`" if version else None


class UIMonitor:
    """The progress, table and summary artifacts of one flow run of ``run``."""

    def __init__(self, run: CampaignRun):
        self.run = run
        self.name = run.cfg.name
        self._progress_id = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="rftflow-ui")  # round artifacts, in order
        self._updated_at = -float("inf")  # when round_done last wrote them

    def _percent(self, rounds_done: int) -> float:
        return round(100.0 * rounds_done / self.run.cfg.rounds, 1)

    @_best_effort
    def start(self, rounds_done: int) -> None:
        """Before the first round of this attempt (``rounds_done`` by earlier attempts)."""
        self._progress_id = create_progress_artifact(
            self._percent(rounds_done), key=artifact_key(self.name, "progress"),
            description=f"campaign {self.name}: rounds done of {self.run.cfg.rounds}")

    def round_done(self, round_no: int) -> None:
        """The progress and the table as of ``round_no``, when due (see the module docstring),
        written in the background (in the flow run's context, so they belong to it)."""
        now = time.monotonic()
        due = round_no == self.run.cfg.rounds or eval_due(self.run.cfg, round_no)
        if not due and now - self._updated_at < UPDATE_SECONDS:
            return
        self._updated_at = now
        rows, context = self.rows(), contextvars.copy_context()
        self._writer.submit(context.run, self._write_round, round_no, rows)

    @_best_effort
    def _write_round(self, round_no: int, rows: list[dict[str, Any]]) -> None:
        if self._progress_id is not None:
            update_progress_artifact(self._progress_id, self._percent(round_no))
        create_table_artifact(rows, key=artifact_key(self.name, "rounds"),
                              description=f"campaign {self.name}: metrics of each round (MLflow run "
                                          f"{self.run.tracker.run_id})")

    def rows(self) -> list[dict[str, Any]]:
        """One row per round done: ``COLUMNS`` from the MLflow run's metrics of that step."""
        history = self.run.tracker.history
        return [{"round": r, **{col: _cell(history[r].get(key)) for col, key in COLUMNS.items()}}
                for r in sorted(history) if r >= 1 and any(f"time/{s.value}_s" in history[r] for s in ROUND)]

    @_best_effort
    def summary(self, summary: dict[str, Any] | None = None, stopped: str | None = None) -> None:
        """The end: the summary's key figures, or ``stopped`` (why it ended early), with links."""
        self._writer.shutdown()  # waits for the rounds' artifacts: the last table comes before the summary
        run = self.run
        version = run.state.model_version if summary else None
        run_link, model_link = mlflow_links(run.tracker.uri, run.tracker.experiment_id, run.tracker.run_id,
                                            run.cfg.tracking.registered_model, version)
        lines = [f"# Campaign `{self.name}`", ""]
        if stopped:
            lines += [f"**Stopped:** {stopped}", ""]
        lines += ["| | |", "| --- | --- |", f"| MLflow | {run_link} |"]
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
        create_markdown_artifact("\n".join(lines) + "\n", key=artifact_key(self.name, "summary"),
                                 description=f"campaign {self.name}: " + ("stopped" if stopped else "summary"))


def _cell(value: float | None) -> float | str:
    return "" if value is None else round(value, 4)
