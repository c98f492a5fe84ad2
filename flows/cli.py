"""The ``rftflow`` command line."""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

import rftflow.flows  # noqa: F401  (applies the quiet service defaults before Prefect is imported)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Reinforcement fine-tuning campaigns on Prefect.")
DEFAULT_CONFIG = "arith-mix"  # a shipped config (rftflow.configs), found from any directory
err = Console(stderr=True)


@app.callback()
def _main() -> None:
    """rftflow: reinforcement fine-tuning campaigns, tracked in Prefect and MLflow."""


EXIT_FAILED, EXIT_REFUSED, EXIT_STOPPED = 1, 2, 130  # and 0: done, or nothing to do


def _fail(message: str, code: int = EXIT_REFUSED) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _stopped(message: str) -> None:
    _say_stopped(message)
    raise typer.Exit(EXIT_STOPPED)


_stop_said = False  # the command's one "stopped:" line is out


def _say_stopped(message: str) -> None:
    """The command's one "stopped:" line (none after the first)."""
    global _stop_said
    if not _stop_said:
        _stop_said = True
        err.print(f"[yellow]stopped:[/yellow] {message.removeprefix('stopped: ')}", highlight=False, soft_wrap=True)


class _StopAtOnce:
    """SIGINT and SIGTERM where they cannot wait for a safe point: any command's, and ``rftflow
    run``'s before the campaign takes them over (start-up), after it has (its shutdown), and a
    second one while it stops (``flows.campaign.AT_ONCE``). One "stopped:" line (none if the
    stop's line is out) and exit 130 now, skipping the interpreter's teardown, where a
    ``KeyboardInterrupt`` would end in a traceback from whichever thread or library it lands in
    (and click would make it "Aborted!", exit 1). What a campaign stored is what a killed attempt
    leaves: committed shards, checkpoints and state, each whole (written atomically, committed
    last), which the same command resumes from its newest checkpoint; its child processes end with
    it (the embedded Prefect server and the code sandboxes are told to by the kernel)."""

    def __init__(self, name: str, resume: str = "") -> None:
        self.name, self.resume = name, resume

    def __call__(self, signum: int, _frame=None) -> None:
        global _stop_said
        if not _stop_said:
            _stop_said = True
            text = f"{self.name} stopped at once ({signal.Signals(signum).name}){self.resume}"
            # one write to the terminal itself, not through a live progress display (which holds the
            # cursor on its bar and hides it): the bar's line ended, the cursor shown again, the line
            terminal = sys.__stderr__.isatty()
            line = f"\n\x1b[?25h\x1b[33mstopped:\x1b[0m {text}\n" if terminal else f"stopped: {text}\n"
            os.write(sys.__stderr__.fileno(), line.encode())
        os._exit(EXIT_STOPPED)

    def install(self) -> _StopAtOnce:
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop_signal, self)
        return self


def _report_to_up() -> None:
    """With no ``PREFECT_API_URL`` set and a Prefect server of ``rftflow up`` running on this
    ``PREFECT_HOME``, a campaign reports to it (live in its UI) instead of starting its own."""
    if os.environ.get("PREFECT_API_URL"):
        return
    from rftflow.flows.servers import up_prefect_api

    api = up_prefect_api()
    if api:
        os.environ["PREFECT_API_URL"] = api  # read when Prefect's settings are first loaded, below
        err.print(f"reporting to the Prefect server of `rftflow up`: {api.removesuffix('/api')}", highlight=False)


def _exit_on(state) -> None:
    """A flow run's end as the command's: returns when it completed; else its one line and exit
    code (``EXIT_STOPPED`` for a stop, ``EXIT_REFUSED`` for a refusal before any work, such as
    another attempt holding the campaign, ``EXIT_FAILED`` otherwise)."""
    from rftflow.components.config import ConfigError

    if state.is_completed():
        return
    if state.is_cancelled():
        _stopped(state.message)
    error = state.result(raise_on_failure=False)
    _fail(state.message.removeprefix("Flow run encountered an exception: "),
          EXIT_REFUSED if isinstance(error, ConfigError) else EXIT_FAILED)


def _preflight(config, run_dir: Path | None, overrides: list[str], restart: bool = False):
    """The validation gate (``components.preflight``) on a config file (None: the default) or a
    loaded config; its one-line error ends the command."""
    from rftflow.components.buffer.store import StoreUnavailable
    from rftflow.components.config import ConfigError
    from rftflow.components.campaign.preflight import preflight

    try:
        return preflight(config or DEFAULT_CONFIG, run_dir, overrides, restart=restart)
    except ConfigError as e:
        _fail(str(e))
    except StoreUnavailable as e:  # the store down past its outage budget: a failure, not bad input
        _fail(str(e), EXIT_FAILED)


