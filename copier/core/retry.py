"""Backoff with full jitter, for every retry copier makes."""

from __future__ import annotations

import random

__all__ = ["backoff_ms"]


def backoff_ms(attempt: int, max_ms: int, base_ms: int = 50, rng: random.Random | None = None) -> int:
    """Sleep before retry number ``attempt`` (0-based): uniform in [0, min(max, base * 2**attempt)].

    Full jitter spreads the retries of many shards that failed together
    (a throttled target) instead of having them collide again.
    """
    ceiling = min(max_ms, base_ms * (2 ** min(attempt, 30)))
    return int((rng or random).uniform(0, ceiling))
