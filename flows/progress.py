"""Progress of a campaign for the person who started it, on stderr, and the estimates every view
shares (``Pace``, ``eta_text``).

In a terminal: a warm-start bar, then one bar over rounds showing reward, held-out accuracy and the
time left. Elsewhere (a log file, a scheduler, a pipe), where a bar would only be printed in its
final state: plain lines, one every ``PLAIN_EVERY_SECONDS`` and one at the start and the end of
each phase. Disabled (a no-op) for runs such as tests and deployments, whose Prefect logs say the
same.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rftflow.components.config import CampaignConfig

PLAIN_EVERY_SECONDS = 30.0


class Pace:
    """Time left for ``total`` units at the pace seen so far: seconds left =
    (total − done) × (now − t₀) / (done − done₀), where (done₀, t₀) is the first count seen (what an
    earlier attempt did is not this attempt's pace). None until one unit has been seen after it."""

    def __init__(self, total: int, clock: Callable[[], float] = time.monotonic):
        self.total, self.clock = total, clock
        self.first: tuple[int, float] | None = None
        self.done = 0

    def update(self, done: int) -> None:
        if self.first is None:
            self.first = (done, self.clock())
        self.done = done

    def first_done(self) -> float:
        """The first count seen (infinity before any): an update at or below it has no pace yet."""
        return self.first[0] if self.first is not None else float("inf")

    def seconds_left(self) -> float | None:
        if self.first is None or self.done <= self.first[0]:
            return None
        rate = (self.clock() - self.first[1]) / (self.done - self.first[0])
        return max(0.0, (self.total - self.done) * rate)


def duration(seconds: float) -> str:
    """``42 s``, ``12 min``, ``3 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60:02d} min"


def eta_text(seconds: float | None, upper_bound: bool = False, clock: bool = False) -> str | None:
    """The time left as people read it: ``12 min``; ``≤ 12 min`` when the work may end sooner
    (``trainer.warmup_until``); with ``clock``, also when (``12 min, until 14:32 UTC``)."""
    if seconds is None:
        return None
    text = ("≤ " if upper_bound else "") + duration(seconds)
    if clock:
        text += f", until {datetime.now(timezone.utc) + timedelta(seconds=seconds):%H:%M} UTC"
    return text


def warm_figures(metrics: dict[str, float], check: float | None) -> list[str]:
    """A warm-start step's figures: its SFT loss and (with ``trainer.warmup_until``) the last check."""
    parts = [f"sft loss {metrics['loss/sft']:.3f}"] if "loss/sft" in metrics else []
    return parts + ([f"check {check:.3f}"] if check is not None else [])


class CampaignProgress:
    def __init__(self, cfg: CampaignConfig, enabled: bool = True, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.cfg, self.clock = cfg, clock
        self.console = console or Console(stderr=True)
        self.plain = enabled and not self.console.is_terminal
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
            console=self.console, disable=not enabled or self.plain, transient=False,
        )
        self._warm = self._rounds = None
        self.warm_pace = Pace(cfg.trainer.warmup_steps, clock)
        self.round_pace = Pace(cfg.rounds, clock)
        self._check: float | None = None  # the warm start's last warmup_until check
        self._started = clock()
        self._printed_at = -float("inf")

    def __enter__(self) -> CampaignProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _line(self, text: str) -> None:
        elapsed = self.clock() - self._started
        self.console.print(f"{time.strftime('%H:%M:%S')} progress {text} ({elapsed:.0f} s)", highlight=False,
                           soft_wrap=True)
        self._printed_at = self.clock()

    def _due(self, last: bool) -> bool:
        return last or self.clock() - self._printed_at >= PLAIN_EVERY_SECONDS

    def warmup(self, step: int, metrics: dict[str, float]) -> None:
        """After warm-start step ``step`` (its ``metrics``; ``warmup/check_accuracy`` at a check)."""
        total = self.cfg.trainer.warmup_steps
        self.warm_pace.update(step)
        self._check = metrics.get("warmup/check_accuracy", self._check)
        eta = eta_text(self.warm_pace.seconds_left(), upper_bound=self.cfg.trainer.warmup_until is not None) \
            if step < total else None
        status = ", ".join([*warm_figures(metrics, self._check), *([f"eta {eta}"] if eta else [])])
        if self.plain:
            if self._due(step == total) or self._warm is None:
                self._warm = True
                self._line(f"warm start {step}/{total}" + (f": {status}" if status else ""))
            return
        if self._warm is None:
            self._warm = self.progress.add_task("warm start", total=total, status="")
        self.progress.update(self._warm, completed=step, status=status)

    def start_rounds(self, accuracy: float | None, done: int = 0) -> None:
        """The rounds' bar; ``done`` rounds were completed by an earlier attempt (a resumed campaign)."""
        self.round_pace.update(done)
        status = f"acc {accuracy:.3f}" if accuracy is not None else ""
        if self.plain:
            self._line(f"rounds {done}/{self.cfg.rounds}" + (f": {status}" if status else ""))
            return
        self._rounds = self.progress.add_task("rounds", total=self.cfg.rounds, completed=done, status=status)

    def round_done(self, round_no: int, reward: float | None, accuracy: float | None) -> None:
        """``reward`` None: a trainer process (the explorer process measures rewards); ``accuracy``
        the newest held-out accuracy."""
        self.round_pace.update(round_no)
        eta = eta_text(self.round_pace.seconds_left()) if round_no < self.cfg.rounds else None
        parts = [f"reward {reward:.3f}" if reward is not None else "",
                 f"acc {accuracy:.3f}" if accuracy is not None else "", f"eta {eta}" if eta else ""]
        status = "  ".join(p for p in parts if p)
        if self.plain:
            if self._due(round_no == self.cfg.rounds):
                self._line(f"round {round_no}/{self.cfg.rounds}" + (f": {status}" if status else ""))
            return
        self.progress.update(self._rounds, completed=round_no, status=status)
