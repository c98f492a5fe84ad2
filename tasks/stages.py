"""The campaign's Prefect tasks: one per step of ``CampaignRun.phases`` (prepare, warm_start, the
stages of ``components.campaign.ROUND`` — or ``round``, all of them, with ``task_runs: round``,
and for several rounds at once once ``task_runs: auto`` chose so (``round[r=2-5]``) —
evaluate, checkpoint, register, promote), each one
``CampaignRun.step`` call (timed, logged to MLflow at step = round, recorded in the campaign's
state). Task runs are named by step and round (``explore[r=3]``) for the Prefect UI; ``TASKS``
maps each step's name to its task.

They receive the ``CampaignRun`` (models inside), hence ``cache_policy=NO_CACHE``: Prefect must
never pickle or hash it. Retries only where the work is idempotent IO, and never after a data
contract failed; the store itself rides out outages (``storage.outage_seconds``).
"""

from __future__ import annotations

from prefect import get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Failed, State

from rftflow.components.buffer.shards import ShardError
from rftflow.components.buffer.store import StoreUnavailable
from rftflow.components.campaign.stages import StopRequested
from rftflow.components.data.contracts import ContractError
from rftflow.components.campaign.run import CampaignRun


ONE_LINE = (ContractError, StoreUnavailable, ShardError)  # failures whose message is the whole story


def one_line_state(error: Exception) -> State:
    """A step that ended early, as its task run's state with its one line: Cancelled for a stop
    asked for (a signal, a cancel), else Failed; no traceback. The flow gets the exception back."""
    return (Cancelled if isinstance(error, StopRequested) else Failed)(message=str(error), data=error)


def worth_retrying(_task, _task_run, state) -> bool:
    """Retry condition: retry a failed step unless a data contract failed (bad data stays bad) or
    the store stayed down past its own outage budget (it has waited already)."""
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


def _step_task(name: str, doc: str, **retry):
    """The task that runs step ``name`` (a new function per step, so each is its own Prefect task)."""
    def run_step(run: CampaignRun, round_no: int) -> dict | State:
        try:
            result = run.step(name, round_no)
        except (*ONE_LINE, StopRequested) as e:
            return one_line_state(e)
        get_run_logger().info(outcome_line(result))
        return result

    run_step.__name__ = run_step.__qualname__ = name
    run_step.__doc__ = doc
    return task(run_step, name=name, task_run_name=f"{name}[r={{round_no}}]", cache_policy=NO_CACHE, **retry)


IDEMPOTENT = {"retries": 2, "retry_delay_seconds": 1, "retry_condition_fn": worth_retrying}
TASKS = {
    "prepare": _step_task("prepare", "Store the taskset splits and expert demonstrations (idempotent).", **IDEMPOTENT),
    "warm_start": _step_task("warm_start", "Expert-only SFT before the RL rounds; the start weights to the explorer."),
    "await_taskset": _step_task("await_taskset", "An explorer process: wait for the trainer's taskset."),
    "explore": _step_task("explore", "Sample tasks and generate groups of responses → staging."),
    "verify": _step_task("verify", "Score the round's rollouts and check the experience contract."),
    "buffer": _step_task("buffer", "Commit verified rows to the buffer, rejected ones to quarantine (idempotent).",
                         **IDEMPOTENT),
    "train": _step_task("train", "Update the policy on the round's batch with the configured algorithm "
                                 "(a trainer process first waits for the explorer's round)."),
    "sync": _step_task("sync", "Publish the trainer's weights to the explorer, when due (sync.interval)."),
    "evaluate": _step_task("evaluate", "Greedy accuracy on the held-out split (round 0: before the rounds)."),
    "checkpoint": _step_task("checkpoint", "Weights, optimizer, RNG, buffer state to the store; all but "
                                           "the optimizer to MLflow."),
    "register": _step_task("register", "Log the final model and register it as a model version (once).",
                           **IDEMPOTENT),
    "promote": _step_task("promote", "The registered version against @champion: the alias moves on a clear win."),
}


def _rounds_name() -> str:
    """``round[r=3]``, or ``round[r=3-7]`` for a task run of several rounds."""
    parameters = runtime.task_run.parameters
    first, last = parameters["round_no"], parameters.get("last") or parameters["round_no"]
    return f"round[r={first}]" if last == first else f"round[r={first}-{last}]"


@task(name="round", task_run_name=_rounds_name, cache_policy=NO_CACHE)
def round_task(run: CampaignRun, round_no: int, last: int | None = None) -> dict | State:
    """Rounds ``round_no`` to ``last`` (default: ``round_no`` alone), each its stages in order, as
    one task run (task_runs: round, or auto's choice); a line of metrics per round. Stops after a
    round when the campaign is asked to stop; returns the last round's metrics."""
    logger, result = get_run_logger(), {}
    last = last or round_no
    for r in range(round_no, last + 1):
        try:
            result = run.step("round", r)
        except (*ONE_LINE, StopRequested) as e:
            return one_line_state(e)
        logger.info(outcome_line(result) if last == round_no else f"round {r}: {outcome_line(result)}")
        if run.stop_requested:
            break
    return result


TASKS["round"] = round_task


@task(name="bench", cache_policy=NO_CACHE)
def bench(checked) -> dict | State:
    """``mode: bench``: every model of ``bench.models`` on every eval taskset, one MLflow run. A
    model that cannot be found fails it in one line."""
    from rftflow.components.campaign.bench import BenchModelError, bench as run_bench

    try:
        return run_bench(checked)
    except BenchModelError as e:
        return Failed(message=str(e), data=e)
