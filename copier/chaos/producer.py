"""The chaos suite's producer: what a PySpark job writes to staging, duplicates and poison included.

It writes the plan's events at a steady pace for ``produce_s`` seconds, in
batches that are either plain records or KPL aggregates of 50 to 300 events
(grouped per open shard, as ``copier.spark`` does, so an event's duplicates
land on its shard); a share of batches has a slice written again at once (a
retried task), and some events are written again a minute after the
original (a micro-batch replayed after a restart); poison records (JSON
without an ID, bytes that are not JSON, a record of a megabyte) go in
between. Only failed entries are retried, as the real writer does.

Event IDs exercise the edges of identity (:func:`event_id`): most are
strings, but some are JSON integers, some strings of the same digits (the
integer 1000015 and the string "1000015" are two events), some unicode, some
300 characters long. Every event carries its ID twice: ``eventId`` and, in a
nested object, ``meta.alt`` (:func:`alt_id`: ``"a-"`` and the ID as JSON), so
that workers may run with either as ``copier.dedupKey`` (a rolling deploy
changing it) while the check identifies every event by ``eventId``.

Poison records are what their kind says: ``no_id`` is JSON without an event
ID, ``not_json`` bytes that are not JSON, ``oversize`` a record larger than
the target's record limit (the staging stream's limit is raised to
:data:`STAGING_MAX_RECORD_KIB` with UpdateMaxRecordSize, as Kinesis now
allows), of a size drawn around that limit. Each is distinct (no two have
the same bytes), so that the check can count the copies of each one.

It records every user record it wrote (:attr:`Output.records`, in the
order they landed, duplicates included: production order, but for an entry
that failed and was written again, after the entries of its put that did
not fail, as it is in its shard; the ``limits`` profile's throttled puts
do that): its event ID as read from its own
bytes, its partition key, the SHA-256 of its bytes, its staging position
(shard, sequence number, index inside a KPL aggregate) and, for poison, the
dead-letter reason it must get. Also the last position written per shard,
so the harness knows when the copier has caught up. A reshard takes
:attr:`ChaosProducer.lock` so no batch is grouped by a stale shard map; so
does a switch of the staging stream to ``RecordDistributionStrategy = AUTO``,
during which the producer writes plain records only (the KCL would drop the
user records of an aggregate put on a shard whose range does not hold them,
a loss no processor sees: docs/protocol.md, "Stream settings").
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from copier.adapters.kinesis import paged_shards
from copier.chaos.schedule import Plan
from copier.core import kpl
from copier.core.audittypes import Produced
from copier.core.identity import EventValue
from copier.core.limits import MAX_RECORD_BYTES
from copier.core.positions import Position
from copier.core.shardmap import ShardMap, hash_key

__all__ = [
    "ALT_PREFIX",
    "STAGING_MAX_RECORD_KIB",
    "ChaosProducer",
    "Output",
    "Poison",
    "alt_id",
    "event_id",
    "read_event_id",
]

TICK_S = 0.5
STAGING_MAX_RECORD_KIB = 2048  # staging takes records the target (1 MiB) cannot: they must be dead-lettered
ALT_PREFIX = "a-"  # an event's "meta.alt" field: this and its eventId as JSON
POISON_REASONS = {"no_id": "no_id", "not_json": "no_id", "oversize": "oversize"}  # kind -> audit reason kind


def event_id(n: int, run: str) -> EventValue:
    """The ID of event ``n``: a string mostly, and four kinds of edge in every eleven (see the module docstring)."""
    kind = n % 11
    if kind == 1:
        return 1_000_000_000 + n  # a JSON integer
    if kind == 2:
        return str(1_000_000_000 + n - 1)  # the same digits as the event before, as a string: another event
    if kind == 3:
        return f"ü-{run}-{n}-日本"
    if kind == 4:
        return f"{run}-{n:07d}-" + "x" * 300
    return f"{run}-{n:07d}"


def alt_id(value: EventValue) -> str:
    """The event's second ID field (``meta.alt``), one to one with its eventId (1 and "1" stay apart)."""
    return ALT_PREFIX + json.dumps(value, ensure_ascii=False)