def _load_config(config: Path | None, overrides: list[str]):
    """The campaign config (file and overrides), or its one-line error ending the command."""
    return _load_with_orchestration(config, overrides)[0]


def _load_with_orchestration(config: Path | None, overrides: list[str]):
    """The campaign config (file and overrides) and its orchestration section (``orchestration_of``:
    a section the flows define, checked here too), or the one-line error ending the command."""
    from rftflow.components.config import ConfigError, load_config
    from rftflow.flows.orchestration import orchestration_of  # its moved keys, and its section's check

    try:
        loaded = load_config(config or DEFAULT_CONFIG, overrides)
        return loaded, orchestration_of(loaded)
    except ConfigError as e:
        _fail(str(e))


@app.command()
def run(
    config: Annotated[Optional[Path], typer.Argument(help="A campaign YAML file, or a shipped config by name (default: arith-mix).")] = None,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Output dir (default: ./runs/<name>).")] = None,
    overrides: Annotated[list[str], typer.Option("--set", help="Override a key: --set trainer.lr=1e-4")] = [],  # noqa: B006
    restart: Annotated[bool, typer.Option("--restart", help="Start over: move the campaign in the run dir "
                                                             "aside (nothing is deleted).")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
    mode: Annotated[Optional[str], typer.Option("--mode", help="both | async | explore | train | bench "
                                                "(overrides the config's `mode`).")] = None,
) -> None:
    """Run a campaign to the end, or resume it from its newest checkpoint, and print its summary.

    Exit status: 0 done (or already finished), 1 failed, 2 refused before any work (bad input, or
    another attempt already running), 130 stopped by a signal or a cancel.
    """
    if progress:  # the bars report progress; Prefect's per-task INFO lines still reach its API and UI
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    overrides = [*overrides, f"mode={mode}"] if mode else overrides
    launched = int(os.environ.get("WORLD_SIZE", "1"))  # accelerate launch / torchrun: this process's group
    if int(os.environ.get("RANK", "0")) > 0:
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        _follow(config, overrides, launched)
        return
    # SIGINT and SIGTERM (a supervisor, `timeout`) stop at once until the campaign takes both over
    # (a stop at its next safe point), a second one while it stops, and any during its shutdown
    at_once = _StopAtOnce("the campaign", "; resume with the same command (from its newest checkpoint)").install()
    _report_to_up()
    from rftflow.components.config import Mode
    from rftflow.flows.prefect_api import booting_prefect_api

    loaded, settings = _load_with_orchestration(config, overrides)  # a bad key fails before the server starts
    at_once.name = f"campaign {loaded.name}"
    if loaded.mode.trains and loaded.trainer.processes != launched:
        if launched == 1 and "WORLD_SIZE" not in os.environ:
            _launch_processes(loaded.trainer.processes)  # this command again, in that many processes
        from rftflow.components.train.trainer import launch_mismatch

        _fail(launch_mismatch(loaded.trainer.processes, launched))
    with booting_prefect_api() as prefect_api_ready:  # the server boots while the preflight checks the rest
        checked = _preflight(loaded, run_dir, [], restart)  # before the server is up; the flow takes it
        from rftflow.flows import campaign
        from rftflow.flows.campaign import rft_campaign, summary_line

        if checked.finished:
            Console().print(summary_line(checked), highlight=False, soft_wrap=True)
            return
        # the contracts' and the tracking's libraries, else first imported inside the flow
        import great_expectations  # noqa: F401
        import mlflow  # noqa: F401

        _collector_on()
        cfg = checked.cfg
        from rftflow.flows.prefect_api import PrefectAPIUnavailable

        try:
            prefect_api_ready()
        except PrefectAPIUnavailable as e:  # nothing was run: the same command starts the campaign again
            _fail(str(e), EXIT_FAILED)
        campaign.AT_ONCE = at_once
        with campaign.handing_over(checked, restart, settings):  # checked once: the flow takes it as it is
            state = rft_campaign(cfg.model_dump(mode="json"), str(checked.run_dir), restart=restart,
                                 show_progress=progress, return_state=True)
    _exit_on(state)
    if (state.message or "").endswith(campaign.NOTHING_TO_DO):  # another start finished it meanwhile
        Console().print(state.message, highlight=False, soft_wrap=True)
        return
    summary = state.result()
    if cfg.mode == Mode.BENCH:
        table = Table("model", "taskset", "tasks", "accuracy", title=f"bench {cfg.name}")
        for row in summary["results"]:
            table.add_row(row["model"], row["taskset"], str(row["tasks"]), f"{row['accuracy']:.3f}")
        Console().print(table)
        Console().print(f"MLflow run {summary['mlflow_run_id']} ({summary['mlflow_tracking_uri']})")
        return
    table = Table(title=f"campaign {cfg.name}", show_header=False)
    for key in ("mode", "eval_accuracy_before", "eval_accuracy_after", "accuracy_by", "rounds", "wall_seconds",
                "model_name", "model_version", "mlflow_run_id", "store_url"):
        value = summary.get(key)
        shown = f"{value:.1f} s" if key == "wall_seconds" else f"{value:.3f}" if isinstance(value, float) else str(value)
        table.add_row(key, shown)
    if summary.get("resumed_from_round") is not None:
        table.add_row("resumed_from_round", str(summary["resumed_from_round"]))
    for part, held_out in summary.get("eval_accuracy_by_taskset", {}).items():
        shown = ("–" if value is None else f"{value:.3f}" for value in held_out.values())  # before → after
        table.add_row(f"eval_accuracy {part}", " → ".join(shown))
    Console().print(table)
    if summary.get("promotion"):
        Console().print(f"promotion: {summary['promotion']}", highlight=False, soft_wrap=True)
    Console().print(f"summary: {Path(summary['run_dir']) / 'summary.json'}")


def _launch_processes(processes: int) -> None:
    """``trainer.processes`` > 1 without a launcher: run this same command in that many processes
    through torch's elastic launcher (what ``accelerate launch`` and ``torchrun`` run), on this
    machine; exit with rank 0's status. Ctrl-C reaches the launcher, which passes it to the
    processes: rank 0 stops at a safe point and prints its line, and nothing else is printed."""
    import logging
    import shutil
    import tempfile
    import uuid

    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    # the launcher's notes on a Ctrl-C ("death signal") and on rank 0's exit ("failed (exitcode: 2)"):
    # rank 0 has printed its own line
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    logs = tempfile.mkdtemp(prefix="rftflow-launch-")  # the launcher's own files (else one left in /tmp a run)
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=processes, run_id=uuid.uuid4().hex,
                          rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.5,
                          logs_specs=DefaultLogsSpecs(log_dir=logs))
    try:
        elastic_launch(config, sys.executable)("-m", "rftflow", *sys.argv[1:])
    except SignalException:
        sys.exit(EXIT_STOPPED)
    except ChildFailedError as e:  # rank 0's status (a refusal, a stop, a failure: it printed why)
        failure = e.failures.get(0) or next(iter(e.failures.values()))
        sys.exit(failure.exitcode if failure.exitcode > 0 else EXIT_FAILED)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    sys.exit(0)


