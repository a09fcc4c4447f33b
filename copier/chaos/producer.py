"""The chaos suite's producer: what a PySpark job writes to staging, duplicates and poison included.

It writes the plan's events at a steady pace for ``produce_s`` seconds, in
batches that are either plain records or KPL aggregates of 50 to 300 events
(grouped per open shard, as ``copier.spark`` does, so an event's duplicates
land on its shard); a share of batches has a slice written again at once (a
retried task), and some events are written again a minute after the
original (a micro-batch replayed after a restart); poison records (JSON
without an ID, bytes that are not JSON, a record of a megabyte) go in
between. Only failed entries are retried, as the real writer does.

Every event carries its ID twice: ``eventId`` and ``alt`` (``"a-"`` and the
same ID), so that workers may run with either as ``copier.dedupKey`` (a
rolling deploy changing it) while the check identifies every event by
``eventId`` (:func:`original_id` maps an ``alt`` back). Each poison record
is distinct (no two have the same bytes), so that the check can count the
copies of each one, in the target too (under ``unkeyedPolicy = forward``).

It records the manifest (keyed event IDs in first-production order), every
poison record's staging position, and the last position written per shard,
so the harness knows when the copier has caught up. A reshard takes
:attr:`ChaosProducer.lock` so no batch is grouped by a stale shard map.
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

from copier import kpl
from copier.chaos.schedule import Plan
from copier.kinesis import paged_shards
from copier.positions import Position
from copier.shardmap import ShardMap, hash_key

__all__ = ["ALT_PREFIX", "ChaosProducer", "Poison", "Produced", "alt_id", "original_id"]

TICK_S = 0.5
OVERSIZE_BYTES = 1_000_000  # under the 1 MiB record limit, but its dead-letter envelope (base64) is not
ALT_PREFIX = "a-"  # an event's "alt" field: this and its eventId (event IDs start with "c")


def alt_id(event_id: str) -> str:
    """The event's second ID field, one to one with its eventId."""
    return ALT_PREFIX + event_id


def original_id(found: str) -> str:
    """The eventId of an ID the copier reports under either dedup key (``eventId`` or ``alt``)."""
    return found.removeprefix(ALT_PREFIX)


@dataclass(frozen=True)
class Poison:
    """A record the copier must dead-letter, and where it is in staging."""

    kind: str
    shard_id: str
    sequence_number: str
    sha256: str


@dataclass
class Produced:
    manifest: list[str] = field(default_factory=list)
    poison: list[Poison] = field(default_factory=list)
    last: dict[str, Position] = field(default_factory=dict)
    records: int = 0  # Kinesis records written (an aggregate counts once)
    events: int = 0  # events written, duplicates included
    duplicates: int = 0  # events written again (at once or late)
    aggregates: int = 0
    largest_aggregate: int = 0


def _event(n: int, run: str) -> tuple[str, str, bytes]:
    event_id = f"{run}-{n:07d}"
    body = {"eventId": event_id, "alt": alt_id(event_id), "n": n, "body": "x" * 80}
    return event_id, f"user-{n % 64}", json.dumps(body).encode()


class ChaosProducer:
    """Runs in a thread of the harness; see the module docstring."""

    def __init__(self, kinesis: Any, stream: str, plan: Plan, run: str) -> None:
        self.kinesis = kinesis
        self.stream = stream
        self.plan = plan
        self.run_id = run
        self.rng = random.Random(plan.seed * 7919 + 1)
        self.lock = threading.Lock()  # held for each put; a reshard holds it too
        self.out = Produced()
        self._map: ShardMap | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self.done = threading.Event()

    def reshard(self, change: Callable[[], None]) -> None:
        """Run a split or merge between two puts, and group later batches by the new shards."""
        with self.lock:
            change()
            self._map = None

    def stop(self) -> None:
        self._stop.set()

    # -- writing ----------------------------------------------------------------------

    def _shard_map(self) -> ShardMap:
        if self._map is None:
            self._map = ShardMap.of(paged_shards(self.kinesis.list_shards, self.stream))
        return self._map

    def _put(self, records: list[kpl.KinesisRecord], counts: list[int]) -> list[tuple[str, str]]:
        """PutRecords until every record landed (failed ones alone retried); (shard, sequence) of each."""
        where: list[tuple[str, str] | None] = [None] * len(records)
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
                position = Position(int(result["SequenceNumber"]), counts[i] - 1)
                shard = result["ShardId"]
                if shard not in self.out.last or self.out.last[shard] < position:
                    self.out.last[shard] = position
            left = failed
            if left:
                time.sleep(min(1.0, 0.05 * 2**attempt) * self.rng.random())
                attempt += 1
        self.out.records += len(records)
        return [w for w in where if w is not None]

    def _write(self, events: list[tuple[str, str, bytes]], aggregate: bool) -> None:
        with self.lock:
            if aggregate:
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
        self.out.events += len(events)

    def _poison(self, kind: str) -> None:
        data = {
            "no_id": json.dumps({"body": "an event without an ID", "poison": len(self.out.poison)}).encode(),
            "not_json": b"\xff\xfe not json " + bytes(self.rng.getrandbits(8) for _ in range(16)),
            "oversize": b"\x00" * OVERSIZE_BYTES + bytes(self.rng.getrandbits(8) for _ in range(8)),
        }[kind]
        with self.lock:
            ((shard, sequence),) = self._put([kpl.KinesisRecord(f"poison-{kind}", None, data)], [1])
        self.out.poison.append(Poison(kind, shard, sequence, hashlib.sha256(data).hexdigest()))

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
        poison_at = {self.rng.randrange(ticks): kind for kind in plan.poison}
        late_at = int(plan.late_at_s / TICK_S)
        written: list[tuple[str, str, bytes]] = []
        n = 0
        for tick in range(max(ticks, late_at) + 1):
            if self._stop.is_set():
                return
            time.sleep(max(0.0, start + tick * TICK_S - time.monotonic()))
            aggregate = self.rng.random() < plan.aggregate_share
            size = self.rng.randint(*plan.aggregate_events) if aggregate else per_tick
            size = min(size, plan.events - n)
            if size > 0:
                batch = [_event(i, self.run_id) for i in range(n, n + size)]
                n += size
                self.out.manifest.extend(e[0] for e in batch)
                written.extend(batch)
                self._write(batch, aggregate)
                if self.rng.random() < plan.retry_share:  # a retried task writes a slice again
                    a = self.rng.randrange(len(batch))
                    again = batch[a : a + self.rng.randint(1, max(1, len(batch) // 3))]
                    self._write(again, aggregate)
                    self.out.duplicates += len(again)
            if tick in poison_at:
                self._poison(poison_at[tick])
            if tick == late_at and written:  # the oldest events, written again long after
                late = written[: plan.late_duplicates]
                self._write(late, False)
                self.out.duplicates += len(late)
