"""Processor CPU per event, through the real MultiLang protocol: copier against a plain at-least-once copier.

Each case (payload size, batch size) is run by both processors, driven
over their pipes exactly as the KCL daemon drives them (``copier.local.
multilang``), against the same local backend: ``initialize``, one warm-up
batch, then ``events`` events in batches. What is measured is the
processor process's own user + system CPU time (``/proc/<pid>/stat``)
across the measured batches, divided by the events: the protocol parsing,
de-serialisation and PutRecords that both pay, and what copier adds
(event IDs, digests, the window, its state writes). Runs alternate between
the processors and repeat; the median is kept, and the ratio is taken
within a repetition, so a noisy machine moves both alike.

copier coalesces deliveries smaller than ``copier.coalesceEvents`` (500) by
default. For those batch sizes it is measured twice: as configured by
default, and with coalescing off (``copier.coalesceEvents = 1``: each
delivery forwarded and committed alone), so the table shows what the
coalescing buys and what the rest costs. After the last batch the driver
waits out ``copier.coalesceMillis`` and sends an empty delivery, as the
daemon does, so that events still waiting are forwarded inside the
measurement.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.core.config import load_config
from copier.core.errors import CopierError
from copier.core.shardmap import hash_key
from copier.local.multilang import Processor, records_message

__all__ = [
    "CpuCase",
    "CpuResult",
    "KeyRange",
    "bench_properties",
    "key_in",
    "measure",
    "messages",
    "payload",
    "run_case",
    "shard_range",
]


@dataclass(frozen=True)
class CpuCase:
    payload_bytes: int
    batch: int
    events: int


@dataclass(frozen=True)
class CpuResult:
    case: CpuCase
    plain_us: float  # median CPU microseconds per event
    copier_us: float  # copier as configured by default (coalescing small deliveries)
    ratio: float  # median of the per-repetition ratios copier / plain
    repeats: int
    alone_us: float | None = None  # copier with coalescing off, where the batch is below coalesceEvents
    alone_ratio: float | None = None

    @property
    def copier_events_per_core_s(self) -> float:
        return 1e6 / self.copier_us

    def to_json(self) -> dict[str, Any]:
        return {
            "payload_bytes": self.case.payload_bytes,
            "batch": self.case.batch,
            "events": self.case.events,
            "plain_us_per_event": round(self.plain_us, 2),
            "copier_us_per_event": round(self.copier_us, 2),
            "ratio": round(self.ratio, 3),
            "copier_events_per_core_s": round(self.copier_events_per_core_s),
            "uncoalesced_us_per_event": None if self.alone_us is None else round(self.alone_us, 2),
            "uncoalesced_ratio": None if self.alone_ratio is None else round(self.alone_ratio, 3),
            "repeats": self.repeats,
        }


def bench_properties(path: Path, endpoint: str, **more: str) -> Path:
    """The properties every benchmark processor runs with (streams bench-staging and bench-target), plus ``more``."""
    from copier.local.multilang import COPIER
    from copier.local.pipeline import local_properties

    return local_properties(
        path,
        endpoint,
        "bench",
        "bench-staging",
        "bench-target",
        COPIER,
        logLevel="INFO",
        checkpointIntervalMillis="60000",
        dedupWindowMaxEvents="10000000",
        kcl=None,
        **more,
    )


def payload(n: int, size: int, run: str) -> tuple[str, bytes]:
    """(event ID, a JSON event of about ``size`` bytes): what a Spark job writes."""
    event_id = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{run}-{n}"))
    doc = {"eventId": event_id, "user": f"user-{n % 1000}", "amount": n % 997, "kind": "purchase", "body": ""}
    doc["body"] = "x" * max(0, size - len(json.dumps(doc)))
    return event_id, json.dumps(doc).encode()


KeyRange = tuple[int, int]  # a staging shard's hash key range (ListShards' HashKeyRange)


def key_in(event_id: str, key_range: KeyRange | None) -> str:
    """The partition key of an event delivered on the shard of ``key_range``: its ID, or its ID and the first
    suffix whose MD5 hash falls in the range, as Kinesis routes a key (None: the ID, wherever it hashes).

    A record on a shard its key does not hash to is what a stream ignoring keys delivers (AUTO, or an
    ExplicitHashKey): copier reports every such record as a possible duplicate before its put
    (``copier.shard.guard``), a log line per chunk naming every ID, which is not the path a stream that
    routes by key takes, and not the cost this benchmark is for.
    """
    if key_range is None:
        return event_id
    low, high = key_range
    key, suffix = event_id, 0
    while not low <= hash_key(key) <= high:
        key, suffix = f"{event_id}-{suffix}", suffix + 1
    return key


def messages(case: CpuCase, run: str, first_seq: int, key_range: KeyRange | None = None) -> Iterator[str]:
    """The processRecords lines of a case, encoded up front so that encoding is not measured; each record's key
    hashes into ``key_range`` (:func:`key_in`)."""
    for first in range(0, case.events, case.batch):
        entries = [payload(n, case.payload_bytes, run) for n in range(first, min(case.events, first + case.batch))]
        yield records_message([(key_in(key, key_range), data) for key, data in entries], first_seq + first)


def shard_range(properties: Path, shard: str) -> KeyRange:
    """The hash key range of a staging shard, from ListShards on the backend ``properties`` name."""
    import boto3

    from copier.adapters.kinesis import paged_shards

    config = load_config(properties)
    kinesis = boto3.session.Session(region_name=config.region).client("kinesis", endpoint_url=config.kinesis_endpoint)
    for entry in paged_shards(kinesis.list_shards, config.stream_name):
        if entry["ShardId"] == shard:
            keys = entry["HashKeyRange"]
            return int(keys["StartingHashKey"]), int(keys["EndingHashKey"])
    raise CopierError(f"{config.stream_name} has no shard {shard}")


def measure(command: list[str] | None, properties: Path, case: CpuCase, shard: str, run: str) -> float:
    """CPU seconds per event of one processor over one case (records whose keys hash to ``shard``)."""
    key_range = shard_range(properties, shard)
    proc = Processor(properties, shard, command)
    try:
        proc.initialize(shard)
        warm_up = CpuCase(case.payload_bytes, min(case.batch, 500), min(case.batch, 500))
        for message in messages(warm_up, f"{run}-warm", 1, key_range):
            proc.process_json(message)
        lines = list(messages(case, run, 1_000_000, key_range))
        before = proc.cpu_seconds()
        for message in lines:
            proc.process_json(message)
        time.sleep(DRAIN_WAIT_S)  # then an empty delivery: whatever still waits to be coalesced goes out
        proc.process_json(records_message([], 1_000_000 + case.events))
        spent = proc.cpu_seconds() - before
    finally:
        proc.close()
    if spent < MIN_TICKS / os.sysconf("SC_CLK_TCK"):
        raise CopierError(
            f"{case.events} events of {case.payload_bytes} B took {spent * 1000:.0f} ms of CPU, under {MIN_TICKS} "
            "clock ticks: too few to measure (CPU time is counted in ticks of 10 ms); run more events"
        )
    return spent / case.events


#: The least CPU time a measurement may take, in clock ticks, to be more than rounding.
MIN_TICKS = 3


#: Longer than the ``copier.coalesceMillis`` default (200 ms) the benchmark runs with.
DRAIN_WAIT_S = 0.3


def run_case(
    properties: Path,
    uncoalesced: Path | None,
    plain_command: list[str],
    case: CpuCase,
    repeats: int,
    shards: Iterator[str],
) -> CpuResult:
    """Each processor ``repeats`` times, in rotating order; medians and the median ratios.

    ``uncoalesced``: a properties file with coalescing off, to measure copier that way too.
    """
    runs: list[tuple[str, list[str] | None, Path]] = [
        ("plain", plain_command, properties),
        ("copier", None, properties),
    ]
    if uncoalesced is not None:
        runs.append(("alone", None, uncoalesced))
    spent: dict[str, list[float]] = {kind: [] for kind, _, _ in runs}
    for r in range(repeats):
        run = uuid.uuid4().hex[:8]
        for kind, command, props in runs[r % len(runs) :] + runs[: r % len(runs)]:
            spent[kind].append(measure(command, props, case, next(shards), f"{run}-{kind}"))

    def ratio(kind: str) -> float:
        return statistics.median(c / p for c, p in zip(spent[kind], spent["plain"], strict=True))

    def median_us(kind: str) -> float:
        return statistics.median(spent[kind]) * 1e6

    alone = uncoalesced is not None
    return CpuResult(
        case,
        median_us("plain"),
        median_us("copier"),
        ratio("copier"),
        repeats,
        median_us("alone") if alone else None,
        ratio("alone") if alone else None,
    )
