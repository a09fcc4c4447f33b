"""The interfaces the protocol code needs from the outside world: a clock and the streams.

``copier.shard`` and ``copier.forward`` are written against these, so they
run the same on the real clock and Kinesis (``copier.shard.SystemClock``,
``copier.kinesis.KinesisStreams``) and on the fakes of ``copier.testing``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from copier.shardmap import ShardMap

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

    def put_records(self, stream: str, entries: Sequence[tuple[str, bytes, str | None]]) -> list[str | None]:
        """One PutRecords attempt: each (partition key, data, data in base64 if at hand) entry's error code,
        None where it landed.

        Raises ``AmbiguousPutError`` when the outcome is unknown.
        """
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
    ) -> Found:
        """Count the identities of records that arrived from ``since_ms`` to ``until_ms`` (None: to the end).

        Only in the shards numbered ``shards`` and the shards descending from
        them (None: every shard).
        """
        ...

    def parents(self, stream: str, shard_id: str) -> list[str]:
        """The parent shard IDs of a shard (one after a split, two after a merge)."""
        ...
