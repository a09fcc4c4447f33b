"""Log lines that fit: a line longer than a limit is split into parts, each a whole JSON document.

The audit record of a deployment is the hosts' journal shipped to a log group
(docs/operations.md). journald splits a line longer than its ``LineMax``
(48 KB) and rsyslog cuts a message at 8 KB: a ``possible_duplicates`` report
naming thousands of event IDs would reach the log group cut or in pieces no
reader can parse, and the runbook's only record of possible duplicates would
be lost. :class:`SplitJSONRenderer` renders an event as usual; when the line
is longer than ``limit`` bytes and the event holds lists (``event_ids``,
``unkeyed_digests``), it renders the event once per slice of them instead,
each line with ``part`` and ``parts``, every other field repeated, and every
list field present with its slice (often empty), one line per part
(``copier.chaos`` and an audit read each part as a report of its own: each
ID and each digest is named exactly once across the parts, never repeated
in every part, where it would excuse a copy per part).
"""

from __future__ import annotations

import json
from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["LINE_LIMIT", "SplitJSONRenderer"]

LINE_LIMIT = 4000  # bytes: under rsyslog's 8 KB message limit with room for its header

EventDict = MutableMapping[str, Any]


class SplitJSONRenderer:
    """structlog's final processor: one JSON line per event, or several when one would exceed ``limit``."""

    def __init__(self, limit: int = LINE_LIMIT, dumps: Callable[..., str] = json.dumps) -> None:
        self.limit = limit
        self.dumps = dumps

    def _line(self, event: EventDict) -> str:
        return self.dumps(event, default=repr)

    def __call__(self, logger: Any, name: str, event: EventDict) -> str:
        line = self._line(event)
        if len(line.encode()) <= self.limit:
            return line
        keys = [k for k, v in event.items() if isinstance(v, list)]
        if sum(len(event[k]) for k in keys) < 2:
            return line
        empty: dict[str, list[Any]] = {k: [] for k in keys}
        base = len(self._line({**event, **empty, "part": 999999, "parts": 999999}).encode())
        parts: list[dict[str, list[Any]]] = []
        current: dict[str, list[Any]] = {k: [] for k in keys}
        size, count = base, 0
        for key in keys:
            for item in event[key]:
                cost = len(self.dumps(item, default=repr).encode()) + 2
                if count and size + cost > self.limit:
                    parts.append(current)
                    current, size, count = {k: [] for k in keys}, base, 0
                current[key].append(item)
                size += cost
                count += 1
        parts.append(current)
        return "\n".join(
            self._line({**event, **part, "part": i, "parts": len(parts)}) for i, part in enumerate(parts, start=1)
        )