def _follow(config: Path | None, overrides: list[str], launched: int) -> None:
    """A trainer process of rank > 0 (``rftflow.flows.launch.follow``); rank 0 reports everything
    else (a bad config, the campaign's end)."""
    from rftflow.components.config import ConfigError, load_config
    from rftflow.flows.launch import follow

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # while the config loads, too
    try:
        cfg = load_config(config or DEFAULT_CONFIG, overrides)
    except ConfigError:
        sys.exit(EXIT_REFUSED)  # rank 0 says why
    if cfg.trainer.processes != launched:
        sys.exit(EXIT_REFUSED)
    follow(cfg)


@app.command()
def promote(
    config: Annotated[Optional[Path], typer.Argument(help="The campaign's YAML file or shipped config name (default: arith-mix).")] = None,
    version: Annotated[Optional[str], typer.Option("--version", help="The challenger (default: the newest version).")] = None,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="The campaign's run dir (default: ./runs/<name>).")] = None,
    overrides: Annotated[list[str], typer.Option("--set", help="Override a key: --set promotion.margin=0.05")] = [],  # noqa: B006
) -> None:
    """Move the registered model's `champion` alias to a challenger only if it is clearly better on
    the campaign's held-out tasks; print the decision in one line (exit 0 either way), and on stderr
    the Prefect server its flow run is kept on, or that none keeps it."""
    _report_to_up()
    if not os.environ.get("PREFECT_API_URL"):  # its own API, gone when the command ends: no "View at" link to it
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    from rftflow.flows.prefect_api import booting_prefect_api

    loaded = _load_config(config, overrides)
    with booting_prefect_api() as prefect_api_ready:  # the server boots while the preflight checks the rest
        checked = _preflight(loaded, run_dir, [], False)
        from rftflow.flows.promote import promote_model

        _collector_on()
        kept = not prefect_api_ready()  # None: the environment names a server that outlives the command
        state = promote_model(str(config or DEFAULT_CONFIG), str(checked.run_dir), overrides=list(overrides),
                              version=version, return_state=True)
    _exit_on(state)
    decision = state.result()
    Console().print(decision["line"], highlight=False, soft_wrap=True)
    err.print(_flow_run_line(state.state_details.flow_run_id, kept), highlight=False, soft_wrap=True)
    err.print(_model_line(checked, decision["model"], decision["challenger"]), highlight=False, soft_wrap=True)


