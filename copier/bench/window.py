"""The dedup window's cost: memory per remembered ID, and how long a takeover takes to load it.

``python -m copier.bench.window --ids 3600000`` writes an hour's window at a
shard's write limit (3.6 million IDs, in digest batches of ``--batch``
events, one second of arrivals each) into a state table on the embedded
local backend, then times what a new owner does: a takeover of the shard
(``copier.shard.ShardWorker.initialize``, with the real DynamoDB store and
Kinesis client), and of a child shard after a split, which loads its
parent's window. It prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from copier.config import load_config
from copier.dynamo import DynamoStateStore
from copier.kinesis import KinesisStreams
from copier.packing import pack_digests
from copier.positions import Position
from copier.shard import ShardWorker
from copier.state import DigestBatch, ShardState, shard_key
from copier.window import DedupWindow

__all__ = ["fill_shard", "measure_memory", "measure_takeover", "main"]

T0 = 1_700_000_000_000
DUMMY = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


def measure_memory(ids: int, per_second: int = 1000, seed: int = 1) -> dict[str, Any]:
    """Fill a window as a shard at ``per_second`` IDs a second does; bytes per ID at the end."""
    rng = random.Random(seed)
    window = DedupWindow(3_600_000, 100_000_000)
    started = time.process_time()
    for second in range(0, ids, per_second):
        window.add([rng.getrandbits(80) for _ in range(min(per_second, ids - second))], T0 + second)
    cpu = time.process_time() - started
    return {
        "ids": len(window),
        "memory_bytes": window.memory_bytes(),
        "bytes_per_id": round(window.memory_bytes() / max(1, len(window)), 2),
        "cpu_s_per_million": round(cpu / ids * 1e6, 2),
    }


def fill_shard(store: DynamoStateStore, key: str, ids: int, batch: int, seed: int = 1) -> ShardState:
    """Write ``ids`` digests as committed digest batches of ``batch`` events, one second of arrivals each."""
    rng = random.Random(seed)
    index = 0
    for first in range(0, ids, batch):
        index += 1
        count = min(batch, ids - first)
        arrival = T0 + first  # 1,000 events a second: one a millisecond
        store.put_batch(
            key,
            DigestBatch(
                index=index,
                epoch=1,
                last=Position(first + count),
                started_ms=int(time.time() * 1000),
                keyed=pack_digests(rng.getrandbits(80) for _ in range(count)),
                arrival_min_ms=arrival,
                arrival_max_ms=arrival + count - 1,
            ),
        )
    last = T0 + ids - 1
    state = ShardState(
        epoch=1,
        version=1,
        owner="bench:0:dead",
        position=Position(ids),
        batches=index,
        window_ids=ids,
        window_oldest_ms=T0,
        window_newest_ms=last,
    )
    store.replace_if_unchanged(key, store.get(key), state)
    return state


def measure_takeover(ids: int, batch: int, workdir: Path) -> dict[str, Any]:
    """Time a takeover of a shard holding ``ids`` IDs, and of a child of it after a split, on the local backend."""
    import boto3

    from copier.local.backend import LocalBackend
    from copier.local.pipeline import local_properties

    for name, value in DUMMY.items():
        os.environ.setdefault(name, value)
    with LocalBackend() as backend:
        kinesis = boto3.session.Session().client("kinesis", region_name="us-east-1", endpoint_url=backend.endpoint)
        for stream in ("bench-staging", "bench-target"):
            kinesis.create_stream(StreamName=stream, ShardCount=1)
        props = local_properties(
            workdir / "bench.properties",
            backend.endpoint,
            "bench",
            "bench-staging",
            "bench-target",
            "copier",
            dedupWindowMaxEvents=str(max(5_000_000, ids)),
        )
        config = load_config(props)
        store = DynamoStateStore(config)
        store.create_table()
        parent = kinesis.list_shards(StreamName="bench-staging")["Shards"][0]["ShardId"]
        started = time.monotonic()
        fill_shard(store, shard_key("bench-staging", parent), ids, batch)
        filled = time.monotonic() - started
        hashes = kinesis.list_shards(StreamName="bench-staging")["Shards"][0]["HashKeyRange"]
        middle = (int(hashes["StartingHashKey"]) + int(hashes["EndingHashKey"])) // 2
        kinesis.split_shard(StreamName="bench-staging", ShardToSplit=parent, NewStartingHashKey=str(middle))
        child = next(
            s["ShardId"] for s in kinesis.list_shards(StreamName="bench-staging")["Shards"] if s["ShardId"] != parent
        )
        streams = KinesisStreams(config)
        out: dict[str, Any] = {
            "ids": ids,
            "batch_events": batch,
            "digest_batches": -(-ids // batch),
            "fill_s": round(filled, 1),
        }
        for label, shard in (("takeover", parent), ("child_takeover", child)):
            worker = ShardWorker(config, store, streams)
            started = time.monotonic()
            worker.initialize(shard)
            elapsed = time.monotonic() - started
            stats = worker.window.stats()
            out[label] = {
                "seconds": round(elapsed, 2),
                "window_ids": stats.ids,
                "memory_bytes": stats.memory_bytes,
                "bytes_per_id": round(stats.memory_bytes / max(1, stats.ids), 2),
            }
            worker.release()
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.bench.window", description=__doc__)
    parser.add_argument("--ids", type=int, default=3_600_000, help="IDs in the window (default: an hour at 1,000/s)")
    parser.add_argument("--batch", type=int, default=1000, help="events a digest batch (default 1000)")
    parser.add_argument("--memory-only", action="store_true", help="skip the takeover on the local backend")
    args = parser.parse_args(argv)
    from copier.logs import configure_logging

    configure_logging("WARNING")
    result: dict[str, Any] = {"memory": measure_memory(args.ids)}
    if not args.memory_only:
        with tempfile.TemporaryDirectory() as workdir:
            result.update(measure_takeover(args.ids, args.batch, Path(workdir)))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
