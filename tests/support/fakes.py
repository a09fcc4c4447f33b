"""In-process wiring of a ShardWorker to the fakes of copier.testing, with crash injection."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

from copier.config import Config, parse_config
from copier.errors import FencedError
from copier.metrics import MetricsEmitter
from copier.plan import SourceRecord
from copier.positions import Position
from copier.shard import ShardWorker
from copier.state import DigestBatch, ShardState
from copier.testing import FakeClock, InMemoryStateStore, InMemoryStreams

SHARD = "shardId-000000000000"


class SimulatedCrash(BaseException):
    """The process dies here: nothing after this point runs (BaseException: no handler catches it)."""


class SimulatedPause(BaseException):
    """The process freezes here; what it was about to write is held and may land much later."""


def config(daemon: dict[str, object] | None = None, **copier: object) -> Config:
    keys = {
        "targetStreamName": "target",
        "dedupKey": "json:eventId",
        "putTimeoutMillis": 1000,
        "clockSkewMillis": 100,
        "maxBackoffMillis": 100,
        **copier,
    }
    text = "applicationName = app\nstreamName = staging\nregionName = us-east-1\nfailoverTimeMillis = 5000\n"
    text += "".join(f"{k} = {v}\n" for k, v in (daemon or {}).items())
    text += "".join(f"copier.{k} = {v}\n" for k, v in keys.items())
    return parse_config(text, "test.properties")


class CrashingStore(InMemoryStateStore):
    """An in-memory store whose owner writes can crash the process just before or just after they apply.

    ``crash_hook(phase, call)``: phase ``before`` or ``after``, call
    ``put_batch`` (a chunk's intent) or ``write`` (a commit or a lease renewal).
    """

    def __init__(self) -> None:
        super().__init__()
        self.crash_hook: Callable[[str, str], bool] = lambda phase, call: False
        self.hold_next = False
        self.held: list[tuple[str, DigestBatch]] = []

    def release_held(self) -> None:
        """The frozen writer wakes up and its digest batch write lands now (or is refused: it is fenced)."""
        for key, batch in self.held:
            try:
                super().put_batch(key, batch)
            except FencedError:
                pass
        self.held.clear()

    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        if self.crash_hook("before", "write"):
            raise SimulatedCrash("before write")
        super().write(key, owner, new)
        if self.crash_hook("after", "write"):
            raise SimulatedCrash("after write")

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        if self.hold_next:
            self.hold_next = False
            self.held.append((key, batch))
            raise SimulatedPause("frozen before its digest batch write")
        if self.crash_hook("before", "put_batch"):
            raise SimulatedCrash("before put_batch")
        super().put_batch(key, batch)
        if self.crash_hook("after", "put_batch"):
            raise SimulatedCrash("after put_batch")


class World:
    """One shard's backend (store, streams, clock) shared by successive workers."""

    def __init__(self, cfg: Config | None = None, chunk_events: int = 10_000, target_shards: int = 1) -> None:
        self.config = cfg or config()
        self.clock = FakeClock()
        self.store = CrashingStore()
        self.streams = InMemoryStreams(self.clock, {"target": target_shards})
        self.chunk_events = chunk_events
        self.workers = 0
        self.metrics: MetricsEmitter | None = None

    def worker(self, shard: str = SHARD) -> ShardWorker:
        """A new processor (a new owner ID) that takes the shard over."""
        self.workers += 1
        w = ShardWorker(
            self.config,
            self.store,
            self.streams,
            self.clock,
            owner=f"worker-{self.workers}",
            chunk_events=self.chunk_events,
            metrics=self.metrics,
        )
        w.initialize(shard)
        return w

    def target_ids(self) -> Counter[str]:
        return Counter(str(json.loads(d).get("eventId")) for d in self.streams.data("target"))


def rec(seq: int, event_id: str | None, subseq: int = 0, body: str = "x", arrival_ms: int = 0) -> SourceRecord:
    payload: dict[str, str] = {"body": body}
    if event_id is not None:
        payload["eventId"] = event_id
    return SourceRecord(Position(seq, subseq), event_id or "none", json.dumps(payload).encode(), arrival_ms)
