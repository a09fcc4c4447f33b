"""The interfaces the protocol code needs from the outside world: a clock and the streams.

``copier.shard`` and ``copier.shard.forward`` are written against these, so they
run the same on the real clock and Kinesis (``copier.shard.SystemClock``,
``copier.adapters.kinesis.KinesisStreams``) and on the fakes of ``copier.testing``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from copier.core.positions import Position
from copier.core.shardmap import ShardMap
from copier.core.streamsettings import StreamSettings

if TYPE_CHECKING:
    from copier.core.plan import SourceRecord

__all__ = ["Clock", "Found", "Identity", "Streams"]

#: How a record read back from a stream is recognised: (partition key, data) -> digest.
Identity = Callable[[str, bytes], int]


class Clock(Protocol):
    """Wall-clock milliseconds (leases are compared across hosts) and sleeping."""

    def now_ms(self) -> int: ...
    def sleep_ms(self, ms: int) -> None: ...


@dataclass
class Found:
    """What a verification read found: identities counted, and how much it read to find them."""

    identities: Counter[int] = field(default_factory=Counter)
    records_read: int = 0
    shards_read: int = 0


class Streams(Protocol):
    """The Kinesis calls of a record processor."""

    def put_records(
        self, stream: str, entries: Sequence[tuple[str, bytes, str | None]], deadline: float | None = None
    ) -> list[str | None]:
        """One PutRecords attempt: each (partition key, data, data in base64 if at hand) entry's error code,
        None where it landed.

        ``deadline`` (``time.monotonic()``): no byte of the request leaves after it; a put that cannot be
        sent whole by then is not sent (a TransientAwsError). Raises ``AmbiguousPutError`` when the outcome is
        unknown: the whole request left before the deadline and no answer says what landed.
        """
        ...

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """ListShards: every shard of the stream, open and closed within its retention."""
        ...

    def shard_map(self, stream: str) -> ShardMap:
        """The stream's open shards by hash key range (may be a few minutes old)."""
        ...

    def read_identities(
        self,
        stream: str,
        shards: Collection[int] | None,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
        keep_alive: Callable[[], None] | None = None,
    ) -> Found:
        """Count the identities of records that arrived from ``since_ms`` to ``until_ms`` (None: to the end, an
        empty page at the tip: a shard others keep writing to never shows one, so a verification gives an end).

        Only in the shards numbered ``shards`` and the shards descending from
        them (None: every shard). ``keep_alive`` is called before every page
        read (a long read keeps the caller's lease).
        """
        ...

    def retention(self, stream: str) -> int | None:
        """The stream's retention period in milliseconds (None when it cannot be read)."""
        ...

    def describe(self, stream: str, keep: bool = False) -> StreamSettings:
        """The stream's settings from DescribeStreamSummary now, uncached (a put was just refused: a record limit
        may have been lowered since the cached answer); an ``AwsError`` goes up. ``keep``: the answer becomes
        the one :meth:`settings` gives (and the host's other processors')."""
        ...

    def settings(self, stream: str, refresh: bool = False) -> StreamSettings | None:
        """The stream's settings (DescribeStreamSummary, up to ``SUMMARY_MAX_AGE_S`` old, an answer the host's
        processors may share: ``copier.core.summaryage``; the last known, or None, when they cannot be read,
        never waiting on another processor's call); ``refresh``: at most ``SUMMARY_RETRY_S`` old."""
        ...

    def read_source(self, stream: str, shard_id: str, first: Position, last: Position) -> Iterator[list[SourceRecord]]:
        """A staging shard's records from ``first`` to ``last`` (both included), as the daemon delivers them
        (KPL aggregates de-aggregated), page by page; what the stream's retention removed is not there."""
        ...

    def read_arrivals(
        self, stream: str, shard_id: str, since_ms: int, until_ms: int, keep_alive: Callable[[], None] | None = None
    ) -> Iterator[list[SourceRecord]]:
        """A staging shard's records as the daemon delivers them from AT_TIMESTAMP ``since_ms`` up to (without) the
        first that arrived at or after ``until_ms``, page by page, at most one GetRecords a second; what the
        stream's retention removed is not there. ``keep_alive`` is called before every page."""
        ...

    def shard_entry(self, stream: str, shard_id: str) -> dict[str, Any] | None:
        """A shard's ListShards entry (its hash key range, its parents), None when ListShards does not list it.
        An entry never changes: it may come from a listing a few seconds old that lists the shard, so that a
        takeover's own range and lineage cost one ListShards (a listing is a call per 1,000 shards, and a
        stream takes 1,000 a second)."""
        ...

    def parents(self, stream: str, shard_id: str, ancestor: bool = False) -> list[str]:
        """The parent shard IDs of a shard (one after a split, two after a merge). ``ancestor``: a shard of
        the lineage, not the processor's own: one no longer listed has expired, and has none."""
        ...
