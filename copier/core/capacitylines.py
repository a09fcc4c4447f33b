"""A capacity plan's cost lines and API budgets, from its sizing (``copier.core.capacity``).

The call rates follow from the code and the settings: the application asks DescribeStreamSummary for each of
its ``STREAMS`` once per refresh, whatever its hosts and shards (one answer in the state table, refreshed at a
time drawn between half and all of its life: ``copier.core.summaryboard``), and each host reads that answer
once per refresh (one GetItem of the stream's item); under polling the KCL
reads a shard every ``idleTimeBetweenReadsInMillis``, or at once after a full page of ``maxRecords``; it
renews a lease every third of ``failoverTimeMillis`` and checkpoints every
``copier.checkpointIntervalMillis``; the leader scans the lease table every
``leaseAssignmentIntervalMillis``. The limits are AWS's, per region: the per-shard ones are
:mod:`copier.core.limits`' (the ones readers pace by), the others the Kinesis API reference's and the
DynamoDB service quotas page's, below.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from copier.core.limits import (
    BIG_READ_BYTES,
    READ_BYTES_PER_SHARD_S,
    READ_CALLS_PER_SHARD_S,
    WRITE_BYTES_PER_SHARD_S,
    WRITE_RECORDS_PER_SHARD_S,
)
from copier.core.shardmap import LIST_SHARDS_PAGE, SHARD_MAP_MAX_AGE_S
from copier.core.summaryboard import mean_refresh_s

if TYPE_CHECKING:
    from copier.core.capacity import Plan, Settings

__all__ = ["FLAG_SHARE", "STREAMS", "Budget", "HostLoss", "Line", "budgets", "cost_lines", "host_loss", "window_read_s"]

# AWS's limits that copier.core.limits does not hold. Kinesis API reference, each action's page
# (DescribeStreamSummary, DescribeStream, ListShards, GetShardIterator, SubscribeToShard):
DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S = 20
DESCRIBE_STREAM_PER_ACCOUNT_S = 10
LIST_SHARDS_PER_STREAM_S = 1000
GET_SHARD_ITERATOR_PER_SHARD_S = 5
SUBSCRIBE_PER_CONSUMER_SHARD_S = 1
GET_RECORDS_MAX_RECORDS = 10_000  # a GetRecords page holds at most 10,000 records (and 10 MiB: BIG_READ_BYTES)
SUBSCRIPTION_S = 300  # a SubscribeToShard subscription lasts 5 minutes, then the KCL subscribes again
# DynamoDB service quotas page: per partition (an item collection's key), per on-demand table by default.
PARTITION_WCU = 1000
PARTITION_RCU = 3000
TABLE_RCU = 40_000
TABLE_WCU = 40_000
WRITE_UNIT_BYTES = 1024  # a write request unit writes an item up to 1 KB (a KCL lease, a worker's metrics row)
ITEM_OVERHEAD_BYTES = 100  # DynamoDB bills each item's storage 100 bytes over its attributes (a digest batch's)
READ_UNIT_BYTES = 4096  # a strongly consistent read request unit reads up to 4 KB; eventually consistent: 8 KB
GIB = 1024**3
DAY_S = 86_400
HOUR_S = 3600
MONTH_H = 730  # AWS bills a GB-month as 730 hours

FLAG_SHARE = 0.5  # a budget a plan uses more than half of is flagged: the rest is the KCL's and everyone else's
STREAMS = 2  # the streams a processor reads the settings of: staging and target (copier.shard.guard)


@dataclass(frozen=True)
class Line:
    """One thing the workload costs a day, all regions (``own``: copier's, not the streams' the user pays for
    anyway, whatever copies them)."""

    name: str
    quantity: float
    unit: str
    usd_day: float
    own: bool


@dataclass(frozen=True)
class Budget:
    """One API's (or table's) steady call rate against its limit, in one region."""

    api: str
    scope: str
    rate: float
    limit: float
    unit: str
    caller: str  # whose calls are counted

    @property
    def share(self) -> float:
        return self.rate / self.limit

    @property
    def flagged(self) -> bool:
        return self.share > FLAG_SHARE


@dataclass(frozen=True)
class HostLoss:
    """What a host's loss costs, at most: each successor loads its shard's window from the state table (strongly
    consistent reads), and, if the shard had a chunk in flight, verifies it (``copier.shard.inflight``) by
    reading the target shards the chunk's keys hash to, over ``copier.core.capacity.Settings.verify_span_s``.
    Those reads are shared with the target's other consumers, which are throttled while they last."""

    processors: int
    target_shards_a_chunk: float  # distinct target shards a chunk's forwarded events hash to (keys at random)
    readers_a_target_shard: float  # successors reading each target shard
    bytes_a_reader: float
    pages_a_reader: int
    window_read_units: float  # a shard's window loaded once

    @property
    def window_read_s(self) -> float:
        """Seconds the successors' window loads take of the state table's reads: a shard's items are one
        partition's, all of them the table's."""
        return window_read_s(self.window_read_units, self.processors)

    @property
    def iterator_s(self) -> float:
        """Seconds of a target shard's GetShardIterator budget (one call a reader)."""
        return self.readers_a_target_shard / GET_SHARD_ITERATOR_PER_SHARD_S

    @property
    def read_s(self) -> float:
        """Seconds of a target shard's GetRecords budget, by calls or by bytes, whichever is longer."""
        calls = self.readers_a_target_shard * self.pages_a_reader / READ_CALLS_PER_SHARD_S
        return max(calls, self.readers_a_target_shard * self.bytes_a_reader / READ_BYTES_PER_SHARD_S)


