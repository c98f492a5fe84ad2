"""The campaign's Prefect tasks: one per step of the schedule (``components.campaign.schedule``),
each calling the ``CampaignRun`` method of the same name (timed, logged to MLflow at step = round,
recorded in the campaign's state), and ``rounds``, a round's stages (or several rounds') as one
task run when the flow runs them so (``flows.orchestration``). Task runs are named by step and
round (``explore[r=3]``, ``round[r=2-5]``) for the Prefect UI, and log the step's metrics.

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
from rftflow.components.data.tasksets import TasksetError
from rftflow.components.verify.scores import RewardUnavailable
from rftflow.components.campaign.run import CampaignRun


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


@task(name="prepare", task_run_name="prepare[r={round_no}]", cache_policy=NO_CACHE, **IDEMPOTENT)
def prepare(run: CampaignRun, round_no: int = 0) -> dict | State:
    """Store the taskset splits and expert demonstrations (idempotent)."""
    return _logged(run.prepare, round_no)


@task(name="warm_start", task_run_name="warm_start[r={round_no}]", cache_policy=NO_CACHE)
def warm_start(run: CampaignRun, round_no: int = 0) -> dict | State:
    """Expert-only SFT before the RL rounds; the start weights to the explorer."""
    return _logged(run.warm_start, round_no)


@task(name="await_taskset", task_run_name="await_taskset[r={round_no}]", cache_policy=NO_CACHE)
def await_taskset(run: CampaignRun, round_no: int = 0) -> dict | State:
    """An explorer process: wait for the trainer's taskset."""
    return _logged(run.await_taskset, round_no)


@task(name="explore", task_run_name="explore[r={round_no}]", cache_policy=NO_CACHE)
def explore(run: CampaignRun, round_no: int) -> dict | State:
    """Sample tasks and generate groups of responses → staging."""
    return _logged(run.explore, round_no)


@task(name="verify", task_run_name="verify[r={round_no}]", cache_policy=NO_CACHE)
def verify(run: CampaignRun, round_no: int) -> dict | State:
    """Score the round's rollouts and check the experience contract."""
    return _logged(run.verify, round_no)


@task(name="buffer", task_run_name="buffer[r={round_no}]", cache_policy=NO_CACHE, **IDEMPOTENT)
def buffer(run: CampaignRun, round_no: int) -> dict | State:
    """Commit verified rows to the buffer, rejected ones to quarantine (idempotent)."""
    return _logged(run.buffer, round_no)


@task(name="train", task_run_name="train[r={round_no}]", cache_policy=NO_CACHE)
def train(run: CampaignRun, round_no: int) -> dict | State:
    """Update the policy on the round's batch with the configured algorithm (a trainer process
    first waits for the explorer's round)."""
    return _logged(run.train, round_no)


@task(name="sync", task_run_name="sync[r={round_no}]", cache_policy=NO_CACHE)
def sync(run: CampaignRun, round_no: int) -> dict | State:
    """Publish the trainer's weights to the explorer, when due (sync.interval)."""
    return _logged(run.sync, round_no)


@task(name="evaluate", task_run_name="evaluate[r={round_no}]", cache_policy=NO_CACHE)
def evaluate(run: CampaignRun, round_no: int) -> dict | State:
    """Greedy accuracy on the held-out split (round 0: before the rounds)."""
    return _logged(run.evaluate, round_no)


@task(name="checkpoint", task_run_name="checkpoint[r={round_no}]", cache_policy=NO_CACHE)
def checkpoint(run: CampaignRun, round_no: int) -> dict | State:
    """Weights, optimizer, RNG, buffer state to the store; all but the optimizer to MLflow."""
    return _logged(run.checkpoint, round_no)


@task(name="register", task_run_name="register[r={round_no}]", cache_policy=NO_CACHE, **IDEMPOTENT)
def register(run: CampaignRun, round_no: int) -> dict | State:
    """Log the final model and register it as a model version (once)."""
    return _logged(run.register, round_no)


@task(name="promote", task_run_name="promote[r={round_no}]", cache_policy=NO_CACHE)
def promote(run: CampaignRun, round_no: int) -> dict | State:
    """The registered version against @champion: the alias moves on a clear win."""
    return _logged(run.promote, round_no)


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
