"""The ``rft_campaign`` flow: prepare, (warm start), then rounds of explore → verify → buffer →
train → sync (``components.campaign.ROUND``), held-out evaluation every k rounds, and the final
model registered in MLflow."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, runtime
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed, State

from components.campaign import ROUND, Campaign
from components.config import ConfigError
from components.data.report import validation_report
from components.preflight import preflight
from components.tracking import Tracker
from flows.progress import CampaignProgress
from tasks.register import register
from tasks.stages import ROUND_TASKS, evaluate, prepare, warm_start


def _summary_markdown(summary: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items())
    return f"# Campaign `{summary['campaign']}`\n\n| key | value |\n| --- | --- |\n{rows}\n"


def _flow_run_name() -> str:
    """The campaign's name: a ``name=`` override, else the config mapping's name or the YAML file's stem."""
    params = runtime.flow_run.parameters
    for assignment in reversed(params.get("overrides") or []):
        key, _, value = assignment.partition("=")
        if key.strip() == "name":
            return value.strip()
    config = params["config"]
    return str(config.get("name", "campaign")) if isinstance(config, dict) else Path(config).stem


def _validation_report(campaign: Campaign, tracker: Tracker, out: Path) -> tuple[Path, str]:
    """Write ``<run dir>/validation/validation.md`` and log it to the MLflow run; (path, artifact URI)."""
    path = out / "validation" / "validation.md"
    path.parent.mkdir(exist_ok=True)
    path.write_text(validation_report(campaign.validation_entries(), campaign.cfg.name))
    return path, tracker.log_artifacts(path.parent, "validation")


@flow(name="rft_campaign", flow_run_name=_flow_run_name)
def rft_campaign(config: dict[str, Any] | str, run_dir: str | None = None, overrides: list[str] | None = None,
                 show_progress: bool = False) -> dict[str, Any] | State:
    """Run one campaign into ``run_dir`` (default ``runs/<name>``); returns (and writes) its summary.

    ``config`` is a campaign config mapping, or the path of a campaign YAML file; ``overrides``
    are ``key.path=value`` strings (``--set``). Bad input fails in ``preflight``, before any work:
    the flow run ends Failed with its one-line reason (no traceback), and a direct call raises it.
    """
    try:
        checked = preflight(config, run_dir, overrides or ())
    except ConfigError as e:
        return Failed(message=str(e), data=e)
    cfg, out = checked.cfg, checked.run_dir
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    flow_run_id = str(runtime.flow_run.id or "")
    tracker = Tracker(checked.tracking_uri, cfg.tracking.experiment, cfg.name, artifact_root=out / "mlartifacts",
                      tags={"campaign": cfg.name, "prefect.flow_run_id": flow_run_id})
    try:
        tracker.log_params(cfg.model_dump(mode="json"))
        campaign = Campaign(cfg, out)
        with CampaignProgress(cfg, enabled=show_progress) as progress:
            prepare(campaign, tracker)
            warm_start(campaign, tracker, cfg.trainer.warmup_steps, progress.warmup)
            before = evaluate(campaign, tracker, 0)["eval/accuracy"]
            progress.start_rounds(before)
            after, last = before, {}
            for r in range(1, cfg.rounds + 1):
                last = {}
                for stage in ROUND:
                    last |= ROUND_TASKS[stage](campaign, tracker, r)
                if r % cfg.eval.every == 0 or r == cfg.rounds:
                    after = evaluate(campaign, tracker, r)["eval/accuracy"]
                progress.round_done(r, last.get("reward/mean", float("nan")), after)
        tags = {"campaign": cfg.name, "eval_accuracy": f"{after:.4f}", "prefect.flow_run_id": flow_run_id}
        model = register(campaign, tracker, tags)
        report, report_uri = _validation_report(campaign, tracker, out)
        summary = {
            "campaign": cfg.name, "eval_accuracy_before": before, "eval_accuracy_after": after,
            "rounds": cfg.rounds, "reward_mean_last_round": last.get("reward/mean"),
            "wall_seconds": round(time.perf_counter() - started, 1), "mlflow_tracking_uri": checked.tracking_uri,
            "mlflow_run_id": tracker.run_id, **model, "store_url": campaign.store.url,
            "prefect_flow_run_id": flow_run_id, "run_dir": str(out), "validation_report": str(report),
            "validation_report_mlflow": report_uri,
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        tracker.log_metrics({"eval/accuracy_before": before, "eval/accuracy_after": after}, step=cfg.rounds)
        create_markdown_artifact(_summary_markdown(summary), key=re.sub(r"[^a-z0-9-]+", "-", f"{cfg.name.lower()}-summary"),
                                 description="rftflow campaign summary")
    except BaseException:
        if "campaign" in locals():  # what was checked before the failure (e.g. a batch past the contract threshold)
            _validation_report(campaign, tracker, out)
        tracker.finish("FAILED")
        raise
    tracker.finish()
    return summary