def read_event_id(data: bytes) -> EventValue | None:
    """The ``eventId`` in a record's bytes, read here and not with the copier's code (a shared bug would hide in
    both): a JSON object's string or integer member; None for anything else."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    value = doc.get("eventId")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return value


@dataclass(frozen=True)
class Poison:
    """A record the copier must dead-letter (or, under unkeyedPolicy = forward, may forward), and where it is."""

    kind: str
    shard_id: str
    sequence_number: str
    sha256: str
    size: int = 0  # bytes counted against the record limit (data and UTF-8 partition key)


@dataclass
class Output:
    """What the producer wrote, as it wrote it (see the module docstring)."""

    records: list[Produced] = field(default_factory=list)
    poison: list[Poison] = field(default_factory=list)
    last: dict[str, Position] = field(default_factory=dict)
    staging_records: int = 0  # Kinesis records written (an aggregate counts once)
    events: int = 0  # keyed events written, duplicates included
    duplicates: int = 0  # events written again (at once or late)
    aggregates: int = 0
    largest_aggregate: int = 0

    @property
    def keyed_ids(self) -> set[EventValue]:
        return {r.event_id for r in self.records if r.event_id is not None}


def _event(n: int, run: str, filler: int = 80) -> tuple[EventValue, str, bytes]:
    value = event_id(n, run)
    body = {"eventId": value, "meta": {"alt": alt_id(value)}, "n": n, "body": "x" * filler}
    return value, f"user-{n % 64}", json.dumps(body, ensure_ascii=False).encode()


class ChaosProducer:
    """Runs in a thread of the harness; see the module docstring."""

    def __init__(self, kinesis: Any, stream: str, plan: Plan, run: str) -> None:
        self.kinesis = kinesis
        self.stream = stream
        self.plan = plan
        self.run_id = run
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.lock = threading.Lock()  # held for each put; a reshard holds it too
        self.out = Output()
        self._map: ShardMap | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.plain_only = False  # the staging stream ignores partition keys: no KPL aggregates

    def reshard(self, change: Callable[[], None]) -> None:
        """Run a split or merge between two puts, and group later batches by the new shards."""
        with self.lock:
            change()
            self._map = None

    def distribute(self, change: Callable[[], None], auto: bool) -> None:
        """Switch the stream's record distribution between two puts; while ``auto``, write no aggregates."""
        with self.lock:
            change()
            self.plain_only = auto

    def stop(self) -> None:
        self._stop.set()

    # -- writing ----------------------------------------------------------------------

    def _shard_map(self) -> ShardMap:
        if self._map is None:
            self._map = ShardMap.of(paged_shards(self.kinesis.list_shards, self.stream))
        return self._map

    def _put(
        self, records: list[kpl.KinesisRecord], counts: list[int], dead_letter: str | None = None
    ) -> list[tuple[str, str]]:
        """PutRecords until every record landed (failed ones alone retried); (shard, sequence) of each."""
        where: list[tuple[str, str] | None] = [None] * len(records)
        landed: list[int] = []  # in the order they landed: a retried entry lands after the entries that did not fail
        left = list(range(len(records)))
        attempt = 0
        while left:
            request = [
                {"PartitionKey": records[i].partition_key, "Data": records[i].data}
                | ({"ExplicitHashKey": records[i].explicit_hash_key} if records[i].explicit_hash_key else {})
                for i in left
            ]
            answer = self.kinesis.put_records(StreamName=self.stream, Records=request)
            failed = []
            for i, result in zip(left, answer["Records"], strict=True):
                if result.get("ErrorCode"):
                    failed.append(i)
                    continue
                where[i] = (result["ShardId"], result["SequenceNumber"])
                landed.append(i)
                position = Position(int(result["SequenceNumber"]), counts[i] - 1)
                shard = result["ShardId"]
                if shard not in self.out.last or self.out.last[shard] < position:
                    self.out.last[shard] = position
            left = failed
            if left:
                time.sleep(min(1.0, 0.05 * 2**attempt) * self.rng.random())
                attempt += 1
        self.out.staging_records += len(records)
        placed = [w for w in where if w is not None]
        for i in landed:
            self._note(records[i], *placed[i], dead_letter)
        return placed

    def _note(self, record: kpl.KinesisRecord, shard: str, sequence: str, dead_letter: str | None = None) -> None:
        """Each user record of a written Kinesis record, as the daemon will deliver it, into the output."""
        users = kpl.deaggregate(record.data, record.partition_key)
        for index, (pk, data) in enumerate(users):
            value = read_event_id(data)
            self.out.records.append(
                Produced(
                    value,
                    pk,
                    hashlib.sha256(data).hexdigest(),
                    (shard, int(sequence), index),  # a plain record is its own user record 0
                    dead_letter,
                    len(data) + len(pk.encode("utf-8")),
                )
            )
            if value is not None:
                self.out.events += 1

    def _write(self, events: list[tuple[EventValue, str, bytes]], aggregate: bool) -> None:
        with self.lock:
            if aggregate and not self.plain_only:
                shard_map = self._shard_map()
                groups: dict[int, list[tuple[str, bytes]]] = {}
                for _, pk, data in events:
                    groups.setdefault(shard_map.position_for_hash(hash_key(pk)), []).append((pk, data))
                records: list[kpl.KinesisRecord] = []
                counts: list[int] = []
                for group in groups.values():
                    for record in kpl.aggregate(group):
                        records.append(record)
                        counts.append(len(kpl.deaggregate(record.data, record.partition_key)))
                self.out.aggregates += sum(1 for c in counts if c > 1)
                self.out.largest_aggregate = max([self.out.largest_aggregate, *counts])
            else:
                records = [kpl.KinesisRecord(pk, None, data) for _, pk, data in events]
                counts = [1] * len(records)
            self._put(records, counts)

    def _poison(self, kind: str) -> None:
        key = f"poison-{kind}"
        if kind == "oversize":  # over the target's limit by one byte, or by up to the staging stream's room
            over = (
                1 if self.rng.random() < 0.5 else self.rng.randint(2, STAGING_MAX_RECORD_KIB * 1024 - MAX_RECORD_BYTES)
            )
            size = MAX_RECORD_BYTES + over - len(key)
            data = bytes(self.rng.getrandbits(8) for _ in range(16)) + b"\x00" * (size - 16)
        else:
            data = {
                "no_id": json.dumps({"body": "an event without an ID", "poison": len(self.out.poison)}).encode(),
                "not_json": b"\xff\xfe not json " + bytes(self.rng.getrandbits(8) for _ in range(16)),
            }[kind]
        record = kpl.KinesisRecord(key, None, data)
        with self.lock:
            ((shard, sequence),) = self._put([record], [1], POISON_REASONS[kind])
        self.out.poison.append(Poison(kind, shard, sequence, hashlib.sha256(data).hexdigest(), len(data) + len(key)))

    def run(self) -> None:
        """The thread's body: write everything the plan says, then set :attr:`done`."""
        try:
            self._run()
        except BaseException as error:  # reported by the harness as the seed's failure
            self.error = error
        finally:
            self.done.set()

    def _run(self) -> None:
        plan = self.plan
        start = time.monotonic()
        ticks = max(1, int(plan.produce_s / TICK_S))
        per_tick = max(1, plan.events // ticks)
        poison_at: dict[int, list[str]] = {}  # two drawn for one tick are both written
        for kind in plan.poison:
            poison_at.setdefault(self.rng.randrange(ticks), []).append(kind)
        late_at = int(plan.late_at_s / TICK_S)
        written: list[tuple[EventValue, str, bytes]] = []
        n = 0
        for tick in range(max(ticks, late_at) + 1):
            if self._stop.is_set():
                return
            time.sleep(max(0.0, start + tick * TICK_S - time.monotonic()))
            aggregate = self.rng.random() < plan.aggregate_share
            size = self.rng.randint(*plan.aggregate_events) if aggregate else per_tick
            size = min(size, plan.events - n)
            if size > 0:
                batch = [_event(i, self.run_id, plan.event_bytes) for i in range(n, n + size)]
                n += size
                written.extend(batch)
                self._write(batch, aggregate)
                if self.rng.random() < plan.retry_share:  # a retried task writes a slice again
                    a = self.rng.randrange(len(batch))
                    again = batch[a : a + self.rng.randint(1, max(1, len(batch) // 3))]
                    self._write(again, aggregate)
                    self.out.duplicates += len(again)
            for kind in poison_at.get(tick, ()):
                self._poison(kind)
            if tick == late_at and written:  # the oldest events, written again long after
                late = written[: plan.late_duplicates]
                self._write(late, False)
                self.out.duplicates += len(late)
