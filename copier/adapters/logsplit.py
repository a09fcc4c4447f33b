"""Log lines that fit: a line longer than a limit is split into parts, each a whole JSON document.

The audit record of a deployment is the hosts' journal shipped to a log group
(docs/operations.md). journald splits a line longer than its ``LineMax``
(48 KB) and rsyslog cuts a message at 8 KB: a ``possible_duplicates`` report
naming thousands of event IDs would reach the log group cut or in pieces no
reader can parse, and the runbook's only record of possible duplicates would
be lost. :class:`SplitJSONRenderer` renders an event as usual; when the line
is longer than ``limit`` bytes and the event holds a list (``event_ids``),
it renders the event once per slice of that list instead, each line with
``part`` and ``parts`` and every other field repeated, one line per part
(``copier.chaos`` and an audit read each part as a report of its own: each
ID is named exactly once across the parts).
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
        key = next((k for k, v in event.items() if isinstance(v, list) and len(v) > 1), None)
        if key is None:
            return line
        items: list[Any] = event[key]
        parts: list[list[Any]] = []
        current: list[Any] = []
        base = len(self._line({**event, key: [], "part": 999999, "parts": 999999}).encode())
        size = base
        for item in items:
            cost = len(self.dumps(item, default=repr).encode()) + 2
            if current and size + cost > self.limit:
                parts.append(current)
                current, size = [], base
            current.append(item)
            size += cost
        parts.append(current)
        return "\n".join(
            self._line({**event, key: part, "part": i, "parts": len(parts)}) for i, part in enumerate(parts, start=1)
        )
