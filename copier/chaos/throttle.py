"""The chaos proxy's shard limits on real requests: which shard each call is for, and what the limits refuse.

:class:`copier.chaos.limits.ShardLimits` counts per shard; a request names
no shard, so this module finds it, as Kinesis does:

* a PutRecords entry goes to the open shard whose hash key range holds its
  ``ExplicitHashKey``, or the MD5 of its partition key
  (:mod:`copier.core.shardmap`, from the stream's ListShards, taken again
  when it is a second old or a key falls in no open shard's range: a
  reshard); a record whose key still falls in none is left to the backend;
* a GetRecords names a shard iterator: the shard of every iterator the
  backend handed out (GetShardIterator's, and each GetRecords'
  ``NextShardIterator``) is kept, so the iterators of any backend work,
  whatever their format.

What the limits refuse is answered as Kinesis answers it: an entry of a
PutRecords with ``ProvisionedThroughputExceededException`` and a "Rate
exceeded" message (the others land); a GetRecords with HTTP 400 and that
error (:data:`READ_REFUSED`).
"""

from __future__ import annotations

import base64
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from copier.chaos.limits import ShardLimits
from copier.core.shardmap import ShardMap, hash_key

__all__ = ["READ_REFUSED", "ShardThrottle", "stream_of"]

READ_REFUSED = "ProvisionedThroughputExceededException"
MAP_MAX_AGE_S = 1.0


def stream_of(request: dict[str, Any]) -> str:
    """The stream a Kinesis request is for: its StreamName, or the name in its StreamARN ("" if neither)."""
    name = request.get("StreamName")
    if name:
        return str(name)
    return str(request.get("StreamARN", "")).rpartition("stream/")[2]


def rate_exceeded(stream: str, shard: str) -> str:
    """Kinesis' message for a throttled shard (the account is the local backends' dummy one)."""
    return f"Rate exceeded for shard {shard} in stream {stream} under account 123456789012."


class ShardThrottle:
    """The limits, the streams' shard maps and the iterators' shards (thread-safe: the proxy serves in threads).

    ``list_shards(stream)`` returns the stream's ListShards entries (the proxy reads them from the backend).
    """

    def __init__(self, limits: ShardLimits, list_shards: Callable[[str], list[dict[str, Any]]]) -> None:
        self.limits = limits
        self.list_shards = list_shards
        self._lock = threading.Lock()
        self._maps: dict[str, tuple[float, ShardMap]] = {}
        self._iterators: dict[str, tuple[str, str]] = {}  # shard iterator -> (stream, shard)
        self.refused: Counter[tuple[str, str]] = Counter()  # ("put_entries" or "reads", stream) -> how many

    def _map(self, stream: str, fresh: bool) -> ShardMap:
        now = self.limits.clock()
        held = self._maps.get(stream)
        if held is None or fresh or now - held[0] > MAP_MAX_AGE_S:
            held = self._maps[stream] = (now, ShardMap.of(self.list_shards(stream)))
        return held[1]

    def put_refusals(self, request: dict[str, Any]) -> dict[int, tuple[str, str]]:
        """The entries of a PutRecords the limits refuse: index -> (error code, message)."""
        stream = stream_of(request)
        records = request.get("Records", [])
        keys = [int(r["ExplicitHashKey"]) if r.get("ExplicitHashKey") else hash_key(r["PartitionKey"]) for r in records]
        sizes = [len(base64.b64decode(r["Data"])) + len(r["PartitionKey"].encode("utf-8")) for r in records]
        with self._lock:
            shard_map = self._map(stream, fresh=False)
            if any(shard_map.position_for_hash(k) < 0 for k in keys):
                shard_map = self._map(stream, fresh=True)  # resharded since the map was taken
            shards = [shard_map.ranges[i][2] if i >= 0 else None for i in map(shard_map.position_for_hash, keys)]
            admitted = self.limits.admit_puts(stream, list(zip(shards, sizes, strict=True)))
            refused = {
                i: (READ_REFUSED, rate_exceeded(stream, shard or ""))
                for i, (ok, shard) in enumerate(zip(admitted, shards, strict=True))
                if not ok
            }
            self.refused["put_entries", stream] += len(refused)
            return refused

    def read_refusal(self, request: dict[str, Any]) -> str | None:
        """The message to refuse this GetRecords with, or None to serve it (an iterator of no known shard is
        served: the limits cannot tell its shard)."""
        with self._lock:
            where = self._iterators.get(str(request.get("ShardIterator")))
            if where is None or self.limits.admit_read(*where):
                return None
            self.refused["reads", where[0]] += 1
            return rate_exceeded(*where)

    def answered(self, operation: str, request: dict[str, Any], answer: dict[str, Any]) -> None:
        """Learn from a served answer: the shard of each iterator handed out, and the bytes a GetRecords read."""
        with self._lock:
            if operation == "GetShardIterator" and answer.get("ShardIterator"):
                self._iterators[answer["ShardIterator"]] = (stream_of(request), str(request["ShardId"]))
            elif operation == "GetRecords":
                where = self._iterators.get(str(request.get("ShardIterator")))  # kept: a reader may send it again
                if where is None:
                    return
                if answer.get("NextShardIterator"):
                    self._iterators[answer["NextShardIterator"]] = where
                size = sum(
                    len(base64.b64decode(r["Data"])) + len(r.get("PartitionKey", "").encode("utf-8"))
                    for r in answer.get("Records", [])
                )
                self.limits.charge_read(*where, size)
