"""What ``copier.ordering = partitionKey`` costs: forwarding time against ``none``, hot keys and distinct keys.

With partitionKey, one round of PutRecords sends only the earliest unlanded
entry of each key; a chunk whose busiest key has N entries takes N rounds.
Distinct keys cost nothing (one round, as with none); hot keys cost rounds.
Each case forwards the same events through a real ``copier process`` over
the MultiLang protocol (batches as the daemon delivers them), against the
local backend; the time is the wall time of the deliveries (each is
acknowledged only once forwarded and committed; coalescing is off).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.local.multilang import Processor, records_message

__all__ = ["OrderingResult", "measure"]


@dataclass(frozen=True)
class OrderingResult:
    keys: str  # "distinct" or "hot (N keys)"
    ordering: str
    events: int
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "ordering": self.ordering,
            "events": self.events,
            "seconds": round(self.seconds, 3),
            "events_per_s": round(self.events_per_s),
        }


def _events(first: int, count: int, hot_keys: int, run: str) -> list[tuple[str, bytes]]:
    return [
        (f"k{n % hot_keys}" if hot_keys else f"{run}-k{n}", json.dumps({"eventId": f"{run}-{n}", "n": n}).encode())
        for n in range(first, first + count)
    ]


def measure(properties: Path, shard: str, ordering: str, hot_keys: int, events: int, batch: int) -> OrderingResult:
    """Forward ``events`` in deliveries of ``batch`` through one processor; ``hot_keys`` 0 means distinct keys."""
    run = f"{ordering}-{hot_keys}"
    proc = Processor(properties, shard)
    try:
        proc.initialize(shard)
        lines = [records_message(_events(first, batch, hot_keys, run), 1 + first) for first in range(0, events, batch)]
        started = time.perf_counter()
        for line in lines:
            proc.process_json(line)
        seconds = time.perf_counter() - started
    finally:
        proc.close()
    keys = f"hot ({hot_keys} keys)" if hot_keys else "distinct"
    return OrderingResult(keys, ordering, events, seconds)