def _flow_run_line(flow_run_id, kept: bool) -> str:
    """Where the flow run of a command can be seen: its page on the Prefect server it reported to,
    or that none keeps it (the command's own API ended with it)."""
    from prefect.settings import PREFECT_UI_URL

    ui = PREFECT_UI_URL.value()
    if kept and ui and flow_run_id:
        return f"flow run: {ui.rstrip('/')}/runs/flow-run/{flow_run_id}"
    return "flow run: on no server (this command's own Prefect API ended with it; `rftflow up` keeps one)"


def _model_line(checked, model: str, version: str) -> str:
    """Where the challenger's page is: on the MLflow tracking server, or on the one `rftflow up`
    serves over the run dir; else the store it is in."""
    from rftflow.components.secrets import redact_url
    from rftflow.components.tracking import is_tracking_server, model_version_url
    from rftflow.flows.servers import served

    uri = checked.tracking_uri
    ui = uri if is_tracking_server(uri) else served(checked.run_dir).get("mlflow")
    if ui:
        return f"mlflow: {model_version_url(ui, model, version)}"
    return f"mlflow: no server shows it; its registry is {redact_url(uri)} (`rftflow up {checked.run_dir}` serves it)"


@app.command()
def status(store: Annotated[str, typer.Argument(help="A run dir, or a store URL (file:///…, s3://bucket/prefix).")],
           campaign: Annotated[Optional[str], typer.Option("--campaign", help="Campaign name (default: the only one).")] = None,
           ) -> None:
    """Where a campaign stands: status, rounds done, last checkpoint, MLflow run, last error."""
    from rftflow.components.buffer.layout import moved_aside
    from rftflow.components.buffer.weights import WeightStore
    from rftflow.components.campaign.state import StateStore, explorer_roles

    opened = _open_buffer(store, campaign)
    with _store_errors():
        state = StateStore(opened.objects, opened.campaign).read()
        explorers = {role: StateStore(opened.objects, opened.campaign, role).read()  # a campaign's explorer processes
                     for role in explorer_roles(opened.objects, opened.campaign)}
        state = state or next(iter(explorers.values()), None)
        if state is None:
            _fail(f"{opened.url}: campaign {opened.campaign!r} has stored data but never ran (no state)")
        rounds = state.config.get("rounds")
        weights = WeightStore(opened.objects, opened.campaign)
        checkpoints = weights.checkpoints()
        last = checkpoints[-1] if checkpoints else None
        table = Table(title=f"campaign {state.campaign} in {opened.url}", show_header=False)
        rows = [
            ("status", state.status + (" (its process is alive)" if state.alive_elsewhere() else
                                       " (its process is gone: killed? the same command resumes it)"
                                       if state.status == "running" else "")),
            ("rounds done", f"{state.rounds_done} of {rounds}"),
            ("last stage", f"{state.stage} of round {state.round}" if state.stage else "none"),
            ("last checkpoint", f"{weights.checkpoint_prefix(last['version'])} (round {last['round']}, {last.get('created_at')})"
             if last else "none"),
            ("held-out accuracy", ", ".join(f"r{r}: {a:.3f}" for r, a in sorted(state.evals.items(), key=lambda kv: int(kv[0])))
             or "none"),
            ("mlflow run", state.mlflow_run_id or "none"),
            ("model version", state.model_version or "none"),
            ("attempts", str(len(state.attempts))),
            ("updated", state.updated_at),
            ("last error", state.error or "none"),
        ]
        for role, explorer in explorers.items():
            if explorer is not None and explorer is not state:
                rows.append((f"{role} process", f"{explorer.status}, {explorer.rounds_done} of {rounds} rounds explored"
                             + (f"; last error: {explorer.error}" if explorer.error else "")))
        published = weights.published_weights()
        if published:
            rows.append(("published weights", f"v{published[-1]} (newest of {len(published)} kept)"))
        earlier = moved_aside(opened.objects, opened.campaign)
        if earlier:
            rows.append(("moved aside", ", ".join(earlier) + " (by --restart; --campaign NAME shows one)"))
    for key, value in rows:
        table.add_row(key, value)
    Console().print(table)


