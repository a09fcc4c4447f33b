"""A fenced processor: holding what the daemon still delivers, and taking the shard back (docs/protocol.md,
"Fencing").

The daemon may keep delivering to a fenced processor when the KCL's lease and
copier's ownership disagree (two workers both believed they had the shard for
a moment, and the one that took copier's lease then lost the KCL's). It holds
what it is given: amazon-kclpy acknowledges a batch whatever the processor
does, so what it dropped would be lost. Once the owner that fenced it is
gone, it takes the shard back (``copier.shard.ownership``), verifies a chunk
left in flight, reloads the window and forwards what it holds. Past
``MAX_HELD_RECORDS`` records or ``MAX_HELD_BYTES`` bytes only the range is
kept, read again from the staging stream after taking the shard back. No
delivery size makes a fenced processor exit.
"""

from __future__ import annotations

from collections.abc import Sequence

from copier.core.errors import FencedError
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.state import ShardState
from copier.shard.history import History
from copier.shard.inflight import InFlight
from copier.shard.ownership import Ownership
from copier.shard.pipeline import ChunkPipeline
from copier.shard.session import ShardSession

__all__ = ["MAX_HELD_BYTES", "MAX_HELD_RECORDS", "Holding"]

MAX_HELD_RECORDS = 200_000  # records a fenced processor holds in memory; past it, it reads them again later
MAX_HELD_BYTES = 64 * 1024 * 1024  # and their bytes


class Holding:
    """What a fenced processor holds, and how it takes the shard back; see the module docstring."""

    def __init__(
        self, session: ShardSession, ownership: Ownership, inflight: InFlight, history: History, pipeline: ChunkPipeline
    ) -> None:
        self.s = session
        self.ownership = ownership
        self.inflight = inflight
        self.history = history
        self.pipeline = pipeline
        self.held: list[SourceRecord] = []  # delivered since this processor's last commit while it is fenced
        self.held_bytes = 0
        self.gap: tuple[Position, Position] | None = None  # held records dropped past the cap: read them again

    def drop(self) -> None:
        """Forget what is held (another worker has the shard: the daemon replays it there)."""
        self.held = []
        self.held_bytes = 0
        self.gap = None

    def hold(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        """Hold what a fenced processor is given, then see whether the shard can be taken back."""
        self.held.extend(records)
        self.held_bytes += sum(len(r.data) for r in records)
        if self.held and (len(self.held) > MAX_HELD_RECORDS or self.held_bytes > MAX_HELD_BYTES):
            first = self.gap[0] if self.gap is not None else self.held[0].position
            self.gap = (first, self.held[-1].position)
            self.s.log.warning(
                "fenced_backlog_dropped",
                records=len(self.held),
                bytes=self.held_bytes,
                first=str(first),
                last=str(self.gap[1]),
                detail="fenced and holding too much: once the shard is taken back, this range is read again "
                "from the staging stream",
            )
            self.held = []
            self.held_bytes = 0
        return self.take_back(self.ownership.read(), behind_ms)

    def take_back(self, seen: ShardState | None, behind_ms: int | None) -> Position | None:
        """Take the shard back from ``seen`` once its owner is gone; then forward what is held.

        What is held (the range read again from staging, then the records
        kept) follows this processor's last commit without a gap, and the
        committed position is at or past that commit, so planning the held
        records from it forwards each of them exactly once.
        """
        s = self.s
        if not self.ownership.take_back(seen):
            return None
        assert seen is not None
        s.progress_from_here()  # what the other owner forwarded meanwhile is not this processor's progress
        s.log.info(
            "took_back", previous_owner=seen.owner, previous_epoch=seen.epoch, held=len(self.held), gap=bool(self.gap)
        )
        try:
            self.inflight.verify(seen)
            self.history.reload()
        except FencedError:
            s.fence("take_back")
            return None
        committed = self._read_gap_again(behind_ms)
        if s.fenced:
            return committed
        held, self.held, self.held_bytes = self.held, [], 0
        position, rest = self.pipeline.forward(held, behind_ms)
        if rest:
            self.held = rest
            self.held_bytes = sum(len(r.data) for r in rest)
        return position or committed

    def _read_gap_again(self, behind_ms: int | None) -> Position | None:
        """Forward the range a fenced processor dropped, read again from the staging stream; on a new fence,
        keep what is left of it as the range to read next time."""
        if self.gap is None:
            return None
        s = self.s
        first, last = self.gap
        self.gap = None
        cursor = [first]
        committed: list[Position | None] = [None]
        stream = s.config.stream_name
        s.log.info("reading_again", first=str(first), last=str(last))

        def run() -> None:
            for page in s.streams.read_source(stream, s.shard_id, cursor[0], last):
                if not page:
                    continue
                position, rest = self.pipeline.forward(page, behind_ms)
                committed[0] = position or committed[0]
                if rest:
                    self.gap = (rest[0].position, last)
                    return
                cursor[0] = page[-1].position  # a retry starts here: the plan drops what is committed

        s.retrying("read_staging", run)
        return committed[0]
