"""One shard of a copier *source* other than the live staging stream: a redrive of a dead-letter shard, a repair
of a staging shard (docs/protocol.md, "Redriving the dead-letter stream", "Repairing a range").

Not a second engine: the per-shard protocol's own parts, driven by a command
instead of the KCL. A source has its own state items (``key_prefix``:
``redrive:`` or ``repair:`` before the shard's key), so its epoch, lease,
digest batches and window never meet the live processor's, and:

* :meth:`SourceShard.start` takes the item over as a processor does
  (``copier.shard.ownership``): a second run of the same source on the same
  shard announces itself, waits out the first run's lease plus the clock
  margin, and takes over; the first run's next write is refused (fenced) and
  it stops on that shard. A chunk the item has in flight (a run killed or
  fenced mid-put) is verified by reading the target (``copier.shard.inflight``)
  before anything is sent; then the window is loaded (``copier.shard.history``)
  when the source's rule consults it: what was sent from every shard of the
  stream (a redrive: the records of one event can be on a parent and a child
  of a resharded dead-letter stream), every committed batch (a run may send
  an old record after a new one);
* :meth:`SourceShard.forward` sends records through the chunk pipeline
  (``copier.shard.pipeline``) with the source's :data:`~copier.shard.pipeline.PlanRule`:
  each chunk's digest batch is written before its put, its put is the
  forwarder's (ambiguous puts verified), and its commit is conditioned on the
  epoch;
* :meth:`SourceShard.finish` releases the lease (a run that ends between
  chunks has nothing in flight: the next run need not wait).

A fenced source does not hold or take back as a fenced processor does: the
run that fenced it goes on, and the command says the shard was taken over.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from copier.core.clockcheck import ClockBounds
from copier.core.config import Config
from copier.core.limits import MAX_CHUNK_EVENTS
from copier.core.plan import SourceRecord
from copier.core.ports import Clock, Streams
from copier.core.positions import Position
from copier.core.state import ShardState, StateStore
from copier.shard.guard import StreamGuard
from copier.shard.history import History
from copier.shard.inflight import InFlight
from copier.shard.ownership import Ownership
from copier.shard.pipeline import ChunkPipeline, PlanRule
from copier.shard.worker import new_session, open_shard

__all__ = ["SourceShard"]


class SourceShard:
    """The per-shard protocol for one shard of a source; see the module docstring."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        streams: Streams,
        key_prefix: str,
        rule: PlanRule,
        *,
        clock: Clock | None = None,
        owner: str | None = None,
        log: Any = None,
        chunk_events: int = MAX_CHUNK_EVENTS,
        clock_bounds: ClockBounds | None = None,
        window: bool = True,
        replanning: bool = True,
    ) -> None:
        """``config``: the source's (its ``streamName`` is the stream it reads, its window's horizon what the
        rule needs); ``window``: the rule consults the window (loaded at the start); ``replanning``: what a
        lowered record limit refuses may go to the dead-letter stream (``ChunkPipeline``)."""
        s = self.session = new_session(config, store, streams, clock, owner, log, None, clock_bounds, key_prefix)
        self.ownership = Ownership(s)
        self.inflight = InFlight(s)
        # a run may send old records after new ones; an event's records may be on a parent and a child shard
        self.history = History(s, arrival_ordered=False, every_shard=window)
        self.pipeline = ChunkPipeline(s, self.history, StreamGuard(s), chunk_events, rule, replanning)
        self.uses_window = window

    @property
    def fenced(self) -> bool:
        return self.session.fenced

    @property
    def state(self) -> ShardState | None:
        return self.session.state

    def bind(self, shard_id: str) -> None:
        """Name the shard, without taking it over (a dry run reads its item and window only)."""
        s = self.session
        s.shard_id = shard_id
        s.key = s.key_of(shard_id)
        s.log = s.log.bind(source=self.session.key_prefix.rstrip(":"), shard=shard_id)

    def peek(self, shard_id: str) -> ShardState | None:
        """A dry run's look: the shard's item as it is, and its window loaded from it; nothing written."""
        self.bind(shard_id)
        s = self.session
        s.state = self.ownership.read()
        if s.state is not None and self.uses_window:
            self.history.load()
        return s.state

    def start(self, shard_id: str) -> bool:
        """Take the shard's item over, verify what it has in flight, load the window; False if fenced meanwhile
        (another run took the shard over while this one verified)."""
        if not self.take(shard_id):
            return False
        self.load()
        return True

    def take(self, shard_id: str) -> bool:
        """Take the shard's item over and verify what it has in flight, the window not loaded yet (a run that
        takes every shard over first loads each window after: :meth:`load`); False if fenced meanwhile."""
        self.bind(shard_id)
        return open_shard(self.session, self.ownership, self.inflight)

    def load(self) -> None:
        """Load the window (when the rule consults it): every committed batch of every shard of the stream."""
        if self.uses_window:
            self.history.load()

    def forward(self, records: Sequence[SourceRecord]) -> Position | None:
        """Send what the rule makes of ``records``, chunk by chunk; the last committed position (None: nothing
        committed). Once fenced (:attr:`fenced`), nothing more is sent."""
        if self.session.fenced or not records:
            return None
        committed, _ = self.pipeline.forward(records, None)
        return committed

    def finish(self) -> None:
        """Give the lease up (between chunks: nothing is in flight); a fenced run leaves it to the run that
        fenced it."""
        if not self.session.fenced and self.session.state is not None:
            self.ownership.release(retry=True, why="finished")
