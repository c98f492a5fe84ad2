"""The ``rft_campaign`` flow: a campaign's schedule (``components.campaign.schedule``: prepare, the
warm start, rounds of explore → verify → buffer → train → sync, held-out evaluation every k rounds,
a checkpoint every ``checkpoint.every`` rounds, the final model registered and promoted) walked as
Prefect task runs, one per step or one per round (or k rounds), as the config's ``orchestration``
section and ``TaskRunPlan`` decide (``flows.orchestration``).

Durable: a campaign whose run dir holds an unfinished attempt resumes from its newest checkpoint
(``components.campaign.run``), a finished one is left as it is, and a Prefect retry of the flow
resumes the same way. SIGINT/SIGTERM or a cancel of the flow run stop it after the current step.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import Task, flow, get_run_logger, runtime
from prefect.states import Cancelled, Completed, Failed, State

from rftflow.components.buffer.shards import ShardError
from rftflow.components.buffer.store import StoreUnavailable
from rftflow.components.config import ConfigError, Mode
from rftflow.components.data.contracts import ContractError
from rftflow.components.campaign.preflight import Preflight, campaign_label, preflight
from rftflow.components.campaign.run import CampaignRun, NoUsableCheckpoint, move_aside
from rftflow.components.campaign.schedule import Planned, Step
from rftflow.components.campaign.state import FinishedMeanwhile
from rftflow.components.stopping import StopFlag, StopRequested
from rftflow.flows.monitor import UIMonitor
from rftflow.flows.orchestration import OrchestrationConfig, Rounds, TaskRunPlan, orchestration_of
from rftflow.flows.progress import CampaignProgress
from rftflow.tasks import stages


CANCEL_POLL_SECONDS = 2.0  # how often a running campaign reads its flow run's state (a cancel in Prefect)


class _TaskEndLines(logging.Filter):
    """Prefect's lines at a task run's end, made to say each thing once: a task run cancelled because
    the campaign was asked to stop (Ctrl-C, a cancel) is what the user asked for, INFO not ERROR;
    "Task run failed with state: …" (with an empty traceback, ``NoneType: None``) is dropped, as the
    "Finished in state Failed(…)" line after it says the same."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.ERROR:
            return True
        message = record.getMessage()
        if message.startswith("Task run failed with state:"):
            return False
        if message.startswith("Finished in state Cancelled("):
            record.levelno, record.levelname = logging.INFO, "INFO"
            return logging.getLogger(record.name).isEnabledFor(logging.INFO)
        return True


def _quiet_task_ends() -> None:
    logger = logging.getLogger("prefect.task_runs")
    if not any(isinstance(f, _TaskEndLines) for f in logger.filters):
        logger.addFilter(_TaskEndLines())


def _date() -> str:
    """The flow run's scheduled day (today, outside a scheduled run), for ``{date}`` templates."""
    scheduled = runtime.flow_run.scheduled_start_time
    return (scheduled or datetime.now(timezone.utc)).strftime("%Y-%m-%d")


def _filled(text: str | None) -> str | None:
    return None if text is None else text.replace("{date}", _date())


def _flow_run_url() -> str | None:
    """The flow run's page in the Prefect UI; None on the embedded API (its server ends with the run)."""
    from prefect.settings import PREFECT_UI_URL

    ui = PREFECT_UI_URL.value()
    if not os.environ.get("PREFECT_API_URL") or not ui:
        return None
    return f"{ui.rstrip('/')}/runs/flow-run/{runtime.flow_run.id}"


def _flow_run_name() -> str:
    """The campaign's name (a ``name=`` override, else the mapping's name or the YAML file's stem),
    the day and a short hash of its run dir: ``arith-mix-2026-11-23-3f2a1c`` (two campaigns of one
    name in two run dirs differ; ``UIMonitor`` adds the attempt once it is known)."""
    params = runtime.flow_run.parameters
    name = None
    for assignment in params.get("overrides") or []:
        key, _, value = assignment.partition("=")
        name = _filled(value.strip()) if key.strip() == "name" else name
    config = params["config"]
    name = name or (str(config.get("name", "campaign")) if isinstance(config, dict) else Path(config).stem)
    run_dir = _filled(params.get("run_dir")) or str(Path("runs") / name)
    dated = name if name.endswith(_date()) else f"{name}-{_date()}"
    return f"{dated}-{campaign_label(name, run_dir).rsplit('-', 1)[1]}"