RunDirArg = Annotated[Path, typer.Argument(help="The run dir whose mlflow.db the MLflow server serves.")]


@app.command()
def up(run_dir: RunDirArg = Path("runs/arith-mix"),
       prefect_port: Annotated[int, typer.Option(help="Port of the Prefect server and UI.")] = 4200,
       mlflow_port: Annotated[int, typer.Option(help="Port of the MLflow server and UI.")] = 5000) -> None:
    """Start a Prefect server (on PREFECT_HOME's runs) and an MLflow server (on the run dir's
    mlflow.db) on 127.0.0.1, in the background; print their URLs."""
    from rftflow.flows.servers import ServerError, up as start

    try:
        urls = start(run_dir, prefect_port, mlflow_port)
    except ServerError as e:
        _fail(str(e), 1)
    from prefect.settings import PREFECT_HOME

    Console().print(f"Prefect UI  {urls['prefect']}  (every run in {PREFECT_HOME.value()})\n"
                    f"MLflow UI   {urls['mlflow']}/#/experiments?workflowType=machine_learning  "
                    f"(sqlite:///{run_dir.resolve() / 'mlflow.db'})\n"
                    f"`rftflow run` on this PREFECT_HOME reports to this Prefect server while it runs (no export "
                    f"needed; other clients: export PREFECT_API_URL={urls['prefect']}/api)\n"
                    f"stop both: rftflow down {run_dir}", highlight=False, soft_wrap=True)


@app.command()
def down(run_dir: RunDirArg = Path("runs/arith-mix")) -> None:
    """Stop the servers `rftflow up` started for the run dir."""
    from rftflow.flows.servers import down as stop

    stopped = stop(run_dir)
    Console().print(f"stopped: {', '.join(stopped)}" if stopped else f"no servers of {run_dir} were running",
                    highlight=False)


buffer_app = typer.Typer(no_args_is_help=True, help="Inspect what a campaign stored: counts, rows, exports.")
app.add_typer(buffer_app, name="buffer")
StoreArg = Annotated[str, typer.Argument(help="A run dir, or a store URL (file:///…, s3://bucket/prefix).")]
CampaignOpt = Annotated[Optional[str], typer.Option("--campaign", help="Campaign name (default: the only one).")]
KindOpt = Annotated[str, typer.Option(
    "--kind", help="usual, expert, human, quarantine, failed (bad rows of a round over the threshold) or tasks.")]
RoundOpt = Annotated[Optional[int], typer.Option("--round", help="Only this round (usual, quarantine, failed).")]


def _open_buffer(location: str, campaign: str | None):
    """``components.buffer.layout.open_campaign``, its one-line errors ending the command."""
    from rftflow.components.buffer.experiences import open_campaign

    try:
        with _store_errors():
            return open_campaign(location, campaign)
    except ValueError as e:  # names the run dir, URL or campaign
        _fail(str(e))


@contextmanager
def _store_errors():
    """A store that cannot be read ends the command in one line, exit 1: a corrupt shard (its key and
    what differs), a store down past its outage budget, botocore's errors."""
    from botocore.exceptions import BotoCoreError, ClientError

    from rftflow.components.buffer.shards import ShardError
    from rftflow.components.buffer.store import StoreUnavailable

    try:
        yield
    except (ShardError, StoreUnavailable) as e:
        _fail(str(e), EXIT_FAILED)
    except (BotoCoreError, ClientError) as e:
        _fail(f"{type(e).__name__}: {str(e).splitlines()[0]}", EXIT_FAILED)


def _read(store, kind: str, round_no: int | None):
    try:
        with _store_errors():
            return store.read_kind(kind, round_no)
    except KeyError as e:
        _fail(e.args[0])


@buffer_app.command("ls")
def buffer_ls(store: StoreArg, campaign: CampaignOpt = None) -> None:
    """Rows stored per kind, round and source."""
    opened = _open_buffer(store, campaign)
    table = Table(title=f"campaign {opened.campaign} in {opened.url}")
    for column in ("kind", "round", "source", "rows"):
        table.add_column(column, justify="right" if column in ("round", "rows") else "left")
    with _store_errors():
        counts = opened.counts()
    for row in counts:
        table.add_row(row["kind"], "" if row["round"] is None else str(row["round"]), row["source"], str(row["rows"]))
    Console().print(table)


