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

import json
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, runtime
from prefect.states import Cancelled, Completed, Failed, State

from components.campaign import StopRequested
from components.config import ConfigError
from components.buffer.store import StoreUnavailable
from components.data.contracts import ContractError
from components.preflight import Preflight, preflight
from components.run import CampaignRun, grouped_by_round, move_aside
from flows.monitor import UIMonitor
from flows.progress import CampaignProgress
from tasks.stages import TASKS, bench


class Interrupted(Exception):
    """The campaign stopped at a safe point on SIGINT/SIGTERM; the message says how to resume."""


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
def stop_on_signals(run: CampaignRun) -> Iterator[None]:
    """SIGINT and SIGTERM ask ``run`` to stop after its current stage (a second one stops at once)."""
    def request(signum, _frame) -> None:
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop_requested = signal.Signals(signum).name

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


def _step(run: CampaignRun, name: str, round_no: int, last: int) -> dict:
    """Step ``name`` of round ``round_no`` (``round``: rounds ``round_no`` to ``last``) as its task
    run; its result, or it raises what failed it. Called for its result: ``return_state=True`` and
    then ``State.result()`` reads the result back through Prefect's result machinery, ~4 ms more
    per task run."""
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


def _stop_if_asked(run: CampaignRun, round_no: int, stage: str) -> None:
    if run.stop_requested:
        resume = (f"the checkpoint of round {run.state.checkpoint_round}" if run.state.checkpoint_round is not None
                  else "the start")
        after = f"round {round_no}" if stage == "round" else f"round {round_no} {stage}"
        raise Interrupted(f"campaign {run.cfg.name} stopped ({run.stop_requested}) after {after}; "
                          f"run the same command to resume from {resume}")


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
    run = CampaignRun(checked, flow_run_id=str(runtime.flow_run.id or "") or None, flow_run_url=_flow_run_url())
    _mark_crashed(run)
    monitor = UIMonitor(run)
    try:
        with stop_on_signals(run), CampaignProgress(run.cfg, enabled=show_progress) as progress:
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
    except StopRequested as e:  # while waiting for the other process
        e = Interrupted(f"campaign {run.cfg.name} {e} ({run.stop_requested}); run the same command to resume")
        _ended_early(run, monitor, "interrupted", str(e))
        return Cancelled(message=str(e), data=e)
    except Interrupted as e:
        _ended_early(run, monitor, "interrupted", str(e))
        return Cancelled(message=str(e), data=e)
    except (ContractError, StoreUnavailable) as e:  # one line is the whole story
        _ended_early(run, monitor, "failed", str(e), store_reachable=not isinstance(e, StoreUnavailable))
        return Failed(message=str(e), data=e)
    except BaseException as e:
        _ended_early(run, monitor, "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        raise
    return summary


def _ended_early(run: CampaignRun, monitor: UIMonitor, outcome: str, line: str, store_reachable: bool = True) -> None:
    """A campaign that stopped before its end: the validation report, the attempt's end in the
    state and MLflow, and the reason in the Prefect UI."""
    run.validation_report(store_reachable=store_reachable)
    run.end(outcome, line, store_reachable=store_reachable)
    monitor.summary(stopped=line)
