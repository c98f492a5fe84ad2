"""The ``rftflow`` command line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

import flows  # noqa: F401  (applies the quiet service defaults before Prefect is imported)

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Reinforcement fine-tuning campaigns on Prefect.")
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "arith-mix.yaml"
err = Console(stderr=True)


@app.callback()
def _main() -> None:
    """rftflow: reinforcement fine-tuning campaigns, tracked in Prefect and MLflow."""


def _fail(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@app.command()
def run(
    config: Annotated[Optional[Path], typer.Argument(help="Campaign YAML (default: configs/arith-mix.yaml).")] = None,
    run_dir: Annotated[Optional[Path], typer.Option("--run-dir", help="Output dir (default: ./runs/<name>).")] = None,
    overrides: Annotated[list[str], typer.Option("--set", help="Override a key: --set trainer.lr=1e-4")] = [],  # noqa: B006
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Show progress bars.")] = True,
) -> None:
    """Run a campaign to the end and print its summary."""
    from components.algorithms import check_algorithm
    from components.config import ConfigError, load_config
    from components.tasksets import TasksetError, check_taskset

    if progress:  # the bars report progress; Prefect's per-task INFO lines still reach its API and UI
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    try:
        cfg = load_config(config or DEFAULT_CONFIG, overrides)
        check_taskset(cfg.taskset)
        check_algorithm(cfg.algorithm)
    except (ConfigError, TasksetError) as e:
        _fail(str(e))
    from flows.campaign import rft_campaign

    summary = rft_campaign(cfg.model_dump(mode="json"), str(run_dir) if run_dir else None, show_progress=progress)
    table = Table(title=f"campaign {cfg.name}", show_header=False)
    for key in ("eval_accuracy_before", "eval_accuracy_after", "rounds", "wall_seconds", "model_name",
                "model_version", "mlflow_run_id", "store_url"):
        value = summary[key]
        table.add_row(key, f"{value:.3f}" if isinstance(value, float) else str(value))
    Console().print(table)
    Console().print(f"summary: {Path(summary['run_dir']) / 'summary.json'}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()