@buffer_app.command("show")
def buffer_show(store: StoreArg, campaign: CampaignOpt = None, kind: KindOpt = "usual", round_no: RoundOpt = None,
                limit: Annotated[int, typer.Option("--limit", help="Rows to show.")] = 5) -> None:
    """A few stored rows, as text."""
    rows = _read(_open_buffer(store, campaign), kind, round_no)
    columns = [c for c in ("round", "source", "task_id", "prompt", "question", "response", "answer", "reward",
                           "model_version", "images", "reason") if c in rows.column_names]
    table = Table(title=f"{kind}: {rows.num_rows} rows" + (f" in round {round_no}" if round_no else ""))
    for column in columns:
        table.add_column(column, overflow="fold")

    def shown(value) -> str:
        if isinstance(value, list):  # pictures: each by its key (``images/<sha256>``, shortened)
            return ", ".join(f"{image['key'][:19]}… ({len(image['data'] or b'')} B)" for image in value)
        return "" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)

    for row in rows.slice(0, limit).select(columns).to_pylist():
        table.add_row(*(shown(v) for v in row.values()))
    Console().print(table)


@buffer_app.command("export")
def buffer_export(store: StoreArg, out: Annotated[Path, typer.Option("--out", help="A .jsonl or .parquet file.")],
                  campaign: CampaignOpt = None, kind: KindOpt = "usual", round_no: RoundOpt = None) -> None:
    """Write stored rows to JSONL or Parquet, each with its pictures' bytes (Parquet: binary; JSONL: a
    ``data:`` URL, as tasksets take them), so the file stands without the store."""
    import pyarrow.parquet as pq

    if out.suffix not in (".jsonl", ".parquet"):
        _fail(f"--out {out}: the file name must end in .jsonl or .parquet")
    rows = _read(_open_buffer(store, campaign), kind, round_no)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".parquet":
        pq.write_table(rows, out)
    else:
        from rftflow.components.data.images import data_url

        with out.open("w") as f:
            for row in rows.to_pylist():
                for image in row.get("images") or ():
                    image["data"] = data_url(image["data"])
                f.write(json.dumps(row, default=str) + "\n")
    Console().print(f"{rows.num_rows} {kind} rows → {out}")


@buffer_app.command("gc")
def buffer_gc(store: StoreArg, campaign: CampaignOpt = None,
              apply: Annotated[bool, typer.Option("--apply", help="Delete (default: list what would go).")] = False,
              keep_rounds: Annotated[Optional[int], typer.Option(
                  "--keep-rounds", min=1, help="Keep the newest k rounds of experiences (default: the campaign's "
                  "retention.keep_rounds).")] = None) -> None:
    """Delete what the campaign no longer needs, by the retention rules (components.buffer.retention):
    staging, superseded weights and checkpoints, checkpoints set aside as corrupt, crash leftovers,
    rounds past keep_rounds. A dry run unless --apply; refused while the campaign runs."""
    from rftflow.components.buffer.retention import apply as apply_plan, plan
    from rftflow.components.campaign.state import StateStore, explorer_roles, running_line

    opened = _open_buffer(store, campaign)
    with _store_errors():
        roles = ["campaign", *explorer_roles(opened.objects, opened.campaign)]
        states = [StateStore(opened.objects, opened.campaign, role).read() for role in roles]
        states = [s for s in states if s is not None]
        if not states:
            _fail(f"{opened.url}: campaign {opened.campaign!r} never ran (no state): nothing to collect")
        for state in states:
            if state.alive_elsewhere():
                _fail(running_line(state))
        gc_plan = plan(opened, states[0].config, finished=states[0].status == "finished", keep_rounds=keep_rounds,
                       corrupt=True)
        deleted = apply_plan(opened, gc_plan) if apply else 0
    table = Table(title=f"buffer gc: campaign {opened.campaign} in {opened.url}" + ("" if apply else " (dry run)"))
    for column in ("kind", "objects", "kept"):
        table.add_column(column, justify="right" if column == "objects" else "left", overflow="fold")
    for kind, n, note in gc_plan.rows():
        table.add_row(kind, str(n), note)
    Console().print(table)
    Console().print(f"deleted {deleted} objects" if apply else
                    f"{gc_plan.total} objects would be deleted; --apply deletes them", highlight=False)


