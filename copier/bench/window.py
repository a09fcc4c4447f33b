"""The dedup window's cost: memory per remembered ID, takeover load time, and CPU per event as it grows.

For each window size, on the local backend:

* *memory*: a window filled a second of arrivals at a time (as a shard at
  1,000 events/s fills it), its bytes per ID (``memory_bytes``);
* *takeover*: the size's IDs written as committed digest batches of a
  shard, then a real ``copier process`` takes the shard over (over its
  pipes): the time ``initialize`` takes, and the load as the processor logs
  it (``window_loaded``: seconds, IDs, bytes);
* *CPU per event with that window*: the same processor then forwards
  ``events`` new events in batches of 1,000; its own CPU time per event.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.adapters.dynamo import DynamoStateStore
from copier.core.packing import pack_digests
from copier.core.positions import Position
from copier.core.state import DigestBatch, ShardState
from copier.core.window import DedupWindow
from copier.local.multilang import Processor

__all__ = ["WindowResult", "fill_shard", "measure_memory", "measure_window"]

T0 = 1_700_000_000_000
FILL_BATCH = 10_000  # digests a stored batch while filling (the chunk limit: the fewest items)


@dataclass(frozen=True)
class WindowResult:
    ids: int
    bytes_per_id: float  # filled a second at a time
    takeover_s: float  # initialize, as the daemon waits for it
    load_s: float  # reading and loading the window, as the processor logs it
    loaded_bytes_per_id: float
    cpu_us_per_event: float

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def measure_memory(ids: int, per_second: int = 1000, seed: int = 1) -> float:
    """Bytes per ID of a window filled ``per_second`` IDs a second, as a busy shard fills it."""
    rng = random.Random(seed)
    window = DedupWindow(3_600_000, 100_000_000)
    for second in range(0, ids, per_second):
        window.add([rng.getrandbits(80) for _ in range(min(per_second, ids - second))], T0 + second)
    return window.memory_bytes() / max(1, len(window))


def fill_shard(store: DynamoStateStore, key: str, ids: int, batch: int = FILL_BATCH, seed: int = 1) -> ShardState:
    """Write ``ids`` digests as committed digest batches, arrivals a millisecond apart (1,000 a second)."""
    rng = random.Random(seed)
    index = 0
    for first in range(0, ids, batch):
        index += 1
        count = min(batch, ids - first)
        store.put_batch(
            key,
            DigestBatch(
                index=index,
                epoch=1,
                last=Position(first + count),
                started_ms=int(time.time() * 1000),
                keyed=pack_digests(rng.getrandbits(80) for _ in range(count)),
                arrival_min_ms=T0 + first,
                arrival_max_ms=T0 + first + count - 1,
            ),
        )
    state = ShardState(
        epoch=1,
        version=1,
        owner="bench:0:gone",
        position=Position(ids),
        batches=index,
        window_ids=ids,
        window_oldest_ms=T0,
        window_newest_ms=T0 + ids - 1,
    )
    store.replace_if_unchanged(key, store.get(key), state)
    return state


def measure_window(
    properties: Path, store: DynamoStateStore, stream: str, shard: str, ids: int, events: int
) -> WindowResult:
    """Fill ``shard`` with ``ids`` IDs, time a takeover by a real processor, then its CPU per event."""
    from copier.bench.cpu import CpuCase, messages
    from copier.core.state import shard_key

    fill_shard(store, shard_key(stream, shard), ids)
    proc = Processor(properties, f"window-{ids}")
    try:
        started = time.monotonic()
        proc.initialize(shard, timeout=600)
        takeover = time.monotonic() - started
        loaded = proc.wait_for("window_loaded")[0]
        lines = list(messages(CpuCase(200, 1000, events), f"window-{ids}", ids + 10))
        before = proc.cpu_seconds()
        for line in lines:
            proc.process_json(line)
        cpu = (proc.cpu_seconds() - before) / events
    finally:
        proc.close()
    return WindowResult(
        ids=ids,
        bytes_per_id=round(measure_memory(ids), 2),
        takeover_s=round(takeover, 2),
        load_s=loaded["seconds"],
        loaded_bytes_per_id=round(loaded["memory_bytes"] / max(1, loaded["ids"]), 2),
        cpu_us_per_event=round(cpu * 1e6, 2),
    )
