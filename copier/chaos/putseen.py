"""What the chaos proxy keeps of each PutRecords it receives (:class:`PutSeen`), for a failed seed's trace.

A seed that fails on copies no report explains is traced to the puts that
carried them (``copier.chaos.run``): when each arrived, the fault it met,
and how long the backend took to apply it, against the put timeout within
which the protocol assumes a put received is readable.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from copier.core.identity import EventValue

__all__ = ["PutSeen", "event_ids"]


@dataclass(frozen=True)
class PutSeen:
    """One PutRecords the proxy received: when (monotonic seconds, its body read whole), its stream, the event
    IDs its entries carry (None for an entry without one), the fault it met (None: forwarded as is), and how long
    the backend took to answer it (None when it was not forwarded)."""

    at: float
    stream: str
    event_ids: tuple[EventValue | None, ...]
    fault: str | None
    backend_s: float | None
    refused: tuple[int, ...] = ()  # entries failed here, never forwarded (put_partial, the shard limits)


def event_ids(body: bytes) -> tuple[EventValue | None, ...]:
    """The event ID of each entry of a PutRecords body (the producer's reading, not the copier's)."""
    from copier.chaos.producer import read_event_id  # the producer's schedule imports the proxy, which imports this

    try:
        records = json.loads(body)["Records"]
        return tuple(read_event_id(base64.b64decode(r["Data"])) for r in records)
    except (ValueError, KeyError, TypeError):
        return ()
