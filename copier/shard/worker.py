"""The facade the record processor drives: one method per KCL call, each returning what to checkpoint.

``initialize`` takes the shard over (sleeping out a valid lease), verifies a
chunk left in flight and loads the window; ``process`` forwards a delivery
(or holds it while fenced); ``flush`` forwards what waits; ``end_shard``
closes the shard; ``release`` gives the lease up on a requested shutdown;
``lose_lease`` drops what is held when the daemon says another worker has the
shard. The parts it wires together are described in ``copier.shard``.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import structlog

from copier.adapters.metrics import MetricsEmitter
from copier.core.clockcheck import ClockBounds
from copier.core.config import Config
from copier.core.errors import CopierError, FencedError
from copier.core.limits import MAX_CHUNK_EVENTS
from copier.core.plan import SourceRecord
from copier.core.ports import Clock, Streams
from copier.core.positions import Position
from copier.core.state import ShardState, StateStore
from copier.core.window import DedupWindow
from copier.shard.coalescing import Coalescer
from copier.shard.endings import ShardEnd
from copier.shard.guard import StreamGuard
from copier.shard.history import History
from copier.shard.holding import Holding
from copier.shard.inflight import InFlight
from copier.shard.ownership import Ownership, SupersededError
from copier.shard.pipeline import ChunkPipeline
from copier.shard.session import ShardSession

__all__ = ["ShardWorker", "SystemClock", "new_session", "open_shard", "worker_id"]


class SystemClock:
    """Wall-clock time (leases are compared across hosts, so not monotonic)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep_ms(self, ms: int) -> None:
        if ms > 0:
            time.sleep(ms / 1000)