@app.command()
def alerts(webhook: Annotated[str, typer.Argument(help="The URL the alerts are POSTed to (Slack, a pager, your "
                                                       "service).")],
           stall_minutes: Annotated[float, typer.Option(min=1, help="A running campaign that finishes no round for "
                                                                    "this long is reported as stalled.")] = 30.0) -> None:
    """Create the Prefect automations that call WEBHOOK when a campaign fails, crashes or stalls
    (on the server PREFECT_API_URL names, or the one `rftflow up` runs)."""
    _report_to_up()
    if not os.environ.get("PREFECT_API_URL"):
        _fail("alerts need a Prefect server that runs its automations: start one with `rftflow up RUN_DIR`, "
              "or set PREFECT_API_URL")
    from rftflow.flows.alerts import create_alerts

    for name, automation_id in create_alerts(webhook, stall_minutes).items():
        Console().print(f"{name}: automation {automation_id} (its webhook: the block rftflow-alerts)", highlight=False)


config_app = typer.Typer(no_args_is_help=True, help="The campaign config: its JSON schema and reference.")
app.add_typer(config_app, name="config")


@config_app.command("schema")
def config_schema() -> None:
    """Print the JSON schema of a campaign config (for editors that validate YAML)."""
    from rftflow.flows.reference import config_schema as schema

    print(json.dumps(schema(), indent=2))


@config_app.command("reference")
def config_reference() -> None:
    """Print the configuration reference (markdown, as docs/reference/configuration.md)."""
    from rftflow.flows.reference import config_reference as reference

    print(reference(), end="")


@config_app.command("show")
def config_show(config: Annotated[Optional[Path], typer.Argument(help="A campaign YAML file, or a shipped config "
                                                                 "by name (default: arith-mix).")] = None,
                overrides: Annotated[list[str], typer.Option("--set", help="Override a key.")] = []) -> None:  # noqa: B006
    """Print a campaign's whole config, every default filled in, as YAML (after the --set overrides)."""
    import yaml

    print(yaml.safe_dump(_load_config(config, overrides).model_dump(mode="json"), sort_keys=False), end="")


ingest_app = typer.Typer(no_args_is_help=True, help="Validate and store human feedback or expert demonstrations.")
app.add_typer(ingest_app, name="ingest")
FileArg = Annotated[Path, typer.Argument(help="A JSONL (or Parquet) file, one row per line.")]
ConfigArg = Annotated[Optional[Path], typer.Argument(help="A campaign YAML file, or a shipped config by name (default: arith-mix).")]
RunDirOpt = Annotated[Optional[Path], typer.Option("--run-dir", help="The campaign's run dir (default: ./runs/<name>).")]
SetOpt = Annotated[list[str], typer.Option("--set", help="Override a config key: --set name=my-campaign")]
ReportOpt = Annotated[Optional[Path], typer.Option("--report", help="Write the outcome as JSON here.")]


def _ingest(kind: str, file: Path, config: Path | None, run_dir: Path | None, overrides: list[str],
            report: Path | None) -> None:
    from rftflow.components.buffer.experiences import ExperienceStore, store_ingested
    from rftflow.components.buffer.layout import open_run_store, record_run_store
    from rftflow.components.data.contracts import ContractError
    from rftflow.components.data.ingest import validate_file
    from rftflow.components.data.tasksets import TasksetError
    from rftflow.components.explore.models import load_model

    _collector_on()
    checked = _preflight(config, run_dir, overrides)
    cfg = checked.cfg
    _, tokenizer = load_model(cfg.model.path, allow_download=cfg.model.allow_download)
    try:
        result = validate_file(file, kind, cfg.name, tokenizer, cfg.contracts, chat_template=cfg.model.chat_template)
    except TasksetError as e:
        _fail(str(e))
    outcome = result.report()
    store = None
    try:  # the store is opened (and the run dir's store.json written) only for a file that passes
        result.enforce(cfg.contracts.max_bad_fraction)
        with _store_errors():
            store = ExperienceStore(open_run_store(cfg.storage, checked.run_dir, record=False), cfg.name)
            outcome |= store_ingested(result, store, cfg.contracts.max_bad_fraction)
        record_run_store(cfg.storage, checked.run_dir, store.objects)
        outcome["stored"] = True
    except ContractError as e:
        outcome["stored"], outcome["error"] = False, str(e)
    if report is not None:
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(outcome, indent=2) + "\n")
    where = store.url if store is not None else checked.store_url
    table = Table(title=f"{kind} {file} → campaign {cfg.name} ({where})", show_header=False)
    for key in ("rows", "accepted", "quarantined"):
        table.add_row(key, str(outcome[key]))
    for source, n in outcome["by_source"].items():
        table.add_row(f"  {source}", str(n) if outcome["stored"] else f"{n} (not stored)")
    for reason, n in outcome["reasons"].items():
        table.add_row(f"  {reason}", str(n))
    if outcome["stored"]:
        table.add_row("new", str(outcome["new"]))
        table.add_row("already present", str(outcome["already_present"]))
    Console().print(table)
    if not outcome["stored"]:
        _fail(outcome["error"], EXIT_FAILED)  # bad data past its threshold
    if not outcome["new"] and outcome["accepted"]:
        Console().print(f"every accepted row was stored before: nothing new stored")


