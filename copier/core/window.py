"""The per-shard dedup window: the event IDs forwarded within the last ``copier.dedupWindowSeconds``.

A producer retry re-writes an event with a new sequence number, usually on
the same shard, seconds to an hour later (a Spark task retry, a micro-batch
written again after a driver restart). The window remembers the digest of
every keyed event forwarded on the shard whose staging *arrival time* lies
within ``horizon_ms`` of the newest arrival the shard has seen, so such a
retry is recognised and dropped. Measuring the horizon in arrival time (not
wall-clock time) keeps the guarantee when the copier lags: replaying a
two-day backlog, the window still covers the hour before each record.

A duplicate that arrives later than the horizon is forwarded: that is the
guarantee's edge, reported by :meth:`DedupWindow.stats` (``copier status``
shows it per shard).

What the window compares is the top 72 bits of an ID's 80-bit digest (the
low 8 bits of the low word are dropped): a new ID is taken for a forwarded
one, and dropped, only if those 72 bits equal those of one of the IDs in the
window, about 3.6e6 / 2**72 = 8e-16 an event against a full hour at 1,000
events/s. The digests stored in the state table keep all 80 bits (a
verification compares them all).

Memory is the constraint: an hour at a shard's write limit is 3.6 million
IDs, and a host runs dozens of shards. A Python ``set`` of digests costs
about 95 bytes an ID; the window takes 10.3 to 10.7 bytes an ID from 10,000
IDs to 3.6 million (``memory_bytes``, ``copier.bench`` section 3; the
per-bucket counts add a few kilobytes), and at most 12 from 1,000 IDs up
(``tests/test_window.py``). It stores them in one of two forms at a time
(``copier.core.windowblocks``, which says how each is laid out): *pair
blocks* while it holds fewer than ``word_blocks_at`` IDs (2,500,000), 10
bytes an ID and splitting as they grow; *word blocks* from then on, 8 bytes
an ID but a fixed 5 MB that is small only against millions. The window
chooses: it splits the pair blocks before they overfill, and turns them into
word blocks once, for good (about a second for 2.5 million IDs; a takeover's
load that large goes straight into word blocks). A shard whose rate drops
keeps the word blocks, at less memory than at its peak.

In both forms entries of expired buckets are *stale*: lookups ignore them,
an insert of the same identity makes its entry live again, and a *sweep*
drops them. A sweep runs once an eighth of the entries are stale (every
four buckets or so at a steady rate; about 0.3 s for 3.6 million IDs), and
before any entry could be 256 buckets old, so an 8-bit tag always names
exactly one bucket.

Time is kept in *buckets* of ``horizon / 32``: an entry's tag is the bucket
of the newest arrival of the chunk that added it, so it is remembered at
least as long as its own arrival requires, and longer by up to one bucket
plus the arrival span of its chunk (harmless: an ID seen again is a
duplicate however late; the guarantee is the lower bound). A count cap
(``copier.dedupWindowMaxEvents``) guards memory: above it the oldest buckets
expire early, never the newest one, and :attr:`DedupWindow.cut_short` says
so.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from copier.core.packing import LOW_MASK
from copier.core.windowblocks import SPLIT_AT, TAG_MASK, PairBlocks, WordBlocks

__all__ = ["BUCKETS_PER_HORIZON", "DedupWindow", "WindowStats"]

BUCKETS_PER_HORIZON = 32
WORD_BLOCKS_AT = 2_500_000  # live IDs from which the pair blocks become word blocks, for good
TAG_LIMIT = 200  # buckets between the oldest entry and the newest before a forced sweep (< 256: no tag wraps)
SWEEP_STALE = 8  # a sweep runs once more than 1/SWEEP_STALE of the entries are stale


def _live_tags(newest_bucket: int, span: int) -> bytes:
    """A translation table from a tag byte to 1 (its bucket is live) or 0 (stale), for sweeps in C."""
    return bytes(1 if ((newest_bucket - tag) & TAG_MASK) <= span else 0 for tag in range(256))


@dataclass(frozen=True)
class WindowStats:
    """What ``copier status`` shows of a window: how far back the dedup guarantee reaches."""

    ids: int
    newest_ms: int  # newest staging arrival seen (0: none yet)
    oldest_ms: int  # every ID forwarded with an arrival at or after this is remembered
    cut_short: bool  # the count cap made the window shorter than its horizon


class DedupWindow:
    """A time-bounded set of 72-bit identities (80-bit digests, see the module docstring): the buckets and
    their expiry here, the identities in ``copier.core.windowblocks``' form of the moment."""

    def __init__(
        self, horizon_ms: int, max_ids: int, split_at: int = SPLIT_AT, word_blocks_at: int = WORD_BLOCKS_AT
    ) -> None:
        if horizon_ms < 0 or max_ids < 0 or split_at < 1:
            raise ValueError("horizon_ms and max_ids must be >= 0, split_at >= 1")
        self.horizon_ms = horizon_ms
        self.max_ids = max_ids
        self.enabled = horizon_ms > 0 and max_ids > 0
        self.bucket_ms = max(1, horizon_ms // BUCKETS_PER_HORIZON)
        self.newest_ms = 0
        self._newest_bucket = 0
        self._oldest_live = 0  # lowest bucket whose entries count
        self._floor = 0  # no stored entry has a lower bucket
        self._counts: dict[int, int] = {}  # live bucket -> entries
        self._live = 0
        self._cap_floor: int | None = None  # the count cap expired every bucket below this one
        self._word_blocks_at = word_blocks_at
        self._store: PairBlocks | WordBlocks = PairBlocks(split_at)

    # -- sizing ---------------------------------------------------------------

    def _to_word_blocks(self) -> None:
        """Turn the pair blocks into word blocks (their live entries), for good."""
        assert isinstance(self._store, PairBlocks)
        self._store = WordBlocks.from_pairs(self._store, _live_tags(self._newest_bucket, self._span()))
        self._floor = self._oldest_live

    def reserve(self, more: int) -> None:
        """Make room once for ``more`` new IDs, not step by step while they are added (bulk loads): split the pair
        blocks for them, or turn them into word blocks now if that many IDs reach the threshold."""
        store = self._store
        if not self.enabled or not isinstance(store, PairBlocks):
            return
        if self._live + more >= self._word_blocks_at:
            self._to_word_blocks()
        else:
            store.split(store.words + more)

    def memory_bytes(self) -> int:
        """Bytes held by the blocks and their lists (the per-bucket counts add a few kilobytes). Summed over the
        blocks (a few milliseconds): for logs and benchmarks, not per batch."""
        return self._store.memory_bytes()

    def __len__(self) -> int:
        return self._live

    # -- what the tests check the storage through (tests/test_window.py) ---------------

    @property
    def _words(self) -> int:
        return self._store.words

    @property
    def _blocks(self) -> list[array[int] | None] | None:
        """The word blocks, None while the pair blocks hold the IDs."""
        return self._store.blocks if isinstance(self._store, WordBlocks) else None

    def _pairs(self) -> PairBlocks:
        return self._store if isinstance(self._store, PairBlocks) else PairBlocks()  # none left: an empty view

    @property
    def _keys(self) -> list[array[int] | None]:
        return self._pairs().keys

    @property
    def _tails(self) -> list[array[int] | None]:
        return self._pairs().tails

    @property
    def _bits(self) -> int:
        return self._pairs().bits

    @property
    def _shift(self) -> int:
        return self._pairs().shift

    # -- time -------------------------------------------------------------------

    def _span(self) -> int:
        return self._newest_bucket - self._oldest_live

    def advance(self, arrival_ms: int) -> None:
        """The shard has seen an arrival this new: expire what the horizon no longer covers."""
        if not self.enabled or arrival_ms <= self.newest_ms:
            return
        newest_bucket = arrival_ms // self.bucket_ms
        horizon_floor = (arrival_ms - self.horizon_ms) // self.bucket_ms
        if newest_bucket - self._floor > TAG_LIMIT:
            # drop the stale before the newest bucket moves: under the old one every tag still names one bucket
            self._expire_below(horizon_floor)
            self._sweep()
        self.newest_ms = arrival_ms
        self._newest_bucket = newest_bucket
        self._expire_below(horizon_floor)
        self._maybe_sweep()

    def _expire_below(self, bucket: int) -> int:
        """Expire every bucket below ``bucket``; returns how many live entries became stale."""
        if bucket <= self._oldest_live:
            return 0
        self._oldest_live = bucket
        expired = 0
        for old in [b for b in self._counts if b < bucket]:
            expired += self._counts.pop(old)
        self._live -= expired
        return expired

    def _enforce_cap(self) -> None:
        """Over the cap, expire whole buckets oldest first, but never the newest one left: a bucket over the cap
        by itself (a cap below a bucket's worth of events) stays, so the window never forgets the IDs it was just
        given, and holds at most the cap plus one bucket."""
        while self._live > self.max_ids and len(self._counts) > 1:
            self._expire_below(min(self._counts) + 1)
            self._cap_floor = self._oldest_live

    def _maybe_sweep(self) -> None:
        """Sweep if enough entries are stale (:meth:`advance` sweeps before a tag could name two buckets)."""
        words = self._store.words
        if words == self._live:
            self._floor = self._oldest_live  # nothing stale is stored
        elif words - self._live > words // SWEEP_STALE:
            self._sweep()

    def _sweep(self) -> None:
        """Drop every stale entry (the store rebuilds only the blocks holding one)."""
        self._store.sweep(_live_tags(self._newest_bucket, self._span()))
        self._floor = self._oldest_live

    @property
    def cut_short(self) -> bool:
        """True while the count cap keeps the window shorter than its time horizon."""
        floor = (self.newest_ms - self.horizon_ms) // self.bucket_ms
        return self.enabled and self._cap_floor is not None and self._cap_floor > floor

    def stats(self) -> WindowStats:
        oldest = max(self.newest_ms - self.horizon_ms, self._oldest_live * self.bucket_ms) if self.enabled else 0
        return WindowStats(self._live, self.newest_ms, max(0, oldest), self.cut_short)

    # -- membership ---------------------------------------------------------------

    def __contains__(self, digest: object) -> bool:
        if not isinstance(digest, int) or not self._live:
            return False
        tag = self._store.tag_of(digest)
        return tag >= 0 and ((self._newest_bucket - tag) & TAG_MASK) <= self._newest_bucket - self._oldest_live

    def add(self, digests: Iterable[int], arrival_ms: int) -> None:
        """Remember digests forwarded by a batch whose newest arrival is ``arrival_ms``."""
        values = digests if isinstance(digests, list) else list(digests)
        self.add_columns([d & LOW_MASK for d in values], [d >> 64 for d in values], arrival_ms)

    def add_columns(self, low: Sequence[int], high: Sequence[int], arrival_ms: int) -> None:
        """:meth:`add` from the two columns of a stored digest list (``copier.core.packing``), without int objects."""
        if not self.enabled:
            return
        if len(low) != len(high):  # checked before anything changes: a batch is added whole or not at all
            raise ValueError(f"digest columns of {len(low)} low and {len(high)} high words")
        self.advance(arrival_ms)
        bucket = arrival_ms // self.bucket_ms
        if bucket < self._oldest_live:
            return  # older than the horizon (or than what the cap keeps)
        self.reserve(len(low))  # a KPL batch of tens of thousands of events must not pile into a few blocks
        added, moved = self._store.add(low, high, bucket, self._newest_bucket, self._span(), self._counts)
        if added or moved:
            counts = self._counts
            counts[bucket] = counts.get(bucket, 0) + added + moved
            self._live += added
            self._enforce_cap()
            self._maybe_sweep()
            store = self._store
            if isinstance(store, PairBlocks):
                if self._live >= self._word_blocks_at:
                    self._to_word_blocks()
                else:
                    store.split(store.words)