def worker_id() -> str:
    """host:pid:random, unique per processor process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def new_session(
    config: Config,
    store: StateStore,
    streams: Streams,
    clock: Clock | None,
    owner: str | None,
    log: Any,
    metrics: MetricsEmitter | None,
    clock_bounds: ClockBounds | None,
    key_prefix: str = "",
) -> ShardSession:
    """A processor's session (or a source's, ``key_prefix``), with the system's clock, a new owner ID and copier's
    logger unless given."""
    return ShardSession(
        config,
        store,
        streams,
        clock or SystemClock(),
        owner or worker_id(),
        log or structlog.get_logger("copier"),
        metrics,
        clock_bounds,
        key_prefix=key_prefix,
    )


def open_shard(s: ShardSession, ownership: Ownership, inflight: InFlight) -> bool:
    """Take the session's shard over (after sleeping out a valid lease) and verify a chunk left in flight; False
    if a rival took the shard over while this processor waited for it or verified it (the session is then
    fenced, as any fence leaves it)."""
    try:
        seen = ownership.take_over()
    except SupersededError as exc:
        superseded(s, exc.state)
        return False
    assert s.state is not None
    s.progress_from_here()
    s.log = s.log.bind(epoch=s.state.epoch)
    s.log.info(
        "took_over",
        previous_owner=seen.owner if seen else None,
        previous_epoch=seen.epoch if seen else None,
        position=str(s.state.position) if s.state.position else None,
        batches=s.state.batches,
        **ownership.how,  # why the shard changed owner, as far as the state item shows
    )
    try:
        inflight.verify(seen)
    except FencedError:
        s.fence("initialize")
        return False
    return True


def superseded(s: ShardSession, current: ShardState) -> None:
    """Fenced without having owned the shard: another processor took it over while this one waited
    (``Ownership.take_over``). The session keeps that owner's item with its lease at 0, so that nothing this
    processor does before it takes the shard back (a release when its lease is lost or a shutdown is asked)
    writes to it; what the daemon delivers is held, and the shard taken back once that owner is gone."""
    s.state = replace(current, lease_until_ms=0)
    s.progress_from_here()  # its metrics and progress count from that owner's totals, not from 0
    s.log.info(
        "superseded",
        owner=current.owner,
        epoch=current.epoch,
        detail="another processor took the shard over while this one waited for it: this one does not announce itself "
        "against it (it may be a waiter whose KCL lease moved on, which cannot hear that while it waits); it holds "
        "what the daemon delivers and takes the shard back once that owner is gone",
    )
    s.fence("initialize")


class ShardWorker:
    """Forwards one shard's records exactly once; one instance per record processor."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        streams: Streams,
        clock: Clock | None = None,
        owner: str | None = None,
        log: Any = None,
        chunk_events: int = MAX_CHUNK_EVENTS,
        metrics: MetricsEmitter | None = None,
        clock_bounds: ClockBounds | None = None,
    ) -> None:
        s = self.session = new_session(config, store, streams, clock, owner, log, metrics, clock_bounds)
        self.ownership = Ownership(s)
        self.inflight = InFlight(s)
        self.history = History(s)
        self.guard = StreamGuard(s)
        self.pipeline = ChunkPipeline(s, self.history, self.guard, chunk_events)
        self.holding = Holding(s, self.ownership, self.inflight, self.history, self.pipeline)
        self.coalescer = Coalescer(config, s.clock)
        self.ending = ShardEnd(s, self.ownership, self.holding)

    # What callers (the processor, tests) read of the session.
    config = property(lambda self: self.session.config)
    clock = property(lambda self: self.session.clock)
    clock_bounds = property(lambda self: self.session.clock_bounds)
    log = property(lambda self: self.session.log)
    shard_id = property(lambda self: self.session.shard_id)
    key = property(lambda self: self.session.key)
    owner = property(lambda self: self.session.owner)

    @property
    def state(self) -> ShardState | None:
        return self.session.state

    @property
    def fenced(self) -> bool:
        return self.session.fenced

    @property
    def window(self) -> DedupWindow:
        return self.session.window

    # -- the KCL's calls ------------------------------------------------------------

    def initialize(self, shard_id: str) -> None:
        """Take the shard over (after sleeping out a valid lease), verify a batch in flight, load the window (at a
        new application's first takeover, with what arrived before its start: ``copier.shard.prestart``).

        A fence during the verification or that load (a rival took over while it read)
        leaves this processor fenced, as any fence does: it holds what the
        daemon delivers and takes the shard back when it can.
        """
        s = self.session
        s.shard_id = shard_id
        s.key = s.key_of(shard_id)
        s.log = s.log.bind(shard=shard_id)
        if open_shard(s, self.ownership, self.inflight):
            try:
                self.history.load()
            except FencedError:  # a rival took the shard over while the events before the start were loaded
                s.fence("initialize")

    def process(self, records: Sequence[SourceRecord], behind_ms: int | None = None) -> Position | None:
        """Forward a delivery, chunk by chunk; the committed position, or None if fenced or nothing moved;
        then this interval's metrics if it has passed.

        ``behind_ms`` is the daemon's millisBehindLatest for the batch, kept
        in the state item for ``copier status``. Small deliveries may wait
        (``copier.shard.coalescing``); a fenced processor holds what it is
        given (``copier.shard.holding``).
        """
        s = self.session
        s.metrics.saw_behind(behind_ms)
        try:
            if s.state is None:
                return None
            if s.fenced:
                return self.holding.hold(self.coalescer.take() + list(records), behind_ms)
            due = self.coalescer.offer(records)
            return None if due is None else self._forward_or_hold(due, behind_ms)
        finally:
            s.emit()
            s.progress()

    def flush(self, behind_ms: int | None = None) -> Position | None:
        """Forward whatever small deliveries are waiting (before a shutdown or a shard's end)."""
        records = self.coalescer.take()
        if not records or self.session.state is None:
            return None
        if self.session.fenced:
            return self.holding.hold(records, behind_ms)
        return self._forward_or_hold(records, behind_ms)

    def _forward_or_hold(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        committed, rest = self.pipeline.forward(records, behind_ms)
        if rest:  # fenced on the way: the rest is not committed by this processor
            return self.holding.hold(rest, behind_ms)
        return committed

    def end_shard(self) -> bool:
        """Mark the shard closed; True if the caller may checkpoint SHARD_END (``copier.shard.endings``)."""
        self.flush()
        return self.ending.close()

    def release(self, retry: bool = True) -> Position | None:
        """On a requested shutdown: give the lease up so a successor need not sleep; return the position."""
        return self.ownership.release(retry)

    def lose_lease(self) -> bool:
        """The daemon says another worker has the shard: give copier's lease up (this processor puts nothing
        more, so the new owner need not sleep it out), stop, and drop what is held (it is replayed there).
        True if the lease was released now."""
        before = self.ownership.given_up
        try:
            self.ownership.release(retry=False, why="lease_lost")
        except CopierError as exc:  # the state cannot be read as this version knows it: the wait stays whole
            self.log.warning("release_failed", error=str(exc), detail="the next owner sleeps out the lease")
        released = self.ownership.given_up and not before
        self.session.fenced = True
        self.holding.drop()
        self.coalescer.take()
        return released
