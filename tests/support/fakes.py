"""In-process wiring of a ShardWorker to the fakes of copier.testing, with crash injection."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.utils import formatdate

from copier.adapters.metrics import MetricsEmitter
from copier.core.clockcheck import ClockBounds
from copier.core.config import Config, parse_config
from copier.core.errors import FatalAwsError, FencedError, TransientAwsError
from copier.core.plan import SourceRecord
from copier.core.ports import Clock
from copier.core.positions import Position
from copier.core.state import DigestBatch, ShardState
from copier.shard import ShardWorker
from copier.testing import FakeClock, InMemoryStateStore, InMemoryStreams

SHARD = "shardId-000000000000"


class SimulatedCrash(BaseException):
    """The process dies here: nothing after this point runs (BaseException: no handler catches it)."""


class SimulatedPause(BaseException):
    """The process freezes here; what it was about to write is held and may land much later."""


class SimulatedStall(BaseException):
    """AWS keeps rejecting this shard's request (the shard stalls): the operator restarts the processor."""


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


def crash_at(phase: str, call: str, nth: int) -> Callable[[str, str], bool]:
    """A ``CrashingStore.crash_hook`` that crashes at the ``nth`` ``call`` (``put_batch`` or ``write``), ``phase``
    (``before`` or ``after``) it applies."""
    seen = {"n": 0}

    def hook(at: str, made: str) -> bool:
        if (at, made) != (phase, call):
            return False
        seen["n"] += 1
        return seen["n"] == nth

    return hook


class CrashingStore(InMemoryStateStore):
    """An in-memory store whose owner writes can crash the process just before or just after they apply.

    ``crash_hook(phase, call)``: phase ``before`` or ``after``, call
    ``put_batch`` (a chunk's intent) or ``write`` (a commit or a lease renewal).
    ``lose_next_answer``: the next owner write gets no answer (the client retries) and its first attempt
    stays on its way, to land whenever ``land_late`` says; ``lose_next_batch_answer``: the same for the next
    digest batch write.
    """

    def __init__(self, clock: FakeClock | None = None, ttl_ms: int | None = None) -> None:
        super().__init__(clock, ttl_ms)
        self.crash_hook: Callable[[str, str], bool] = lambda phase, call: False
        self.hold_next = False
        self.held: list[tuple[str, DigestBatch]] = []
        self.lose_next_answer = False
        self.late: list[tuple[str, ShardState, ShardState]] = []
        self.lose_next_batch_answer = False
        self.late_batches: list[tuple[str, DigestBatch]] = []

    def land_late(self) -> None:
        """The first attempts still on their way reach the table now (applied, or refused by its condition)."""
        for key, owner, new in self.late:
            try:
                super().write(key, owner, new)
            except FencedError:
                pass
        self.late.clear()
        self._land(self.late_batches)

    def release_held(self) -> None:
        """The frozen writer wakes up and its digest batch write lands now (or is refused: it is fenced)."""
        self._land(self.held)

    def _land(self, batches: list[tuple[str, DigestBatch]]) -> None:
        """Digest batch writes still on their way reach the table now, applied or refused by its condition."""
        for key, batch in batches:
            try:
                super().put_batch(key, batch)
            except FencedError:
                pass
        batches.clear()

    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        if self.lose_next_answer:
            self.lose_next_answer = False
            self.late.append((key, owner, new))
            raise TransientAwsError("PutItem", "RequestTimeout", "no answer: the request is still on its way")
        if self.crash_hook("before", "write"):
            raise SimulatedCrash("before write")
        super().write(key, owner, new)
        if self.crash_hook("after", "write"):
            raise SimulatedCrash("after write")

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        if self.lose_next_batch_answer:
            self.lose_next_batch_answer = False
            self.late_batches.append((key, batch))
            raise TransientAwsError("PutItem", "RequestTimeout", "no answer: the request is still on its way")
        if self.hold_next:
            self.hold_next = False
            self.held.append((key, batch))
            raise SimulatedPause("frozen before its digest batch write")
        if self.crash_hook("before", "put_batch"):
            raise SimulatedCrash("before put_batch")
        super().put_batch(key, batch)
        if self.crash_hook("after", "put_batch"):
            raise SimulatedCrash("after put_batch")


