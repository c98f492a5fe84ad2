"""Length shaping of explorer rows, added to their reward (``reward.shaping``; off by default).

Each function takes the rows' response lengths in tokens (and, for Kimi's, their groups and
correctness) and returns one shaping value per row; the round adds weight · value to each row's
total and logs the values as ``reward/fn/<name>/mean``. Accuracy never reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rftflow.components.config import ShapingConfig


def overlong_penalty(length: int, max_tokens: int, cache_tokens: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), with
    L_max = ``max_tokens``, L_cache = ``cache_tokens``, |y| = ``length``::

        R_length(y) = 0                               if |y| ≤ L_max − L_cache
                      ((L_max − L_cache) − |y|) / L_cache   if L_max − L_cache < |y| ≤ L_max
                      −1                              if L_max < |y|
    """
    expected = max_tokens - cache_tokens
    if length <= expected:
        return 0.0
    if length <= max_tokens:
        return (expected - length) / cache_tokens
    return -1.0


def length_rewards(lengths: Sequence[int], groups: Sequence[str], correct: Sequence[bool]) -> list[float]:
    """Kimi k1.5's length reward (Kimi Team 2025, arXiv:2501.12599, §2.3.3) within each group (the k
    responses to one task), min_len and max_len over the group::

        λ = 0.5 − (len(i) − min_len) / (max_len − min_len)
        len_reward(i) = λ              if response i is correct
                        min(0, λ)      otherwise

    A group whose responses all have one length gets 0 (λ has no denominator: no length signal)."""
    spans: dict[str, tuple[int, int]] = {}
    for length, group in zip(lengths, groups):
        low, high = spans.get(group, (length, length))
        spans[group] = (min(low, length), max(high, length))
    out = []
    for length, group, ok in zip(lengths, groups, correct):
        low, high = spans[group]
        if high == low:
            out.append(0.0)
            continue
        lam = 0.5 - (length - low) / (high - low)
        out.append(lam if ok else min(0.0, lam))
    return out


def shaping_terms(cfg: ShapingConfig, max_new_tokens: int, lengths: Sequence[int], groups: Sequence[str],
                  correct: Sequence[bool]) -> dict[str, tuple[float, list[float]]]:
    """The configured shaping terms, name → (weight, a value per row): ``overlong`` (L_max defaults
    to ``max_new_tokens``, the explorer's budget) and ``length``."""
    out: dict[str, tuple[float, list[float]]] = {}
    if cfg.overlong is not None:
        budget = cfg.overlong.max_tokens or max_new_tokens
        out["overlong"] = (cfg.overlong.weight, [overlong_penalty(n, budget, cfg.overlong.cache_tokens)
                                                 for n in lengths])
    if cfg.length is not None:
        out["length"] = (cfg.length.weight, length_rewards(lengths, groups, correct))
    return out


def shaping_range(cfg: ShapingConfig) -> tuple[float, float]:
    """The least and most the shaping terms add to a row's total."""
    low = high = 0.0
    if cfg.overlong is not None:
        low -= cfg.overlong.weight
    if cfg.length is not None:
        low, high = low - 0.5 * cfg.length.weight, high + 0.5 * cfg.length.weight
    return low, high
