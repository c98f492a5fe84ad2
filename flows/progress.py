"""Progress of a campaign for the person who started it, on stderr.

In a terminal: a warm-start bar, then one bar over rounds showing reward and held-out accuracy.
Elsewhere (a log file, a scheduler, a pipe), where a bar would only be printed in its final state:
plain lines, at most one every ``PLAIN_EVERY_SECONDS`` (the warm start at a twentieth of its
steps, the rounds after a round), and at the end of each. Disabled (a
no-op) for runs such as tests and deployments, whose Prefect logs say the same.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rftflow.components.config import CampaignConfig

PLAIN_EVERY_SECONDS = 10.0


class CampaignProgress:
    def __init__(self, cfg: CampaignConfig, enabled: bool = True, console: Console | None = None):
        self.cfg = cfg
        self.console = console or Console(stderr=True)
        self.plain = enabled and not self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
            console=self.console, disable=not enabled or self.plain, transient=False,
        )
        self._warm = self._rounds = None
        self._started = time.monotonic()
        self._printed_at = -PLAIN_EVERY_SECONDS

    def __enter__(self) -> CampaignProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _line(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        self.console.print(f"{time.strftime('%H:%M:%S')} progress {text} ({elapsed:.0f} s)", highlight=False,
                           soft_wrap=True)
        self._printed_at = time.monotonic()

    def warmup(self, step: int, metrics: dict[str, float]) -> None:
        total = self.cfg.trainer.warmup_steps
        status = f"sft loss {metrics.get('loss/sft', 0):.3f}"
        if self.plain:
            boundary = step % max(1, total // 20) == 0 and time.monotonic() - self._printed_at >= PLAIN_EVERY_SECONDS
            if boundary or step == total:
                self._line(f"warm start {step}/{total}: {status}")
            return
        if self._warm is None:
            self._warm = self.progress.add_task("warm start", total=total, status="")
        if step % 10 == 0 or step == total:
            self.progress.update(self._warm, completed=step, status=status)

    def start_rounds(self, accuracy: float | None, done: int = 0) -> None:
        """The rounds' bar; ``done`` rounds were completed by an earlier attempt (a resumed campaign)."""
        status = f"acc {accuracy:.3f}" if accuracy is not None else ""
        if self.plain:
            self._line(f"rounds {done}/{self.cfg.rounds}" + (f": {status}" if status else ""))
            return
        self._rounds = self.progress.add_task("rounds", total=self.cfg.rounds, completed=done, status=status)

    def round_done(self, round_no: int, reward: float | None, accuracy: float | None) -> None:
        """``reward`` None: a trainer process (the explorer process measures rewards); ``accuracy``
        the newest held-out accuracy."""
        parts = [f"reward {reward:.3f}" if reward is not None else "", f"acc {accuracy:.3f}" if accuracy is not None else ""]
        status = "  ".join(p for p in parts if p)
        if self.plain:
            if round_no == self.cfg.rounds or time.monotonic() - self._printed_at >= PLAIN_EVERY_SECONDS:
                self._line(f"round {round_no}/{self.cfg.rounds}" + (f": {status}" if status else ""))
            return
        self.progress.update(self._rounds, completed=round_no, status=status)