def window_read_s(units: float, shards: int) -> float:
    """Seconds ``shards`` windows of ``units`` read units each take at a partition's and a table's default limit."""
    return max(units / PARTITION_RCU, shards * units / TABLE_RCU)


def host_loss(p: Plan, s: Settings) -> HostLoss:
    """:class:`HostLoss` for the plan's hosts (the target has the staging stream's shard count)."""
    chunk = p.chunk_events * (1 - p.workload.duplicate_rate)
    shards = p.shards * (1 - (1 - 1 / p.shards) ** chunk)  # expected distinct shards of ``chunk`` random keys
    records = p.events_per_shard_s * (1 - p.workload.duplicate_rate) * s.verify_span_s
    read = records * p.workload.record_bytes
    return HostLoss(
        processors=p.shards_per_host,
        target_shards_a_chunk=shards,
        readers_a_target_shard=p.shards_per_host * shards / p.shards,
        bytes_a_reader=read,
        pages_a_reader=max(1, math.ceil(max(records / GET_RECORDS_MAX_RECORDS, read / BIG_READ_BYTES))),
        window_read_units=p.takeover_read_units,
    )


def _lease_writes_s(p: Plan, s: Settings) -> float:
    """The KCL lease table's writes a second: a renewal every third of failoverTimeMillis, copier's checkpoints."""
    checkpoints = 1 / s.checkpoint_s if s.checkpoint_s > 0 else p.events_per_shard_s / p.chunk_events  # 0: each chunk
    return p.shards * (3 / s.failover_s + checkpoints)


def _lease_reads_s(p: Plan, s: Settings) -> float:
    """The leader's scans of the lease and worker-metrics tables (a unit per 8 KB, eventually consistent)."""
    return (p.shards + p.hosts) * WRITE_UNIT_BYTES / (2 * READ_UNIT_BYTES) / s.assignment_s


def cost_lines(p: Plan, s: Settings, units_per_event: float, prices: Mapping[str, Any]) -> list[Line]:
    """What the plan costs a day, all regions, at the price table's prices."""
    w, k, d = p.workload, prices["kinesis"], prices["dynamodb"]
    regions = w.regions
    events_day = w.events_per_s * DAY_S
    forwarded_day = events_day * (1 - w.duplicate_rate)
    put_units = math.ceil(w.record_bytes / k["put_payload_unit_bytes"])
    shard_hours = p.shards * regions * 24
    writes_day = forwarded_day * units_per_event
    kcl_writes_day = (_lease_writes_s(p, s) + p.hosts / s.metrics_s) * DAY_S * regions
    kcl_reads_day = _lease_reads_s(p, s) * DAY_S * regions
    lines = [
        Line(
            f"hosts ({p.instance})",
            p.hosts * regions * 24,
            "instance-hours",
            p.hosts * regions * 24 * prices["instances"][p.instance]["hour"],
            True,
        ),
        Line(
            "state table writes",
            writes_day,
            "write request units",
            writes_day * d["write_request_units_per_million"] / 1e6,
            True,
        ),
        Line(
            "state table storage",
            p.state_storage_gib * regions,
            "GiB",
            p.state_storage_gib * regions * d["storage_gb_month"] * 24 / MONTH_H,
            True,
        ),
        Line(
            "KCL tables' writes",
            kcl_writes_day,
            "write request units",
            kcl_writes_day * d["write_request_units_per_million"] / 1e6,
            True,
        ),
        Line(
            "KCL tables' reads",
            kcl_reads_day,
            "read request units",
            kcl_reads_day * d["read_request_units_per_million"] / 1e6,
            True,
        ),
    ]
    if w.retrieval == "FANOUT":
        gb = events_day * w.record_bytes / 1e9
        lines += [
            Line(
                "fan-out consumer",
                shard_hours,
                "consumer-shard-hours",
                shard_hours * k["efo_consumer_shard_hour"],
                True,
            ),
            Line("fan-out retrieval", gb, "GB", gb * k["efo_retrieval_per_gb"], True),
        ]
    lines += [
        Line("staging stream shards", shard_hours, "shard-hours", shard_hours * k["shard_hour"], False),
        Line(
            "staging stream puts",
            events_day * put_units,
            "PUT payload units",
            events_day * put_units * k["put_payload_units_per_million"] / 1e6,
            False,
        ),
        Line("target stream shards", shard_hours, "shard-hours", shard_hours * k["shard_hour"], False),
        Line(
            "target stream puts",
            forwarded_day * put_units,
            "PUT payload units",
            forwarded_day * put_units * k["put_payload_units_per_million"] / 1e6,
            False,
        ),
    ]
    return lines


