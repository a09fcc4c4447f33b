"""A stream's retention as the protocol's rules read it, and what they assume when it cannot be read.

Two rules need it and fall back differently, each to the safe side: a digest batch's lifetime counts an
unknown retention as Kinesis' longest (365 days: kept too long costs storage, kept too short a duplicate),
and a verification read counts it as Kinesis' shortest (24 h: a read that may have missed expired records
says so). Kept out of the session: it is one rule and the warning that goes with it.
"""

from __future__ import annotations

from typing import Any

from copier.core.errors import AwsError
from copier.core.ports import Clock, Streams

__all__ = ["MIN_RETENTION_MS", "RETENTION_SLACK_MS", "Retentions"]

MIN_RETENTION_MS = 24 * 3_600_000  # Kinesis keeps records at least this long
RETENTION_SLACK_MS = 5 * 60_000  # a read starting this close to the trim horizon may miss what expires under it


class Retentions:
    """Reads retentions through the streams' cached DescribeStreamSummary; says once per stream when one cannot
    be read, and again once it can after it could not."""

    def __init__(self, streams: Streams, clock: Clock) -> None:
        self.streams = streams
        self.clock = clock
        self._unknown: set[str] = set()  # streams whose retention could not be read (said once)

    def get(self, stream: str, log: Any) -> int | None:
        """A stream's retention (ms), None when it cannot be read (then the rules that need it fall back,
        and say so once on ``log`` until it can be read again)."""
        try:
            retention = self.streams.retention(stream)
        except AwsError as exc:
            retention, error = None, str(exc)
        else:
            error = "DescribeStreamSummary gave no retention"
        if retention is None and stream not in self._unknown:
            self._unknown.add(stream)
            log.warning(
                "retention_unknown",
                stream=stream,
                error=error,
                detail="until it is read: digest batches are kept as if it were 365 days (Kinesis' longest), "
                "a verification read counts it as 24 h (Kinesis' shortest); asked again every 30 s",
            )
        elif retention is not None:
            self._unknown.discard(stream)
        return retention

    def beyond(self, stream: str, since_ms: int, log: Any) -> bool:
        """Could records from ``since_ms`` on have expired from ``stream`` already? A retention that cannot be
        read counts as Kinesis' shortest (24 h): the answer may then be yes when it is no, never the reverse."""
        retention = self.get(stream, log) or MIN_RETENTION_MS
        return since_ms < self.clock.now_ms() - retention + RETENTION_SLACK_MS