NOTHING_TO_DO = "nothing to do; --restart runs it again"


def summary_line(checked: Preflight) -> str:
    """One line on a finished campaign found in the run dir."""
    state = checked.previous
    ended = state.attempt.ended_at if state.attempts else state.updated_at
    accuracy = state.evals.get(str(checked.cfg.rounds))
    return (f"campaign {state.campaign} in {checked.run_dir} finished at {ended} ({checked.cfg.rounds} rounds"
            + (f", held-out accuracy {accuracy:.3f}" if accuracy is not None else "")
            + (f", model {checked.cfg.tracking.registered_model} v{state.model_version}" if state.model_version else "")
            + f"): {NOTHING_TO_DO}")


def _nothing_to_do(checked: Preflight) -> State:
    """Completed with ``summary_line`` as its message and the summary written at the end as its data."""
    summary_file = checked.run_dir / "summary.json"
    return Completed(message=summary_line(checked),
                     data=json.loads(summary_file.read_text()) if summary_file.is_file() else None)


# What a second SIGINT or SIGTERM does while the campaign stops: a command sets it (``rftflow run``:
# its one line, exit 130 at once); None, as from Python, raises ``KeyboardInterrupt``.
AT_ONCE: Callable[[int], None] | None = None
# A signal this soon after the first is the same stop: a launcher (``accelerate launch``, torchrun, the
# one ``trainer.processes`` starts) passes the terminal's Ctrl-C on to its processes, which the terminal
# signalled already, within milliseconds; a person's second Ctrl-C comes later
SAME_STOP_SECONDS = 1.0


