"""Small deliveries wait to be forwarded together (``copier.coalesceEvents``, ``copier.coalesceMillis``).

That saves two state writes a delivery on a quiet shard. A waiting record is
acknowledged to the daemon but not committed, so the KCL checkpoint never
passes it and a crash replays it.
"""

from __future__ import annotations

from collections.abc import Sequence

from copier.core.config import Config
from copier.core.plan import SourceRecord
from copier.core.ports import Clock

__all__ = ["Coalescer"]


class Coalescer:
    """The records waiting to be forwarded together."""

    def __init__(self, config: Config, clock: Clock) -> None:
        self.config = config
        self.clock = clock
        self.waiting: list[SourceRecord] = []
        self._since = 0

    def offer(self, records: Sequence[SourceRecord]) -> list[SourceRecord] | None:
        """The records to forward now (these and those waiting), or None: they wait. Without coalescing,
        everything goes at once."""
        if not self.config.coalescing:
            return self.take() + list(records)
        now = self.clock.now_ms()
        if records and not self.waiting:
            self._since = now
        self.waiting.extend(records)
        due = now - self._since >= self.config.coalesce_millis
        if not self.waiting or (len(self.waiting) < self.config.coalesce_events and not due):
            return None
        return self.take()

    def take(self) -> list[SourceRecord]:
        """Everything waiting, now (a flush, a fence, a shard's end)."""
        records, self.waiting = self.waiting, []
        return records
