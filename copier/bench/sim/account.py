"""A fake AWS account for the control-plane simulation: two Kinesis streams whose shards split and merge, and
the limits AWS enforces on their API calls, as token buckets answering AWS's errors.

The limits are :mod:`copier.core.capacitylines`' (the Kinesis API reference's, each action's page) and
:mod:`copier.core.limits`' (GetRecords per shard). A bucket holds one second of its rate (AWS does not say
how much burst it allows: one second is the least that lets a steady rate at the limit through). A call past
its bucket is refused as AWS refuses it: ``LimitExceededException`` for the per-account and per-stream limits
(DescribeStreamSummary, DescribeStream, ListShards, SubscribeToShard), ``ProvisionedThroughputExceededException``
for the per-shard ones (GetShardIterator, GetRecords). Every call is counted, refused or not, in the second it
was made, under its scope (the account, a stream, a shard) and its caller (copier, or the KCL), for
:mod:`copier.bench.sim.report`.

The streams answer through :class:`Wire`, which stands in for the lean path's HTTP client
(``copier.adapters.awsjson.JsonClient.call``): ``copier.adapters.leankinesis.LeanKinesis`` and
``copier.adapters.kinesis.KinesisStreams`` above it are copier's own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from copier.core.capacitylines import (
    DESCRIBE_STREAM_PER_ACCOUNT_S,
    DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S,
    GET_SHARD_ITERATOR_PER_SHARD_S,
    LIST_SHARDS_PER_STREAM_S,
    PARTITION_RCU,
    PARTITION_WCU,
    SUBSCRIBE_PER_CONSUMER_SHARD_S,
)
from copier.core.errors import TransientAwsError
from copier.core.limits import READ_CALLS_PER_SHARD_S
from copier.core.streamsettings import PARTITION_KEY

__all__ = ["LIMITS", "PAGE_SHARDS", "Account", "Limit", "Stream", "Wire"]

HASH_SPACE = 2**128
PAGE_SHARDS = 1000  # ListShards' MaxResults: at most 1,000 shards a page, the default (API reference)


@dataclass(frozen=True)
class Limit:
    """One API's limit: ``rate`` calls a second per ``scope`` ("account", "stream", "shard", "consumer-shard"),
    refused with ``error``."""

    rate: float
    scope: str
    error: str


LIMITS: dict[str, Limit] = {
    "DescribeStreamSummary": Limit(DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S, "account", "LimitExceededException"),
    "DescribeStream": Limit(DESCRIBE_STREAM_PER_ACCOUNT_S, "account", "LimitExceededException"),
    "ListShards": Limit(LIST_SHARDS_PER_STREAM_S, "stream", "LimitExceededException"),
    "GetShardIterator": Limit(GET_SHARD_ITERATOR_PER_SHARD_S, "shard", "ProvisionedThroughputExceededException"),
    "GetRecords": Limit(READ_CALLS_PER_SHARD_S, "shard", "ProvisionedThroughputExceededException"),
    "SubscribeToShard": Limit(SUBSCRIBE_PER_CONSUMER_SHARD_S, "consumer-shard", "LimitExceededException"),
    # The application's answers in the state table (copier.core.summaryboard): one item per stream, whose reads
    # and writes are bounded by its partition's (a hot item's) 3,000 read and 1,000 write units a second.
    "GetItem": Limit(PARTITION_RCU, "item", "ProvisionedThroughputExceededException"),
    "PutItem": Limit(PARTITION_WCU, "item", "ProvisionedThroughputExceededException"),
}


class _Bucket:
    """A token bucket of one second's calls, refilled continuously; a call at a time before the last one's
    (a processor's clock a little ahead) refills nothing."""

    __slots__ = ("rate", "tokens", "last")

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.tokens = rate
        self.last = 0.0

    def take(self, now: float) -> bool:
        if now > self.last:
            self.tokens = min(self.rate, self.tokens + (now - self.last) * self.rate)
            self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


@dataclass
class Stream:
    """A stream's shards (ListShards entries, oldest first) and the settings DescribeStreamSummary gives."""

    name: str
    shards: list[dict[str, Any]] = field(default_factory=list)
    distribution: str = PARTITION_KEY
    max_record_kib: int = 1024
    retention_hours: int = 24
    _pages: list[dict[str, Any]] | None = None
    _next: int = 0
    _index: dict[str, dict[str, Any]] = field(default_factory=dict)
    _open: int = 0

    @classmethod
    def even(cls, name: str, count: int) -> Stream:
        """A stream of ``count`` shards splitting the hash key space evenly."""
        stream = cls(name)
        step = HASH_SPACE // count
        for i in range(count):
            high = HASH_SPACE - 1 if i == count - 1 else (i + 1) * step - 1
            stream._add(i * step, high, ())
        return stream

    def _add(self, low: int, high: int, parents: tuple[str, ...]) -> str:
        shard_id = f"shardId-{self._next:012d}"
        self._next += 1
        entry: dict[str, Any] = {
            "ShardId": shard_id,
            "HashKeyRange": {"StartingHashKey": str(low), "EndingHashKey": str(high)},
            "SequenceNumberRange": {"StartingSequenceNumber": str(self._next)},
        }
        if parents:
            entry["ParentShardId"] = parents[0]
        if len(parents) > 1:
            entry["AdjacentParentShardId"] = parents[1]
        self.shards.append(entry)
        self._index[shard_id] = entry
        self._open += 1
        self._pages = None
        return shard_id

    def entry(self, shard_id: str) -> dict[str, Any]:
        """A shard's ListShards entry."""
        return self._index[shard_id]

    def _close(self, shard_id: str) -> dict[str, Any]:
        entry = self._index[shard_id]
        entry["SequenceNumberRange"] = {**entry["SequenceNumberRange"], "EndingSequenceNumber": str(self._next)}
        self._open -= 1
        return entry

    def open_ids(self) -> list[str]:
        return [s["ShardId"] for s in self.shards if "EndingSequenceNumber" not in s["SequenceNumberRange"]]

    def split(self, shard_id: str) -> list[str]:
        """Split an open shard at the middle of its range (SplitShard): two children, the parent closed."""
        keys = self._close(shard_id)["HashKeyRange"]
        low, high = int(keys["StartingHashKey"]), int(keys["EndingHashKey"])
        middle = (low + high) // 2
        return [self._add(low, middle, (shard_id,)), self._add(middle + 1, high, (shard_id,))]

    def merge(self, first: str, second: str) -> str:
        """Merge two adjacent open shards (MergeShards): one child, both parents closed."""
        a, b = self._close(first)["HashKeyRange"], self._close(second)["HashKeyRange"]
        low = min(int(a["StartingHashKey"]), int(b["StartingHashKey"]))
        high = max(int(a["EndingHashKey"]), int(b["EndingHashKey"]))
        return self._add(low, high, (first, second))

    def pages(self) -> list[dict[str, Any]]:
        """ListShards' pages of this listing (the same objects until the shards change: the simulation's
        processors list the target stream every few minutes each, and building them is the fake's cost)."""
        if self._pages is None:
            chunks = [self.shards[i : i + PAGE_SHARDS] for i in range(0, len(self.shards), PAGE_SHARDS)] or [[]]
            self._pages = [
                {"Shards": chunk, **({"NextToken": f"{self.name}:{n + 1}"} if n + 1 < len(chunks) else {})}
                for n, chunk in enumerate(chunks)
            ]
        return self._pages

    def summary(self) -> dict[str, Any]:
        return {
            "StreamDescriptionSummary": {
                "StreamName": self.name,
                "StreamStatus": "ACTIVE",
                "RetentionPeriodHours": self.retention_hours,
                "MaxRecordSizeInKiB": self.max_record_kib,
                "RecordDistributionStrategy": self.distribution,
                "EncryptionType": "NONE",
                "StreamModeDetails": {"StreamMode": "PROVISIONED"},
                "OpenShardCount": self._open,
            }
        }


class Account:
    """The streams and the limits of one account and region; ``enforce`` False counts without refusing."""

    def __init__(self, streams: list[Stream], enforce: bool = True) -> None:
        self.streams = {s.name: s for s in streams}
        self.enforce = enforce
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        # (api, caller) -> {scope key -> {second -> calls}}; throttled: (api, caller) -> count
        self.calls: dict[tuple[str, str], dict[str, dict[int, int]]] = defaultdict(lambda: defaultdict(dict))
        self.throttled: dict[tuple[str, str], int] = defaultdict(int)

    def call(self, api: str, scope_key: str, caller: str, now: float, count: int = 1) -> bool:
        """Count ``count`` calls of ``api`` at ``now`` on ``scope_key`` (a stream or shard name, "" for the
        account); False when AWS would refuse them (each refused call is counted as made and as throttled)."""
        limit = LIMITS[api]
        per_second = self.calls[(api, caller)][scope_key]
        second = int(now)
        per_second[second] = per_second.get(second, 0) + count
        key = (api, scope_key)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(limit.rate)
        allowed = all([bucket.take(now) for _ in range(count)])
        if not allowed and self.enforce:
            self.throttled[(api, caller)] += 1
            return False
        return True

    def refuse(self, api: str) -> TransientAwsError:
        """AWS's answer to a throttled call, as the lean client raises it (a 400 whose code retrying may fix)."""
        return TransientAwsError(api, LIMITS[api].error, "Rate exceeded")

    def answer(self, api: str, params: dict[str, Any], caller: str, now: float) -> dict[str, Any]:
        """The answer to one Kinesis call, or AWS's refusal raised."""
        if api == "ListShards":
            token = params.get("NextToken")
            name, page = token.split(":") if token else (params["StreamName"], "0")
            if not self.call(api, name, caller, now):
                raise self.refuse(api)
            return self.streams[name].pages()[int(page)]
        if api == "DescribeStreamSummary":
            if not self.call(api, "", caller, now):
                raise self.refuse(api)
            return self.streams[params["StreamName"]].summary()
        if api == "GetShardIterator":
            if not self.call(api, f"{params['StreamName']}/{params['ShardId']}", caller, now):
                raise self.refuse(api)
            return {"ShardIterator": "sim"}
        raise AssertionError(f"the simulation's account does not answer {api}")


class Wire:
    """The lean path's client (``JsonClient.call``) for one processor: its calls answered by ``account`` at
    the processor's time (``clock.monotonic``), counted as ``caller``'s."""

    def __init__(self, account: Account, clock: Any, caller: str = "copier") -> None:
        self.account = account
        self.clock = clock
        self.caller = caller

    def call(self, operation: str, body: bytes, deadline: float | None = None) -> dict[str, Any]:
        return self.account.answer(operation, json.loads(body), self.caller, self.clock.monotonic())