@contextmanager
def stop_on_signals(stop: StopFlag) -> Iterator[None]:
    """SIGINT and SIGTERM ask the campaign to stop at its next safe point; a second one (past
    ``SAME_STOP_SECONDS``) stops at once (``AT_ONCE``). With ``AT_ONCE`` set, a stopping campaign
    leaves its handlers in place, so a signal during the rest of the shutdown stops at once too."""
    first = math.inf  # when the first signal came

    def request(signum, _frame) -> None:
        nonlocal first
        if first == math.inf:
            first = time.monotonic()
            stop.reason = stop.reason or signal.Signals(signum).name  # (or a cancel in Prefect came first)
            return
        if time.monotonic() - first < SAME_STOP_SECONDS:
            return
        if AT_ONCE is not None:
            AT_ONCE(signum)
        raise KeyboardInterrupt

    try:
        previous = {s: signal.signal(s, request) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: Prefect's own cancellation applies
        yield
        return
    try:
        yield
    finally:
        if not (stop.reason and AT_ONCE is not None):
            for s, handler in previous.items():
                signal.signal(s, handler)


@contextmanager
def stop_on_cancel(stop: StopFlag, flow_run_id: str | None) -> Iterator[None]:
    """A cancel of this flow run in Prefect (the UI's Cancel button, ``prefect flow-run cancel``)
    asks the campaign to stop at its next safe point, as Ctrl-C does. Prefect itself acts on a
    cancel only for the flow runs a worker or runner started (it signals their process); one called
    in a process of its own (``rftflow run``) is watched here: its state is read every
    ``CANCEL_POLL_SECONDS`` by a thread (one small API call; a failed read is tried again)."""
    if not flow_run_id:
        yield
        return
    from prefect import get_client

    done = threading.Event()

    def watch() -> None:
        with get_client(sync_client=True) as client:
            while not done.wait(CANCEL_POLL_SECONDS):
                try:
                    state = client.read_flow_run(flow_run_id).state
                except Exception:  # noqa: BLE001 — the API busy or restarting: the next read tells
                    continue
                if state is not None and (state.is_cancelling() or state.is_cancelled()):
                    stop.reason = stop.reason or "cancelled in Prefect"
                    return

    # in this context: its settings name the API the flow run reports to (a bare thread's would not)
    watcher = threading.Thread(target=contextvars.copy_context().run, args=(watch,), name="rftflow-cancel-watch",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=5)


def task_of(run: CampaignRun, unit: Planned | Rounds) -> tuple[Task, tuple]:
    """The task that runs ``unit`` and its arguments: a step's own task (made from its row of the
    step table), or ``rounds`` for a task run of rounds."""
    if isinstance(unit, Rounds):
        return stages.rounds, (run, unit.first, unit.last)
    return stages.task_of(unit.step), (run, unit.round)


def _call(run: CampaignRun, unit: Planned | Rounds) -> dict:
    """``unit`` as its task run; its result, or it raises what failed or stopped it. Called for its
    result: ``return_state=True`` and then ``State.result()`` would read the result back through
    Prefect's result machinery, a cost per task run."""
    task, args = task_of(run, unit)
    result = task(*args)
    if isinstance(result, State):  # the step returned Failed or Cancelled with its one line: raise its exception
        result.result()
    return result


def _run_lanes(run: CampaignRun, phase: list[list[Planned]]) -> None:
    """Submit each lane's steps as a chain of task runs (each waits for the one before) and wait for
    all lanes; raises the first failure."""
    ends = []
    for lane in phase:
        previous = None
        for planned in lane:
            task, args = task_of(run, planned)
            previous = task.submit(*args, wait_for=[previous] if previous else None)
        ends.append(previous)
    for end in ends:
        end.result()


def _round_ends(phases: list) -> dict[int, Planned | Rounds]:
    """Each round's last unit (its evaluation or checkpoint, if due): the UI's table then has them."""
    ends = {}
    for phase in phases:
        for lane in phase:
            for unit in lane:
                if isinstance(unit, Rounds):
                    ends.update({r: unit for r in range(unit.first, unit.last + 1)})
                elif unit.round and unit.step not in (Step.REGISTER, Step.PROMOTE):
                    ends[unit.round] = unit
    return ends


def _stop_if_asked(run: CampaignRun, last: Planned | Rounds | None) -> None:
    """``StopRequested`` naming the step just done when a stop was asked for (None: before any step)."""
    if run.stop_requested:
        after = ("before its first step" if last is None else
                 f"after round {min(last.last, run.state.rounds_done)}" if isinstance(last, Rounds)
                 else f"after round {last.round} {last.step.value}")
        raise StopRequested(f"stopped ({run.stop_requested}) {after}")


def _stopped_line(run: CampaignRun, error: StopRequested) -> str:
    """The one line of a stopped campaign: where it stopped and where the same command resumes."""
    warm = run.campaign.warm.step if run.campaign.warm else None
    resume = (f"the checkpoint of round {run.state.checkpoint_round}" if run.state.checkpoint_round is not None
              and run.campaign.has_trainer else "its newest round" if not run.campaign.has_trainer
              else f"step {warm} of the warm start" if warm is not None else "the start")
    return f"campaign {run.cfg.name} {error}; resume with the same command (from {resume})"


def _mark_crashed(run: CampaignRun) -> None:
    """Flow runs of attempts that were killed (they never recorded an end) still say Running in
    Prefect: mark them Crashed, naming the flow run that resumes them."""
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        for attempt in run.killed:
            if not attempt.flow_run_id:
                continue
            try:
                flow_run = client.read_flow_run(attempt.flow_run_id)
            except Exception:  # noqa: BLE001 — a run on another Prefect server: nothing to mark here
                continue
            if flow_run.state is not None and not flow_run.state.is_final():
                client.set_flow_run_state(attempt.flow_run_id, Crashed(
                    message=f"its process was killed; flow run {run.flow_run_id} resumed the campaign"), force=True)


# A campaign its caller in this process checked already (``handing_over``), with its ``restart`` and
# its orchestration section if checked too
_HANDED_OVER: tuple[Preflight, bool, OrchestrationConfig | None] | None = None


@contextmanager
def handing_over(checked: Preflight, restart: bool = False,
                 settings: OrchestrationConfig | None = None) -> Iterator[None]:
    """Within: ``rft_campaign`` called for this very campaign (``checked.cfg`` as JSON, its run dir,
    no overrides, the same ``restart``) takes ``checked`` instead of checking it again, and
    ``settings`` as its orchestration section (``orchestration_of``'s; None: the flow checks it).
    The CLI and ``rftflow.run_campaign`` check before any server starts, then call the flow in here;
    any other call (a deployment's run: a YAML path and overrides) is checked where it enters, in the flow."""
    global _HANDED_OVER
    previous, _HANDED_OVER = _HANDED_OVER, (checked, restart, settings)
    try:
        yield
    finally:
        _HANDED_OVER = previous


def _checked(config: dict[str, Any] | str, run_dir: str | None, overrides: list[str],
             restart: bool) -> tuple[Preflight, OrchestrationConfig]:
    """The flow's parameters checked once, and the orchestration section: what ``handing_over`` gave
    for this campaign, else ``preflight`` and ``orchestration_of``."""
    if _HANDED_OVER is not None and not overrides and isinstance(config, dict):
        checked, checked_restart, settings = _HANDED_OVER
        if (checked_restart == restart and run_dir is not None and Path(run_dir).resolve() == checked.run_dir
                and config == checked.cfg.model_dump(mode="json")):
            return checked, settings or orchestration_of(checked.cfg)
    checked = preflight(config, run_dir, overrides, restart=restart)
    return checked, orchestration_of(checked.cfg)


@flow(name="rft_campaign", flow_run_name=_flow_run_name)
def rft_campaign(config: dict[str, Any] | str, run_dir: str | None = None, overrides: list[str] | None = None,
                 restart: bool = False, show_progress: bool = False) -> dict[str, Any] | State:
    """Run one campaign into ``run_dir`` (default ``runs/<name>``), or resume it; returns (and
    writes) its summary.

    ``config`` is a campaign config mapping, or the path of a campaign YAML file; ``overrides``
    are ``key.path=value`` strings (``--set``); ``{date}`` in ``run_dir`` and ``overrides`` is the
    run's scheduled day (each night's campaign gets its own name and run dir). ``restart`` moves an
    existing campaign aside and starts over. Bad input fails in ``preflight`` before any work: the
    flow run ends Failed with its one-line reason (a direct call raises it); a caller that checked
    the campaign already hands it over (``handing_over``) instead. A retry of the flow
    resumes from the newest checkpoint (``rft_campaign.with_options(retries=n)``, or a deployment's).
    Bad data (a contract past its threshold) and a store down past ``storage.outage_seconds`` end
    it Failed with their one line; the same command resumes it once they are fixed.
    """
    overrides = [_filled(o) for o in overrides or []]
    try:
        checked, settings = _checked(config, _filled(run_dir), overrides, restart)
    except (ConfigError, StoreUnavailable) as e:
        return Failed(message=str(e), data=e)
    if checked.cfg.mode == Mode.BENCH:
        state = stages.bench(checked, return_state=True)
        return state.result() if state.is_completed() else Failed(message=state.message)
    if checked.finished:
        return _nothing_to_do(checked)
    if restart:
        move_aside(checked)
    stop = StopFlag()
    _quiet_task_ends()
    flow_run_id = str(runtime.flow_run.id or "") or None
    with stop_on_signals(stop), stop_on_cancel(stop, flow_run_id):
        try:  # refused while another attempt holds the campaign; fails when no checkpoint is whole
            run = CampaignRun(checked, flow_run_id=flow_run_id, flow_run_url=_flow_run_url(), stop=stop)
        except (ConfigError, NoUsableCheckpoint, StoreUnavailable) as e:
            return Failed(message=str(e), data=e)
        except FinishedMeanwhile as e:  # another start finished it while this one loaded
            return _nothing_to_do(replace(checked, previous=e.state))
        _mark_crashed(run)
        monitor = UIMonitor(run, flow_run_id)
        try:
            summary = _walk(run, TaskRunPlan(settings, run.cfg.mode, run.stages), monitor, show_progress)
        except StopRequested as e:
            line = _stopped_line(run, e)
            _ended_early(run, monitor, "interrupted", line)
            return Cancelled(message=line, data=StopRequested(line))
        except (ContractError, StoreUnavailable, ShardError) as e:  # one line is the whole story
            _ended_early(run, monitor, "failed", str(e), store_reachable=not isinstance(e, StoreUnavailable))
            return Failed(message=str(e), data=e)
        except BaseException as e:
            _ended_early(run, monitor, "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            raise
    return summary


def _walk(run: CampaignRun, plan: TaskRunPlan, monitor: UIMonitor, show_progress: bool) -> dict[str, Any]:
    """Every step left (``run.phases``, the schedule), as task runs as ``plan`` cuts them; the summary."""
    with CampaignProgress(run.cfg, enabled=show_progress) as progress:
        _stop_if_asked(run, None)  # asked while the campaign was loading

        def warmup_step(step: int, metrics: dict[str, float]) -> None:  # the warm start's progress, terminal and UIs
            progress.warmup(step, metrics)
            monitor.warmup(step, metrics)

        run.on_warmup_step = warmup_step
        first_round = run.rounds_left.start
        phases = plan.cut(list(run.phases()))
        round_ends = _round_ends(phases)
        done = 0
        while done < len(phases):
            phase = phases[done]
            done += 1
            if len(phase) > 1:  # lanes at once (mode async): each a chain of task runs
                _run_lanes(run, phase)
                continue
            for unit in phase[0]:
                rounds = range(unit.first, unit.last + 1) if isinstance(unit, Rounds) else range(unit.round, unit.round + 1)
                starts_rounds = rounds.start == first_round and (isinstance(unit, Rounds) or unit.step == run.stages[0])
                if starts_rounds:  # the first round of this attempt
                    progress.start_rounds(run.accuracy_before, done=first_round - 1)
                    monitor.start(rounds_done=first_round - 1)
                started = time.perf_counter()
                _call(run, unit)
                chosen = isinstance(unit, Planned) and plan.measured(unit, time.perf_counter() - started, run.step_seconds)
                if chosen:  # task_runs auto decided
                    line, metrics = chosen
                    get_run_logger().info(line)
                    run.tracker.log_metrics(metrics, step=unit.round, defer=True)
                    phases[done:] = plan.cut(phases[done:])
                    round_ends = _round_ends(phases)
                if isinstance(unit, Rounds):  # a task run of rounds stops early when asked to
                    rounds = range(rounds.start, min(rounds.stop, run.state.rounds_done + 1))
                for r in rounds:
                    if isinstance(unit, Rounds) or unit.step == run.stages[-1]:  # the round's last stage is done
                        progress.round_done(r, run.last_reward, run.accuracy_last)
                    if round_ends.get(r) == unit:
                        monitor.round_done(r)
                _stop_if_asked(run, unit)
    summary = run.finish(task_runs=plan.granularity, rounds_per_task_run=plan.rounds_per_task_run)
    monitor.summary(summary)
    return summary


def _ended_early(run: CampaignRun, monitor: UIMonitor, outcome: str, line: str, store_reachable: bool = True) -> None:
    """A campaign that stopped before its end: the validation report, the attempt's end in the
    state and MLflow, and the reason in the Prefect UI."""
    run.validation_report(store_reachable=store_reachable)
    run.end(outcome, line, store_reachable=store_reachable)
    monitor.summary(stopped=line)
