"""The ``progress`` line a shard logs at INFO every ``copier.progressIntervalSeconds``.

Kept apart from the session: it reads only the state item's counters and a clock, and INFO is where an
operator reads what was forwarded, so what it says (since the last line, the totals, how far behind) is
one small rule of its own.
"""

from __future__ import annotations

from typing import Any

from copier.core.ports import Clock
from copier.core.state import ShardState

__all__ = ["ProgressLine"]

COUNTED = ("forwarded", "duplicates", "replays", "dead_lettered")


def _totals(state: ShardState | None) -> dict[str, int]:
    counters = state.counters if state is not None else {}
    return {name: counters.get(name, 0) for name in COUNTED}


class ProgressLine:
    """When the last ``progress`` line was said, and the totals it counted from."""

    def __init__(self, interval_seconds: int, clock: Clock) -> None:
        self.interval_ms = interval_seconds * 1000
        self.clock = clock
        self._at = clock.now_ms()
        self._counts: dict[str, int] | None = None  # the totals at the last line (None: no takeover yet)

    def tick(self, state: ShardState | None, log: Any) -> None:
        """Say a line on ``log`` (the session's, bound to the shard and epoch as they are now) if an interval
        has passed since the last (0: never): what this shard did since, its totals, and how far behind."""
        if not self.interval_ms or state is None:
            return
        totals = _totals(state)
        if self._counts is None:  # no takeover counted from: from here
            self._counts = totals
        now = self.clock.now_ms()
        if now - self._at < self.interval_ms:
            return
        since = {f"{name}_since": totals[name] - self._counts[name] for name in totals}
        log.info(
            "progress",
            **since,
            **totals,
            behind_ms=state.behind_ms,
            position=str(state.position) if state.position else None,
            seconds=round((now - self._at) / 1000, 1),
        )
        self._at = now
        self._counts = totals

    def restart(self, state: ShardState | None) -> None:
        """The next line counts from ``state`` as it is now (after a takeover)."""
        self._counts = _totals(state)
        self._at = self.clock.now_ms()
