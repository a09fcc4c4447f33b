"""The metrics of a redrive or a repair run (``copier redrive``, ``copier repair``), through the processors' emitter.

Kept apart from a shard's metrics (``copier.adapters.metrics``): what a run
sends is not what the live copier forwarded, and must not add to
``EventsForwarded``. Per shard the run works on (dimension ``ShardId``:
``redrive:<dead-letter shard>`` or ``repair:<staging shard>``, beside
``[Application]`` and ``[Application, WorkerId]``):

* ``RedriveInProgress`` / ``RepairInProgress`` (None): 1 while a run works on the
  shard, 0 once it is done with it (a run killed leaves no 0: the metric
  stops, which an alarm on "1 for an hour" or a missing datapoint shows);
* ``EventsRedriven`` / ``EventsRepaired`` (Count): events the run sent since
  its last emit.

Every ``copier.metricsIntervalSeconds`` and when the run leaves a shard; best
effort, as every metric of copier (nothing when ``copier.metrics = none``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from copier.adapters.metrics import MetricsEmitter, Values

__all__ = ["SourceMetrics"]


class SourceMetrics:
    """One run's metrics; ``kind`` "Redrive" or "Repair"; see the module docstring."""

    def __init__(
        self,
        emitter: MetricsEmitter | None,
        kind: str,
        interval_s: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.emitter = emitter
        self.kind = kind
        self.interval_s = interval_s
        self._clock = clock
        self._last = float("-inf")
        self._sent: dict[str, int] = {}

    def sent(self, shard_id: str, count: int, done: bool = False) -> None:
        """``count`` more events sent on ``shard_id``; emitted when an interval has passed, or the run is ``done``
        with the shard."""
        self._sent[shard_id] = self._sent.get(shard_id, 0) + count
        if self.emitter is None:
            return
        now = self._clock()
        if not done and now - self._last < self.interval_s:
            return
        self._last = now
        label = f"{self.kind.lower()}:{shard_id}"
        events = "EventsRedriven" if self.kind == "Redrive" else "EventsRepaired"
        values: Values = {
            f"{self.kind}InProgress": (0.0 if done else 1.0, "None"),
            events: (float(self._sent.pop(shard_id, 0)), "Count"),
        }
        self.emitter.emit(label, values, {}, {"Source": self.kind.lower()})
