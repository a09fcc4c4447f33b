"""In-process wiring of a ShardWorker to the fakes of copier.testing, with crash injection."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable

from copier.config import Config, parse_config
from copier.plan import SourceRecord
from copier.positions import Position
from copier.shard import ShardWorker
from copier.state import DigestBatch, ShardState
from copier.testing import FakeClock, InMemoryStateStore, InMemoryStreams

SHARD = "shardId-000000000000"


class SimulatedCrash(BaseException):
    """The process dies here: nothing after this point runs (BaseException: no handler catches it)."""


def config(**copier: object) -> Config:
    keys = {
        "targetStreamName": "target",
        "dedupKey": "json:eventId",
        "putTimeoutMillis": 1000,
        "clockSkewMillis": 100,
        "maxBackoffMillis": 100,
        **copier,
    }
    text = "applicationName = app\nstreamName = staging\nregionName = us-east-1\nfailoverTimeMillis = 5000\n"
    text += "".join(f"copier.{k} = {v}\n" for k, v in keys.items())
    return parse_config(text, "test.properties")


class CrashingStore(InMemoryStateStore):
    """An in-memory store whose owner writes can crash the process just before or just after they apply."""

    def __init__(self) -> None:
        super().__init__()
        self.crash_hook: Callable[[str, bool], bool] = lambda phase, with_batch: False

    def write(self, key: str, owner: ShardState, new: ShardState, batch: DigestBatch | None = None) -> None:
        if self.crash_hook("before", batch is not None):
            raise SimulatedCrash("before write")
        super().write(key, owner, new, batch)
        if self.crash_hook("after", batch is not None):
            raise SimulatedCrash("after write")


class World:
    """One shard's backend (store, streams, clock) shared by successive workers."""

    def __init__(self, cfg: Config | None = None) -> None:
        self.config = cfg or config()
        self.clock = FakeClock()
        self.store = CrashingStore()
        self.streams = InMemoryStreams(self.clock)
        self.workers = 0

    def worker(self, shard: str = SHARD) -> ShardWorker:
        self.workers += 1
        w = ShardWorker(self.config, self.store, self.streams, self.clock, owner=f"worker-{self.workers}")
        w.initialize(shard)
        return w

    def target_ids(self) -> Counter[str]:
        return Counter(str(json.loads(d).get("eventId")) for d in self.streams.data("target"))


def rec(seq: int, event_id: str | None, subseq: int = 0, body: str = "x") -> SourceRecord:
    payload: dict[str, str] = {"body": body}
    if event_id is not None:
        payload["eventId"] = event_id
    return SourceRecord(Position(seq, subseq), event_id or "none", json.dumps(payload).encode(), 0)
