"""Terminal progress for a campaign: a warm-start bar, then one bar over rounds showing reward
and held-out accuracy. Disabled (a no-op) for non-interactive runs such as tests and deployments."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from components.config import CampaignConfig


class CampaignProgress:
    def __init__(self, cfg: CampaignConfig, enabled: bool = True):
        self.cfg = cfg
        self.progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
            console=Console(stderr=True), disable=not enabled, transient=False,
        )
        self._warm = self._rounds = None

    def __enter__(self) -> CampaignProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def warmup(self, step: int, metrics: dict[str, float]) -> None:
        if self._warm is None:
            self._warm = self.progress.add_task("warm start", total=self.cfg.trainer.warmup_steps, status="")
        if step % 10 == 0 or step == self.cfg.trainer.warmup_steps:
            self.progress.update(self._warm, completed=step, status=f"sft loss {metrics.get('loss/sft', 0):.3f}")

    def start_rounds(self, accuracy: float | None, done: int = 0) -> None:
        """The rounds' bar; ``done`` rounds were completed by an earlier attempt (a resumed campaign)."""
        status = f"acc {accuracy:.3f}" if accuracy is not None else ""
        self._rounds = self.progress.add_task("rounds", total=self.cfg.rounds, completed=done, status=status)

    def round_done(self, round_no: int, reward: float | None, accuracy: float | None) -> None:
        """``reward`` None: a trainer process (the explorer process measures rewards)."""
        parts = [f"reward {reward:.3f}" if reward is not None else "", f"acc {accuracy:.3f}" if accuracy is not None else ""]
        self.progress.update(self._rounds, completed=round_no, status="  ".join(p for p in parts if p))
