"""A :class:`~copier.adapters.streamreader.StreamReader` over the in-memory streams, for running ``copier redrive``,
``copier repair`` and ``copier verify`` in process on the fakes of ``copier.testing``.

The staging stream's records are those a test added with ``add_staging`` (read back as ``read_source`` gives
them); any other stream's are those put to it. Both honour the stream's retention on the fake clock, as
Kinesis' trim horizon does, and shards come parents first, as ``StreamReader.shards`` orders them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from copier.adapters.streamreader import KinesisRecord, lineage_order
from copier.core.positions import Position
from copier.core.shardmap import shard_number
from copier.testing import InMemoryStreams

__all__ = ["FakeReader"]

T = TypeVar("T")
EVERYTHING = Position(10**30)


def _stamp(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


class FakeReader:
    """What the commands read of whole streams (see the module docstring)."""

    def __init__(self, streams: InMemoryStreams, staging: str = "staging") -> None:
        self.streams = streams
        self.staging = staging

    def shards(self, stream: str) -> list[dict[str, Any]]:
        return lineage_order(self.streams.shards(stream))

    def retention(self, stream: str) -> int | None:
        return self.streams.retention(stream)

    def records(self, stream: str, shard_id: str, since_ms: int | None = None) -> list[KinesisRecord]:
        """A shard's records within the retention, from ``since_ms`` (an arrival) on if given."""
        if stream == self.staging:
            found = [
                {
                    "SequenceNumber": r.position.seq_str,
                    "PartitionKey": r.partition_key,
                    "Data": r.data,
                    "ApproximateArrivalTimestamp": _stamp(r.arrival_ms),
                }
                for page in self.streams.read_source(stream, shard_id, Position(0), EVERYTHING)
                for r in page
            ]
        else:
            oldest = self.streams.clock.now_ms() - (self.streams.retention(stream) or 24 * 3_600_000)
            number = shard_number(shard_id)
            found = [
                {
                    "SequenceNumber": str(seq),
                    "PartitionKey": key,
                    "Data": data,
                    "ApproximateArrivalTimestamp": _stamp(at),
                }
                for seq, (key, data, at, shard) in enumerate(self.streams.records.get(stream, []), start=1)
                if shard == number and at >= oldest
            ]
        if since_ms is None:
            return found
        return [r for r in found if r["ApproximateArrivalTimestamp"] >= _stamp(since_ms)]

    def pages(
        self,
        stream: str,
        shard_id: str,
        after: str | None = None,
        label: str | None = None,
        since_ms: int | None = None,
    ) -> Iterator[list[KinesisRecord]]:
        found = self.records(stream, shard_id, since_ms)
        if found:
            yield found

    def read(
        self,
        stream: str,
        label: str,
        convert: Callable[[str, KinesisRecord], T],
        on_page: Callable[[str], None] | None = None,
    ) -> list[T]:
        return [convert(s["ShardId"], r) for s in self.shards(stream) for r in self.records(stream, s["ShardId"])]