def budgets(p: Plan, s: Settings, units_per_event: float) -> list[Budget]:
    """Each API's and table's steady rate in one region against its limit (the target has the staging
    stream's shard count, so a target shard takes a staging shard's forwarded events)."""
    w = p.workload
    per_shard, forwarded = p.events_per_shard_s, p.events_per_shard_s * (1 - w.duplicate_rate)
    found = [
        Budget(
            "DescribeStreamSummary",
            "account",
            STREAMS / mean_refresh_s(),
            DESCRIBE_STREAM_SUMMARY_PER_ACCOUNT_S,
            "calls/s",
            "copier's application (one answer per stream in the state table)",
        ),
        Budget(
            "GetItem (a stream's answer)",
            "item",
            p.hosts / mean_refresh_s(),
            PARTITION_RCU,
            "reads/s",
            "copier's hosts: each reads the application's answer of a stream once per refresh",
        ),
        Budget("DescribeStream", "account", 0.0, DESCRIBE_STREAM_PER_ACCOUNT_S, "calls/s", "copier never calls it"),
        Budget(
            "ListShards",
            "stream",
            p.hosts * math.ceil(p.shards / LIST_SHARDS_PAGE) / SHARD_MAP_MAX_AGE_S,
            LIST_SHARDS_PER_STREAM_S,
            "calls/s",
            "copier's hosts: each lists the target for its processors' chunks every 300 s (one shared map)",
        ),
        Budget(
            "GetShardIterator",
            "shard",
            0.0,
            GET_SHARD_ITERATOR_PER_SHARD_S,
            "calls/s",
            "the KCL and verification reads: at a lease's start and a takeover only",
        ),
    ]
    if w.retrieval == "POLLING":
        found += [
            Budget(
                "GetRecords",
                "shard",
                max(1 / s.idle_s, per_shard / s.max_records),
                READ_CALLS_PER_SHARD_S,
                "calls/s",
                "the KCL for copier",
            ),
            Budget(
                "GetRecords bytes",
                "shard",
                per_shard * w.record_bytes,
                READ_BYTES_PER_SHARD_S,
                "bytes/s",
                "the KCL for copier",
            ),
        ]
    else:
        found += [
            Budget(
                "SubscribeToShard",
                "consumer and shard",
                1 / SUBSCRIPTION_S,
                SUBSCRIBE_PER_CONSUMER_SHARD_S,
                "calls/s",
                "the KCL for copier",
            ),
            Budget(
                "SubscribeToShard bytes",
                "consumer and shard",
                per_shard * w.record_bytes,
                READ_BYTES_PER_SHARD_S,
                "bytes/s",
                "the KCL for copier",
            ),
        ]
    found += [
        Budget("PutRecords records", "target shard", forwarded, WRITE_RECORDS_PER_SHARD_S, "records/s", "copier"),
        Budget(
            "PutRecords bytes", "target shard", forwarded * w.record_bytes, WRITE_BYTES_PER_SHARD_S, "bytes/s", "copier"
        ),
        Budget(
            "state table writes",
            "partition (one shard's items)",
            forwarded * units_per_event,
            PARTITION_WCU,
            "WCU",
            "copier",
        ),
        Budget("state table writes", "table", p.shards * forwarded * units_per_event, TABLE_WCU, "WCU", "copier"),
        Budget("KCL lease table writes", "table", _lease_writes_s(p, s), TABLE_WCU, "WCU", "the KCL for copier"),
    ]
    return found
