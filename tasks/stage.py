"""What every stage task does around its component call: time it, log its metrics at step = round."""

from __future__ import annotations

import time
from collections.abc import Callable

from components.tracking import Tracker


def tracked(name: str, step: int, tracker: Tracker, work: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Run ``work``, add ``time/<name>_s``, log the metrics to MLflow, return them."""
    start = time.perf_counter()
    metrics = {k: float(v) for k, v in work().items()}
    metrics[f"time/{name}_s"] = time.perf_counter() - start
    tracker.log_metrics(metrics, step=step)
    return metrics
