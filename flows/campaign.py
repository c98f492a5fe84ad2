"""The ``rft_campaign`` flow: prepare, (warm start), then rounds of explore → verify → buffer →
train → sync (``components.campaign.ROUND``), held-out evaluation every k rounds, a checkpoint
every ``checkpoint.every`` rounds, and the final model registered in MLflow. Each step is a task
run; with ``task_runs: auto`` the rounds after the first are one task run per k rounds when
Prefect's share of the first round was over ``task_runs_max_share`` (``CampaignRun.task_run_done``
chooses k, ``grouped_by_round`` groups them).

Durable: a campaign whose run dir holds an unfinished attempt resumes from its newest checkpoint
(``components.run``), a finished one is left as it is, and a Prefect retry of the flow resumes the
same way. SIGINT/SIGTERM stop it after the current stage.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, runtime
from prefect.states import Cancelled, Completed, Failed, State

from rftflow.components.buffer.shards import ShardError
from rftflow.components.buffer.store import StoreUnavailable
from rftflow.components.campaign.stages import StopFlag, StopRequested
from rftflow.components.config import ConfigError
from rftflow.components.data.contracts import ContractError
from rftflow.components.campaign.preflight import Preflight, preflight
from rftflow.components.campaign.run import CampaignRun, NoUsableCheckpoint, grouped_by_round, move_aside
from rftflow.flows.monitor import UIMonitor
from rftflow.flows.progress import CampaignProgress
from rftflow.tasks.stages import TASKS, bench


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
    """The campaign's name (a ``name=`` override, else the mapping's name or the YAML file's stem)
    and the day: ``arith-mix-2026-11-23``."""
    params = runtime.flow_run.parameters
    name = None
    for assignment in params.get("overrides") or []:
        key, _, value = assignment.partition("=")
        name = _filled(value.strip()) if key.strip() == "name" else name
    config = params["config"]
    name = name or (str(config.get("name", "campaign")) if isinstance(config, dict) else Path(config).stem)
    return name if name.endswith(_date()) else f"{name}-{_date()}"


def summary_line(checked: Preflight) -> str:
    """One line on a finished campaign found in the run dir."""
    state = checked.previous
    ended = state.attempt.ended_at if state.attempts else state.updated_at
    accuracy = state.evals.get(str(checked.cfg.rounds))
    return (f"campaign {state.campaign} in {checked.run_dir} finished at {ended} ({checked.cfg.rounds} rounds"
            + (f", held-out accuracy {accuracy:.3f}" if accuracy is not None else "")
            + (f", model {checked.cfg.tracking.registered_model} v{state.model_version}" if state.model_version else "")
            + "): nothing to do; --restart runs it again")


@contextmanager
def stop_on_signals(stop: StopFlag) -> Iterator[None]:
    """SIGINT and SIGTERM ask the campaign to stop at its next safe point (a second one stops at once)."""
    def request(signum, _frame) -> None:
        if stop.reason:
            raise KeyboardInterrupt
        stop.reason = signal.Signals(signum).name

    try:
        previous = {s: signal.signal(s, request) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: Prefect's own cancellation applies
        yield
        return
    try:
        yield
    finally:
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


def _step(run: CampaignRun, name: str, round_no: int, last: int) -> dict:
    """Step ``name`` of round ``round_no`` (``round``: rounds ``round_no`` to ``last``) as its task
    run; its result, or it raises what failed it. Called for its result: ``return_state=True`` and
    then ``State.result()`` would read the result back through Prefect's result machinery, a
    cost per task run."""
    result = TASKS[name](run, round_no, last) if name == "round" else TASKS[name](run, round_no)
    if isinstance(result, State):  # the step returned Failed with its one line: raise its exception
        result.result()
    return result


def _task_runs_of(lane: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """A lane's steps as task runs, (step, round, last round): a lane of rounds (``grouped_by_round``
    makes one of consecutive rounds) is one task run, any other step its own."""
    if lane[0][0] == "round":
        return [("round", lane[0][1], lane[-1][1])]
    return [(name, round_no, round_no) for name, round_no in lane]


def _run_lanes(run: CampaignRun, phase: list[list[tuple[str, int]]]) -> None:
    """Submit each lane's steps as a chain of task runs (each waits for the one before) and wait for
    all lanes; raises the first failure."""
    ends = []
    for lane in phase:
        previous = None
        for name, round_no in lane:
            previous = TASKS[name].submit(run, round_no, wait_for=[previous] if previous else None)
        ends.append(previous)
    for end in ends:
        end.result()


def _cut(run: CampaignRun, phases: list) -> list:
    """``phases`` as task runs will run them: with task runs per round, ``run.rounds_per_task_run``
    consecutive rounds a task run (``grouped_by_round``); else as they are."""
    return grouped_by_round(phases, run.round_stages, run.rounds_per_task_run) if run.task_runs == "round" else phases


def _round_ends(phases: list) -> dict[int, tuple[str, int]]:
    """Each round's last step (its evaluation or checkpoint, if due): the UI's table then has them."""
    return {r: (n, r) for phase in phases for lane in phase for n, r in lane if r and n not in ("register", "promote")}


def _stop_if_asked(run: CampaignRun, round_no: int, stage: str | None) -> None:
    """``StopRequested`` naming the step just done when a stop was asked for (None: before any step)."""
    if run.stop_requested:
        after = ("before its first step" if stage is None else f"after round {round_no}" if stage == "round"
                 else f"after round {round_no} {stage}")
        raise StopRequested(f"stopped ({run.stop_requested}) {after}")


def _stopped_line(run: CampaignRun, error: StopRequested) -> str:
    """The one line of a stopped campaign: where it stopped and where the same command resumes."""
    resume = (f"the checkpoint of round {run.state.checkpoint_round}" if run.state.checkpoint_round is not None
              and run.campaign.has_trainer else "its newest round" if not run.campaign.has_trainer else "the start")
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


@flow(name="rft_campaign", flow_run_name=_flow_run_name)
def rft_campaign(config: dict[str, Any] | str, run_dir: str | None = None, overrides: list[str] | None = None,
                 restart: bool = False, show_progress: bool = False) -> dict[str, Any] | State:
    """Run one campaign into ``run_dir`` (default ``runs/<name>``), or resume it; returns (and
    writes) its summary.

    ``config`` is a campaign config mapping, or the path of a campaign YAML file; ``overrides``
    are ``key.path=value`` strings (``--set``); ``{date}`` in ``run_dir`` and ``overrides`` is the
    run's scheduled day (each night's campaign gets its own name and run dir). ``restart`` moves an
    existing campaign aside and starts over. Bad input fails in ``preflight`` before any work: the
    flow run ends Failed with its one-line reason (a direct call raises it). A retry of the flow
    resumes from the newest checkpoint (``rft_campaign.with_options(retries=n)``, or a deployment's).
    Bad data (a contract past its threshold) and a store down past ``storage.outage_seconds`` end
    it Failed with their one line; the same command resumes it once they are fixed.
    """
    overrides = [_filled(o) for o in overrides or []]
    try:
        checked = preflight(config, _filled(run_dir), overrides, restart=restart)
    except ConfigError as e:
        return Failed(message=str(e), data=e)
    if checked.cfg.mode == "bench":
        state = bench(checked, return_state=True)
        return state.result() if state.is_completed() else Failed(message=state.message)
    if checked.finished:
        summary_file = checked.run_dir / "summary.json"
        return Completed(message=summary_line(checked),
                         data=json.loads(summary_file.read_text()) if summary_file.is_file() else None)
    if restart:
        move_aside(checked)
    stop = StopFlag()
    _quiet_task_ends()
    flow_run_id = str(runtime.flow_run.id or "") or None
    with stop_on_signals(stop), stop_on_cancel(stop, flow_run_id):
        try:  # refused while another attempt holds the campaign; fails when no checkpoint is whole
            run = CampaignRun(checked, flow_run_id=flow_run_id, flow_run_url=_flow_run_url(), stop=stop)
        except (ConfigError, NoUsableCheckpoint) as e:
            return Failed(message=str(e), data=e)
        _mark_crashed(run)
        monitor = UIMonitor(run)
        try:
            summary = _walk(run, monitor, show_progress)
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


def _walk(run: CampaignRun, monitor: UIMonitor, show_progress: bool) -> dict[str, Any]:
    """Every step left, as task runs, in order; the summary."""
    with CampaignProgress(run.cfg, enabled=show_progress) as progress:
        _stop_if_asked(run, 0, None)  # asked while the campaign was loading
        run.on_warmup_step = progress.warmup
        first = run.round_steps[0]
        phases = _cut(run, list(run.phases()))
        round_ends = _round_ends(phases)
        done = 0
        while done < len(phases):
            phase = phases[done]
            done += 1
            if len(phase) > 1:  # lanes at once (mode async): each a chain of task runs
                _run_lanes(run, phase)
                continue
            for name, round_no, last in _task_runs_of(phase[0]):
                if name == first and round_no == run.rounds_left.start:  # the first round of this attempt
                    progress.start_rounds(run.accuracy_before, done=round_no - 1)
                    monitor.start(rounds_done=round_no - 1)
                started = time.perf_counter()
                _step(run, name, round_no, last)
                chosen = run.task_run_done(name, round_no, time.perf_counter() - started)
                if chosen:  # task_runs auto decided
                    get_run_logger().info(chosen)
                    phases[done:] = _cut(run, phases[done:])
                    round_ends = _round_ends(phases)
                if name == "round":  # a task run of rounds stops early when asked to
                    last = min(last, run.state.rounds_done)
                for r in range(round_no, last + 1):
                    if name in ("round", run.round_stages[-1]):  # the round's last stage is done
                        progress.round_done(r, run.last_reward, run.accuracy_last)
                    if round_ends.get(r) == (name, r):
                        monitor.round_done(r)
                _stop_if_asked(run, last, name)
    summary = run.finish()
    monitor.summary(summary)
    return summary


def _ended_early(run: CampaignRun, monitor: UIMonitor, outcome: str, line: str, store_reachable: bool = True) -> None:
    """A campaign that stopped before its end: the validation report, the attempt's end in the
    state and MLflow, and the reason in the Prefect UI."""
    run.validation_report(store_reachable=store_reachable)
    run.end(outcome, line, store_reachable=store_reachable)
    monitor.summary(stopped=line)