@ingest_app.command("feedback")
def ingest_feedback(file: FileArg, config: ConfigArg = None, run_dir: RunDirOpt = None,
                    overrides: SetOpt = [], report: ReportOpt = None) -> None:  # noqa: B006
    """Human feedback: rows with prompt, response and a rating or a correction."""
    _ingest("feedback", file, config, run_dir, overrides, report)


@ingest_app.command("expert")
def ingest_expert(file: FileArg, config: ConfigArg = None, run_dir: RunDirOpt = None,
                  overrides: SetOpt = [], report: ReportOpt = None) -> None:  # noqa: B006
    """Expert demonstrations: rows with prompt and response."""
    _ingest("expert", file, config, run_dir, overrides, report)


judge_app = typer.Typer(no_args_is_help=True, help="The judge reward: how far it can be trusted.")
app.add_typer(judge_app, name="judge")


@judge_app.command("check")
def judge_check(labels: Annotated[Path, typer.Argument(help="A JSONL file: question, response, score (the label), "
                                                             "optional answer, one response a line.")],
                config: ConfigArg = None, overrides: SetOpt = []) -> None:  # noqa: B006
    """Score labelled responses with the config's judge (reward.judge) and print its agreement with
    the labels: exact, within 1, Spearman's rank correlation."""
    from rftflow.components.verify.judge_check import check_judge

    settings = _load_config(config, overrides).reward.judge
    try:
        result = check_judge(settings, labels)
    except ValueError as e:  # a bad labels file, or no judge configured: names the file and line, or the key
        _fail(str(e).splitlines()[0])
    print(f"judge {settings.model} at {settings.base_url}, scores 0 to {settings.max_score}")
    print("\n".join(result.lines()))
    if not result.read:
        _fail(f"the judge scored none of the {result.rows} responses", EXIT_FAILED)


def main() -> None:
    """The ``rftflow`` command, with Python's cyclic garbage collector off while it imports its
    libraries and their ~1M objects frozen (``gc.freeze``) once loaded and at exit. Each full
    collection walks every tracked object, a large share of a second for this heap. While the heap
    grows, a full collection runs at every 25% of growth, and the interpreter's exit collects
    several more times before the OS frees the memory anyway: frozen objects are left out of both. Reference counting frees memory as before. ``run``,
    ``promote`` and the ingest commands switch the collector back on once loaded
    (``_collector_on``); the short commands (status, buffer, up, down) end without it.

    The commands that only read or write the store (``NOTHING_TO_FINALIZE``) leave with
    ``os._exit`` once their output is flushed: at the interpreter's teardown pyarrow's native
    thread pools can abort the process (``terminate called without an active exception``, exit
    -6, after the command's work was done: apache/arrow#34314), and there is nothing of theirs to
    finalize (no server, no background writer, no atexit work)."""
    gc.disable()
    code = 0
    atexit.register(_signals_ignored_at_the_end)  # registered first: run last
    _StopAtOnce(" ".join(["rftflow", *sys.argv[1:2]])).install()  # Ctrl-C: one line, exit 130 (``run``: its own)
    try:
        app()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        gc.freeze()
        gc.enable()
    if len(sys.argv) > 1 and sys.argv[1] in NOTHING_TO_FINALIZE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


NOTHING_TO_FINALIZE = ("status", "buffer", "ingest", "config")


def _signals_ignored_at_the_end() -> None:
    """The last exit function, after the threads were joined and the others ran: from here the
    interpreter puts the default SIGINT and SIGTERM actions back (all but an ignored signal's), and
    a Ctrl-C would kill the process by the signal, not exit 130 (its stop's line already out).
    Ignored, a late one goes with the process; until here ``_StopAtOnce`` answers them."""
    for stop_signal in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop_signal, signal.SIG_IGN)


def _collector_on() -> None:
    """The command's libraries are loaded: freeze what they allocated and collect from here on (see
    ``main``)."""
    gc.freeze()
    gc.enable()


if __name__ == "__main__":
    main()

