"""FakeClock: the fixed clock the other fakes and the tests run on.

Leases, retention, TTLs and stale shard maps are all measured on it, so a
test moves time by advancing it instead of waiting.
"""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock that moves only when slept on or advanced: tests of leases need no waiting."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms
        self.slept: list[int] = []

    def now_ms(self) -> int:
        return self.now

    def sleep_ms(self, ms: int) -> None:
        self.slept.append(ms)
        self.now += max(0, ms)

    def advance(self, ms: int) -> None:
        self.now += ms
