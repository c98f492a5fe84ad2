"""The campaign's Prefect tasks: one per row of the step table (``components.campaign.steps``),
made from it by ``task_of`` and running the step through ``CampaignRun.do`` (timed, logged to MLflow
at step = round, recorded in the campaign's state), and ``rounds``, a round's stages (or several rounds') as one
task run when the flow runs them so (``flows.orchestration``). Task runs are named by step and
round (``explore[r=3]``, ``round[r=2-5]``) for the Prefect UI, and log the step's metrics. Also
``bench`` (mode bench) and ``promote_task`` (the ``promote_model`` flow's).

They receive the ``CampaignRun`` (models inside), hence ``cache_policy=NO_CACHE``: Prefect must
never pickle or hash it. Retries only where the work is idempotent IO, and never after a data
contract failed; the store itself rides out outages (``storage.outage_seconds``).
"""

from __future__ import annotations

from prefect import Task, get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Failed, State

from rftflow.components.buffer.shards import ShardError
from rftflow.components.buffer.store import StoreUnavailable
from rftflow.components.stopping import StopRequested
from rftflow.components.data.contracts import ContractError
from rftflow.components.data.tasksets import TasksetError
from rftflow.components.verify.scores import RewardUnavailable
from rftflow.components.campaign.run import CampaignRun
from rftflow.components.campaign.schedule import Planned
from rftflow.components.campaign.steps import StepKey, StepSpec, spec_of


# failures whose message is the whole story; none is retried (bad data, a bad taskset stay bad; the store waited)
ONE_LINE = (ContractError, StoreUnavailable, ShardError, TasksetError, RewardUnavailable)


def one_line_state(error: Exception) -> State:
    """A step that ended early, as its task run's state with its one line: Cancelled for a stop
    asked for (a signal, a cancel), else Failed; no traceback. The flow gets the exception back."""
    return (Cancelled if isinstance(error, StopRequested) else Failed)(message=str(error), data=error)


def worth_retrying(_task, _task_run, state) -> bool:
    """Retry condition: retry a failed step unless its error is deterministic — a data contract or
    the taskset itself failed (bad data stays bad) — or the store stayed down past its own outage
    budget (it has waited already)."""
    try:
        state.result()
    except ONE_LINE:
        return False
    except Exception:  # noqa: BLE001 — anything else may be transient
        return True
    return True


def outcome_line(result: dict) -> str:
    """What a step did, for its log in the Prefect UI: its metrics (``key=value``), seconds last
    (each stage's, for a ``round``)."""
    def shown(value) -> str:
        if isinstance(value, float):
            return str(int(value)) if value.is_integer() else f"{value:.4g}"
        return str(value)

    seconds = {k.removeprefix("time/").removesuffix("_s"): v for k, v in result.items() if k.startswith("time/")}
    parts = [f"{k}={shown(v)}" for k, v in result.items()
             if not k.startswith("time/") and isinstance(v, (int, float, str)) and len(shown(v)) <= 200]
    timing = (f"{next(iter(seconds.values())):.2f} s" if len(seconds) == 1
              else ", ".join(f"{stage} {v:.3f} s" for stage, v in seconds.items()))
    return ", ".join(parts) + (f" ({timing})" if seconds else "") if parts or seconds else "done"


def _logged(step, round_no: int) -> dict | State:
    """``step(round_no)`` (a ``CampaignRun`` method), its metrics logged in one line; a failure
    whose message is the whole story, or a stop, as the task run's state (see ``one_line_state``)."""
    try:
        result = step(round_no)
    except (*ONE_LINE, StopRequested) as e:
        return one_line_state(e)
    get_run_logger().info(outcome_line(result))
    return result


IDEMPOTENT = {"retries": 2, "retry_delay_seconds": 1, "retry_condition_fn": worth_retrying}
_TASKS: dict[StepSpec, Task] = {}  # the task of each row of the step table, made once per process


def _task_for(spec: StepSpec) -> Task:
    """The Prefect task of a row of the step table: named by the step, its task runs ``<step>[r=N]``,
    retried when the row is idempotent, never cached (it receives the ``CampaignRun``)."""
    step = spec.step

    def run_step(run: CampaignRun, round_no: int = 0) -> dict | State:
        return _logged(lambda r: run.do(Planned(step, r)), round_no)

    # its own name: Prefect keys a task by its function's name and code, shared by every step's
    run_step.__name__ = run_step.__qualname__ = spec.name
    run_step.__doc__ = spec.summary
    return task(run_step, name=spec.name, task_run_name=f"{spec.name}[r={{round_no}}]", cache_policy=NO_CACHE,
                description=spec.summary, **(IDEMPOTENT if spec.idempotent else {}))


def task_of(step: StepKey) -> Task:
    """The task that runs ``step``, made from its row of the step table (``campaign.steps.STEPS``)."""
    spec = spec_of(step)
    if spec not in _TASKS:
        _TASKS[spec] = _task_for(spec)
    return _TASKS[spec]


def _rounds_name() -> str:
    """``round[r=3]``, or ``round[r=3-7]`` for a task run of several rounds."""
    parameters = runtime.task_run.parameters
    first, last = parameters["round_no"], parameters.get("last") or parameters["round_no"]
    return f"round[r={first}]" if last == first else f"round[r={first}-{last}]"


@task(name="round", task_run_name=_rounds_name, cache_policy=NO_CACHE)
def rounds(run: CampaignRun, round_no: int, last: int | None = None) -> dict | State:
    """Rounds ``round_no`` to ``last`` (default: ``round_no`` alone), each its stages in order
    (``CampaignRun.round``), as one task run; a line of metrics per round. Stops after a round
    when the campaign is asked to stop; returns the last round's metrics."""
    logger, result = get_run_logger(), {}
    last = last or round_no
    for r in range(round_no, last + 1):
        try:
            result = run.round(r)
        except (*ONE_LINE, StopRequested) as e:
            return one_line_state(e)
        logger.info(outcome_line(result) if last == round_no else f"round {r}: {outcome_line(result)}")
        if run.stop_requested:
            break
    return result


@task(name="bench", task_run_name="bench[{checked.cfg.name}]", cache_policy=NO_CACHE)
def bench(checked) -> dict | State:
    """``mode: bench``: every model of ``bench.models`` on every eval taskset, one MLflow run. A
    model that cannot be found fails it in one line."""
    from rftflow.components.campaign.bench import BenchModelError, bench as run_bench

    try:
        return run_bench(checked)
    except BenchModelError as e:
        return Failed(message=str(e), data=e)


def _promote_name() -> str:
    parameters = runtime.task_run.parameters
    return f"promote[{parameters['checked'].cfg.tracking.registered_model} v{parameters.get('version') or 'newest'}]"


@task(name="promote", task_run_name=_promote_name, cache_policy=NO_CACHE)
def promote_task(checked, version: str | None) -> dict | State:
    """The ``promote_model`` flow's: evaluate both versions, decide, tag, move the alias."""
    from rftflow.components.campaign.bench import BenchModelError
    from rftflow.components.campaign.promotion import decision_dict, promote

    try:
        decision = promote(checked, version)
    except BenchModelError as e:
        return Failed(message=str(e), data=e)
    return {**decision_dict(decision), "line": decision.line()}