class StallingStreams(InMemoryStreams):
    """In-memory streams where a request AWS keeps rejecting stalls the shard: after ``stall_after``
    rejections in a row (counted from the last processor's start: a chunk's first refusal may be re-planned,
    and a processor that died before it could be starts again) the operator restarts the processor
    (:class:`SimulatedStall`)."""

    def __init__(self, *args: object, stall_after: int | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.stall_after = stall_after
        self.rejections = 0
        self.stalls = 0

    def put_records(self, stream: str, entries: object, deadline: float | None = None) -> list[str | None]:  # type: ignore[override]
        try:
            out = super().put_records(stream, entries, deadline)  # type: ignore[arg-type]
        except FatalAwsError:
            self.rejections += 1
            if self.stall_after is not None and self.rejections >= self.stall_after:
                self.rejections = 0
                self.stalls += 1
                raise SimulatedStall(f"{stream} keeps rejecting the request") from None
            raise
        self.rejections = 0
        return out


@contextmanager
def once_asleep(clock: FakeClock, act: Callable[[], object]) -> Iterator[list[object]]:
    """Within the block, ``act`` runs once, right after the first sleep on ``clock`` (another processor acting
    while one waits out a lease); the yielded list holds its result, and stays empty if nothing slept."""
    sleep = clock.sleep_ms
    done: list[object] = []
    started: list[bool] = []  # ``act`` may sleep too: it runs once, not again from within

    def then_act(ms: int) -> None:
        sleep(ms)
        if not started:
            started.append(True)
            done.append(act())

    clock.sleep_ms = then_act  # type: ignore[method-assign]
    try:
        yield done
    finally:
        clock.sleep_ms = sleep  # type: ignore[method-assign]


class OffsetClock:
    """A host's clock: the world's (AWS time) plus a fixed offset; sleeping moves the world's clock."""

    def __init__(self, world: FakeClock, offset_ms: int) -> None:
        self.world = world
        self.offset_ms = offset_ms
        self.pending: list[tuple[int, int]] = []  # (AWS calls until it happens, step ms): a step during a call

    def now_ms(self) -> int:
        return self.world.now_ms() + self.offset_ms

    def step_during_call(self, calls: int, step_ms: int) -> None:
        """Step this clock while the ``calls``-th AWS call from now is in flight (after it was sent)."""
        self.pending.append((calls, step_ms))

    def call_in_flight(self) -> None:
        """An AWS call of this host is in flight: steps due now happen."""
        due = [(n - 1, step) for n, step in self.pending]
        self.pending = [(n, step) for n, step in due if n > 0]
        self.offset_ms += sum(step for n, step in due if n <= 0)

    def sleep_ms(self, ms: int) -> None:
        self.world.sleep_ms(ms)


class Answering:
    """A host's view of a shared fake store or streams: every call's answer carries AWS's Date (the world's
    clock, in whole seconds), which feeds the host's ``ClockBounds`` as ``copier.adapters.clockhooks`` does."""

    def __init__(self, inner: object, bounds: ClockBounds, host: Clock, world: FakeClock) -> None:
        self._inner, self._bounds, self._host, self._world = inner, bounds, host, world

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        def call(*args: object, **kwargs: object) -> object:
            sent = self._host.now_ms()
            try:
                return attr(*args, **kwargs)
            finally:
                if isinstance(self._host, OffsetClock):
                    self._host.call_in_flight()
                date = formatdate(self._world.now_ms() // 1000, usegmt=True)
                self._bounds.observe(sent, self._host.now_ms(), date)

        return call


def measured(host: OffsetClock, answers: int = 20, round_trip_ms: int = 10) -> ClockBounds:
    """What ``copier.core.clockcheck`` knows on ``host`` after ``answers`` AWS answers (their Date headers at
    different points of the second, as real traffic gives). The host's monotonic clock is AWS time: its wall
    clock minus its monotonic clock is its offset, which a step of ``host.offset_ms`` changes."""
    bounds = ClockBounds(frame=lambda: host.offset_ms)
    for i in range(answers):
        true = host.world.now_ms() - 60_000 + i * 1_037  # AWS time when the server stamped the answer
        date = formatdate(true // 1000, usegmt=True)
        local = true + host.offset_ms
        bounds.observe(local - round_trip_ms // 2, local + round_trip_ms // 2, date)
    return bounds


class World:
    """One shard's backend (store, streams, clock) shared by successive workers.

    ``ttl_ms``: digest batches without an expiry of their own expire this
    long after they were written; ``retention_ms``: per stream (default 24 h).
    """

    def __init__(
        self,
        cfg: Config | None = None,
        chunk_events: int = 10_000,
        target_shards: int = 1,
        *,
        ttl_ms: int | None = None,
        retention_ms: dict[str, int] | None = None,
        stall_after: int | None = None,
    ) -> None:
        self.config = cfg or config()
        self.clock = FakeClock()
        self.store = CrashingStore(self.clock, ttl_ms)
        self.streams = StallingStreams(
            self.clock, {"target": target_shards}, retention_ms=retention_ms, stall_after=stall_after
        )
        self.chunk_events = chunk_events
        self.workers = 0
        self.metrics: MetricsEmitter | None = None

    def worker(
        self,
        shard: str = SHARD,
        cfg: Config | None = None,
        clock: Clock | None = None,
        clock_bounds: ClockBounds | None = None,
        answering: bool = False,
    ) -> ShardWorker:
        """A new processor (a new owner ID) that takes the shard over, with ``cfg`` if given, on a host whose
        clock is ``clock`` (default: AWS time exactly) and measured as ``clock_bounds`` (``answering``: fed by
        the Date of every answer from the store and streams, as in production)."""
        self.workers += 1
        self.streams.forget_settings()  # a processor is a process: it caches its own answers
        self.streams.rejections = 0
        host = clock or self.clock
        store, streams = self.store, self.streams
        if clock_bounds is not None and answering:
            store = Answering(store, clock_bounds, host, self.clock)  # type: ignore[assignment]
            streams = Answering(streams, clock_bounds, host, self.clock)  # type: ignore[assignment]
        w = ShardWorker(
            cfg or self.config,
            store,
            streams,
            host,
            owner=f"worker-{self.workers}",
            chunk_events=self.chunk_events,
            metrics=self.metrics,
            clock_bounds=clock_bounds,
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
