"""The shards of the in-memory streams: their ListShards entries, and resharding them as Kinesis does.

:class:`ShardLayout` is the shard half of
:class:`copier.testing.streams.InMemoryStreams` (a mixin, so that the fake
stays one object with one set of attributes, as tests use it): the listed
shards, the possibly stale shard map a processor gets, SplitShard and
MergeShards, and the lineage ListShards tells.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from copier.core.errors import TransientAwsError
from copier.core.shardmap import ShardMap, shard_id_of, shard_number
from copier.testing.clock import FakeClock

__all__ = ["ShardLayout", "even_shards", "shards_from"]


def even_shards(count: int) -> list[dict[str, Any]]:
    """ListShards entries of ``count`` open shards splitting the hash key space evenly."""
    step = 2**128 // count
    return shards_from([n * step for n in range(count)])


def shards_from(starts: Sequence[int]) -> list[dict[str, Any]]:
    """ListShards entries of open shards starting at these hash keys (the first 0), each ending where the next
    starts, the last at the top of the key space."""
    ends = [start - 1 for start in starts[1:]] + [2**128 - 1]
    return [
        {
            "ShardId": shard_id_of(n),
            "HashKeyRange": {"StartingHashKey": str(start), "EndingHashKey": str(end)},
            "SequenceNumberRange": {"StartingSequenceNumber": "0"},
        }
        for n, (start, end) in enumerate(zip(starts, ends, strict=True))
    ]


class ShardLayout:
    """The shards of :class:`~copier.testing.streams.InMemoryStreams` (see its docstring): listing, the cached
    shard map, splits and merges, parents. The attributes are set by ``InMemoryStreams.__init__``."""

    clock: FakeClock
    shard_counts: dict[str, int]
    shard_parents: dict[str, list[str]]
    map_max_age_ms: int | None
    unlisted: set[str]
    _listed: dict[str, list[dict[str, Any]]]
    _maps: dict[str, tuple[int, ShardMap]]

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """ListShards: every shard of the stream, open and closed, but a closed one in ``unlisted`` (expired with
        the retention: Kinesis lists a closed shard only within it; ``unlisted`` names shards of any stream, and
        an open shard is always listed)."""
        return [s for s in self._layout(stream) if not self._expired(s)]

    def _expired(self, shard: dict[str, Any]) -> bool:
        return shard["ShardId"] in self.unlisted and "EndingSequenceNumber" in shard["SequenceNumberRange"]

    def _layout(self, stream: str) -> list[dict[str, Any]]:
        """Every shard the stream ever had, listed or not."""
        if stream not in self._listed:
            self._listed[stream] = even_shards(self.shard_counts.get(stream, 1))
        return self._listed[stream]

    def not_listed(self, stream: str, shard_id: str) -> TransientAwsError | None:
        """The error a read of a closed shard ListShards no longer lists meets (``KinesisReads``: ShardNotListed)."""
        if any(s["ShardId"] == shard_id and self._expired(s) for s in self._layout(stream)):
            return TransientAwsError("ListShards", "ShardNotListed", f"{shard_id} is not listed in {stream} yet")
        return None

    def set_ranges(self, stream: str, starts: Sequence[int]) -> None:
        """The stream's shards start at these hash keys (the first 0): set before anything reads the stream."""
        self._listed[stream] = shards_from(starts)

    def current_map(self, stream: str) -> ShardMap:
        """The open shards now (what a fresh ListShards says)."""
        return ShardMap.of(self.shards(stream))

    def shard_map(self, stream: str) -> ShardMap:
        now = self.clock.now_ms()
        cached = self._maps.get(stream)
        if self.map_max_age_ms is None:
            return self.current_map(stream)
        if cached is None or now - cached[0] > self.map_max_age_ms:
            cached = (now, self.current_map(stream))
            self._maps[stream] = cached
        return cached[1]

    def refresh_map(self, stream: str) -> None:
        """The processor's cached shard map is refreshed now (as after its maximum age)."""
        self._maps[stream] = (self.clock.now_ms(), self.current_map(stream))

    def _new_shard(self, stream: str, low: int, high: int, parents: list[str]) -> dict[str, Any]:
        listed = self._layout(stream)
        number = max(shard_number(s["ShardId"]) for s in listed) + 1
        shard: dict[str, Any] = {
            "ShardId": shard_id_of(number),
            "HashKeyRange": {"StartingHashKey": str(low), "EndingHashKey": str(high)},
            "SequenceNumberRange": {"StartingSequenceNumber": "0"},
            "ParentShardId": parents[0],
        }
        if len(parents) > 1:
            shard["AdjacentParentShardId"] = parents[1]
        listed.append(shard)
        self.shard_parents[shard["ShardId"]] = list(parents)
        return shard

    def _open(self, stream: str, shard_id: str) -> dict[str, Any]:
        for shard in self._layout(stream):
            if shard["ShardId"] == shard_id and "EndingSequenceNumber" not in shard["SequenceNumberRange"]:
                return shard
        raise ValueError(f"{shard_id} is not an open shard of {stream}")

    def split(self, stream: str, shard_id: str) -> list[str]:
        """SplitShard at the middle of the shard's range: the parent closes, two children open."""
        parent = self._open(stream, shard_id)
        low, high = int(parent["HashKeyRange"]["StartingHashKey"]), int(parent["HashKeyRange"]["EndingHashKey"])
        middle = (low + high) // 2
        parent["SequenceNumberRange"]["EndingSequenceNumber"] = "1"
        return [
            self._new_shard(stream, low, middle, [shard_id])["ShardId"],
            self._new_shard(stream, middle + 1, high, [shard_id])["ShardId"],
        ]

    def merge(self, stream: str, shard_id: str, adjacent_id: str) -> str:
        """MergeShards of two adjacent open shards: both close, one child covers both ranges."""
        a, b = self._open(stream, shard_id), self._open(stream, adjacent_id)
        ranges = [int(s["HashKeyRange"][k]) for s in (a, b) for k in ("StartingHashKey", "EndingHashKey")]
        for shard in (a, b):
            shard["SequenceNumberRange"]["EndingSequenceNumber"] = "1"
        return str(self._new_shard(stream, min(ranges), max(ranges), [shard_id, adjacent_id])["ShardId"])

    def adjacent_open_pairs(self, stream: str) -> list[tuple[str, str]]:
        """Pairs of open shards whose hash key ranges touch (what MergeShards accepts)."""
        ranges = self.current_map(stream).ranges
        return [
            (ranges[i][2], ranges[i + 1][2]) for i in range(len(ranges) - 1) if ranges[i][1] + 1 == ranges[i + 1][0]
        ]

    def shard_entry(self, stream: str, shard_id: str) -> dict[str, Any] | None:
        """The shard's entry as ListShards gives it (None: not listed)."""
        return next((s for s in self.shards(stream) if s["ShardId"] == shard_id), None)

    def parents(self, stream: str, shard_id: str, ancestor: bool = False) -> list[str]:
        """As ListShards tells: a shard in ``unlisted`` has expired (an ancestor: no parents; the processor's
        own shard: not listed yet, a transient error)."""
        if shard_id in self.unlisted:
            if ancestor:
                return []
            raise TransientAwsError("ListShards", "ShardNotListed", f"{shard_id} is not listed in {stream} yet")
        return list(self.shard_parents.get(shard_id, []))
