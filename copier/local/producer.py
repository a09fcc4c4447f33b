"""A Python producer with Spark-like retries, for the demo and the end-to-end test.

It writes JSON events with deterministic IDs (``evt-<run>-<n>``, partition
key = the ID) in PutRecords batches, retrying failed entries, and now and
then writes part of a batch again, as a retried Spark task does: the same
IDs under new sequence numbers, on the same shards. It returns the manifest
(produced IDs in order) and the last position written to each shard, so a
caller knows when the copier has caught up.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from copier.core.positions import Position

__all__ = ["Produced", "produce"]


@dataclass
class Produced:
    manifest: list[str] = field(default_factory=list)
    records: int = 0
    last: dict[str, Position] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        return self.records - len(set(self.manifest))


def _put_all(kinesis: Any, stream: str, entries: list[tuple[str, bytes]], out: Produced) -> None:
    """PutRecords until every entry landed, retrying only the failed ones."""
    left = entries
    attempt = 0
    while left:
        answer = kinesis.put_records(StreamName=stream, Records=[{"PartitionKey": k, "Data": d} for k, d in left])
        failed = []
        for entry, result in zip(left, answer["Records"], strict=True):
            if result.get("ErrorCode"):
                failed.append(entry)
                continue
            out.records += 1
            position = Position.parse(result["SequenceNumber"])
            shard = result["ShardId"]
            if shard not in out.last or out.last[shard] < position:
                out.last[shard] = position
        left = failed
        if left:
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.random())
            attempt += 1


def produce(
    kinesis: Any,
    stream: str,
    events: int,
    run: str = "demo",
    retry_rate: float = 0.3,
    batch: int = 500,
    seed: int = 7,
    start: int = 0,
    out: Produced | None = None,
    pause_s: float = 0.0,
) -> Produced:
    """Write ``events`` events; with probability ``retry_rate`` a batch has a slice written twice.

    ``pause_s`` between batches spreads the writes out, as a streaming job does.
    """
    rng = random.Random(seed)
    out = out or Produced()
    for first in range(start, start + events, batch):
        if pause_s and first > start:
            time.sleep(pause_s)
        ids = [f"evt-{run}-{n:08d}" for n in range(first, min(start + events, first + batch))]
        entries = [(i, json.dumps({"eventId": i, "n": n, "body": "x" * 64}).encode()) for n, i in enumerate(ids, first)]
        _put_all(kinesis, stream, entries, out)
        out.manifest.extend(ids)
        if rng.random() < retry_rate:
            a = rng.randrange(len(entries))
            b = min(len(entries), a + rng.randrange(1, max(2, len(entries) // 3)))
            _put_all(kinesis, stream, entries[a:b], out)
    return out
