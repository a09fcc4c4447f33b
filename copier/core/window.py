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
(``tests/test_window.py``). It has two forms, one at a time:

*Pair blocks* while it holds fewer than ``word_blocks_at`` IDs (2,500,000):
10 bytes an ID, plus about 6% of growth margin and a few hundred bytes a
block:

* an identity is split into a *key*, its top 64 bits (the digest's high 16
  bits above the low word's bits 16-63), kept in an ``array('Q')``, and a
  *tail*, the low word's bits 8-15 above an 8-bit bucket *tag*, kept at the
  same index of an ``array('H')``;
* the pairs sit in blocks, each sorted by key: block ``i`` holds the keys
  whose top ``bits`` bits are ``i``. A lookup or an insert is one binary
  search (``bisect``, in C) in a block of 512 to 1,024 keys on average, then
  a look at the tails of the keys equal to it (two identities share a key
  about once in 2**64 pairs); an insert moves the rest of its block up (a
  ``memmove`` of a few kilobytes);
* the blocks *split* when they hold more than ``split_at`` (1,024) entries
  on average, and before a batch that would overfill them is added (a KPL
  batch of tens of thousands of events): ``bits`` grows by one and every
  block is cut in two where its keys' next bit turns to 1 (a binary search
  and two slices in C). They never merge; an empty one is freed.

*Word blocks* from then on: 65,536 sorted arrays (``'Q'``), one for each
value of the digest's high 16 bits, so those bits need no storage. A word is
the rest of the 72 bits (the low word with its low 8 bits cleared) or'ed
with the 8-bit tag: 8 bytes an ID, plus 80 bytes an array and the growth
margin: 10.3 bytes an ID at 3.6 million. Their lookups are binary searches
in arrays of about 55 words, cheaper than in the pair blocks' 1,024 (fewer
comparisons, each turning an array item into a Python int, and smaller moves
that stay in the cache), but their fixed cost (5 MB) is only small against
millions of IDs. The word blocks never turn back into pair blocks: a shard
whose rate drops keeps them, at less memory than at its peak. The turn takes
about a second for 2.5 million IDs, once in a window's life (a takeover's
load that large goes straight into word blocks).

In both forms entries of expired buckets are *stale*: lookups ignore them,
an insert of the same identity makes its entry live again, and a *sweep*
drops them: it reads each array's tag bytes at C speed (``bytes.translate``
over every second or eighth byte) and rebuilds only the arrays holding a
stale entry (``itertools.compress``). A sweep runs once an eighth of the
entries are stale (every four buckets or so at a steady rate; about 0.3 s
for 3.6 million IDs), and before any entry could be 256 buckets old, so an
8-bit tag always names exactly one bucket.

Which block an ID lands in follows bits of an unkeyed hash of the event ID:
a producer that searched for IDs sharing their top 16 bits (about 65,536
hashes an ID) could fill one block and make inserts into it slow (a longer
move each); nothing is lost, and the producers are the operator's own jobs.

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

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress

from copier.core.packing import LOW_MASK

__all__ = ["BUCKETS_PER_HORIZON", "DedupWindow", "WindowStats"]

BUCKETS_PER_HORIZON = 32
SPLIT_AT = 1024  # entries a pair block holds on average before the pair blocks split in two
MAX_BITS = 12  # at most 4,096 pair blocks (the word blocks take over before they would fill)
WORD_BLOCKS_AT = 2_500_000  # live IDs from which the pair blocks become word blocks, for good
WORD_BLOCKS = 1 << 16  # one word block for each value of a digest's high 16 bits
WORD_MASK = LOW_MASK ^ 0xFF  # a word: the digest's low word without its low 8 bits (they hold the tag)
LOW48 = (1 << 48) - 1
TAG_MASK = 0xFF
TAG_LIMIT = 200  # buckets between the oldest entry and the newest before a forced sweep (< 256: no tag wraps)
SWEEP_STALE = 8  # a sweep runs once more than 1/SWEEP_STALE of the entries are stale
_TAIL_TAG_BYTE = 1 if sys.byteorder == "big" else 0  # where a tail's low byte (its tag) sits in its array's bytes
_WORD_TAG_BYTE = 7 if sys.byteorder == "big" else 0  # where a word's low byte (its tag) sits in its array's bytes


def _split(digest_low: int, digest_high: int) -> tuple[int, int]:
    """(key, tail without its tag) of a digest given as its two words: the 72 bits the window compares."""
    return (digest_high << 48) | (digest_low >> 16), digest_low & 0xFF00


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
    """A time-bounded set of 72-bit identities (80-bit digests, see the module docstring)."""

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
        self._split_at = split_at
        self._bits = 0
        self._shift = 64  # a key's block is key >> shift (the top ``_bits`` bits; 0 while there is one block)
        self._keys: list[array[int] | None] = [None]  # per pair block: the keys, sorted ('Q')
        self._tails: list[array[int] | None] = [None]  # per pair block, at the same index: tail | tag ('H')
        self._word_blocks_at = word_blocks_at
        self._blocks: list[array[int] | None] | None = None  # the word blocks, once the pair blocks became them
        self._words = 0  # entries stored, live and stale

    # -- sizing ---------------------------------------------------------------

    def _split_blocks(self, words: int) -> None:
        """Split every block in two until ``words`` average at most ``split_at`` a block (or the blocks reach
        ``MAX_BITS``): each cut where the keys' next bit turns to 1, found by a binary search."""
        while words > self._split_at << self._bits and self._bits < MAX_BITS:
            self._bits += 1
            self._shift = 64 - self._bits
            keys: list[array[int] | None] = []
            tails: list[array[int] | None] = []
            for i, (block, tail) in enumerate(zip(self._keys, self._tails, strict=True)):
                if block is None or tail is None:
                    keys += (None, None)
                    tails += (None, None)
                    continue
                cut = bisect_left(block, (2 * i + 1) << self._shift)
                for lo, hi in ((0, cut), (cut, len(block))):
                    keys.append(block[lo:hi] if hi > lo else None)
                    tails.append(tail[lo:hi] if hi > lo else None)
            self._keys, self._tails = keys, tails

    def _to_word_blocks(self) -> None:
        """Turn the pair blocks into word blocks: each live entry a word in the array of its high 16 bits, for
        good (about a second for 2.5 million IDs, once in a window's life)."""
        live = _live_tags(self._newest_bucket, self._span())
        grouped: list[list[int] | None] = [None] * WORD_BLOCKS
        words = 0
        for keys, tails in zip(self._keys, self._tails, strict=True):
            if keys is None or tails is None:
                continue
            for key, tail in zip(keys, tails, strict=True):
                if live[tail & TAG_MASK]:
                    group = grouped[key >> 48]
                    if group is None:
                        grouped[key >> 48] = group = []
                    group.append(((key & LOW48) << 16) | tail)
                    words += 1
        self._keys, self._tails = [None], [None]
        self._bits, self._shift = 0, 64
        self._blocks = [None if group is None else array("Q", sorted(group)) for group in grouped]
        self._words = words
        self._floor = self._oldest_live

    def reserve(self, more: int) -> None:
        """Make room once for ``more`` new IDs, not step by step while they are added (bulk loads): split the pair
        blocks for them, or turn them into word blocks now if that many IDs reach the threshold."""
        if not self.enabled or self._blocks is not None:
            return
        if self._live + more >= self._word_blocks_at:
            self._to_word_blocks()
        else:
            self._split_blocks(self._words + more)

    def memory_bytes(self) -> int:
        """Bytes held by the blocks and their lists (the per-bucket counts add a few kilobytes). Summed over the
        blocks (a few milliseconds): for logs and benchmarks, not per batch."""
        arrays = [self._keys, self._tails] if self._blocks is None else [self._blocks]
        return sum(sum(map(sys.getsizeof, filter(None, each))) + sys.getsizeof(each) for each in arrays)

    def __len__(self) -> int:
        return self._live

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
        if self._words == self._live:
            self._floor = self._oldest_live  # nothing stale is stored
        elif self._words - self._live > self._words // SWEEP_STALE:
            self._sweep()

    def _sweep(self) -> None:
        """Drop every stale entry: each block's tag bytes mapped to live (1) or stale (0) in C, and only the
        blocks holding a stale entry rebuilt from the live ones."""
        live = _live_tags(self._newest_bucket, self._span())
        if self._blocks is not None:
            self._sweep_words(live)
            return
        keys, tails = self._keys, self._tails
        words = 0
        for i, tail in enumerate(tails):
            if tail is None:
                continue
            mask = tail.tobytes()[_TAIL_TAG_BYTE::2].translate(live)
            if 0 in mask:
                kept = array("H", compress(tail, mask))
                if not kept:
                    keys[i] = tails[i] = None
                    continue
                block = keys[i]
                assert block is not None
                keys[i] = array("Q", compress(block, mask))
                tails[i] = tail = kept
            words += len(tail)
        self._words = words
        self._floor = self._oldest_live

    def _sweep_words(self, live: bytes) -> None:
        blocks = self._blocks
        assert blocks is not None
        words = 0
        for i, block in enumerate(blocks):
            if block is None:
                continue
            mask = block.tobytes()[_WORD_TAG_BYTE::8].translate(live)
            if 0 in mask:
                kept = array("Q", compress(block, mask))
                blocks[i] = block = kept if kept else None
                if block is None:
                    continue
            words += len(block)
        self._words = words
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
        key, tail = _split(digest & LOW_MASK, digest >> 64)
        if self._blocks is not None:
            block = self._blocks[key >> 48]
            if block is None:
                return False
            x = ((key & LOW48) << 16) | tail
            j = bisect_left(block, x)
            if j < len(block):
                w = block[j]
                if w ^ x <= TAG_MASK:  # the same 72 bits (x's tag byte is 0)
                    return ((self._newest_bucket - w) & TAG_MASK) <= self._span()
            return False
        block = self._keys[key >> self._shift]
        if block is None:
            return False
        tails = self._tails[key >> self._shift]
        assert tails is not None
        j, n = bisect_left(block, key), len(block)
        while j < n and block[j] == key:
            t = tails[j]
            if t ^ tail <= TAG_MASK:  # the same tail: the same 72 bits
                return ((self._newest_bucket - t) & TAG_MASK) <= self._span()
            j += 1
        return False

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
        if self._blocks is not None:
            added, moved = self._add_words(low, high, bucket)
        else:
            added, moved = self._add_pairs(low, high, bucket)
        if added or moved:
            counts = self._counts
            counts[bucket] = counts.get(bucket, 0) + added + moved
            self._live += added
            self._enforce_cap()
            self._maybe_sweep()
            if self._blocks is None:
                if self._live >= self._word_blocks_at:
                    self._to_word_blocks()
                else:
                    self._split_blocks(self._words)

    def _unlive(self, bucket: int) -> None:
        """An entry of live ``bucket`` moves to a newer one."""
        counts = self._counts
        counts[bucket] -= 1
        if not counts[bucket]:
            del counts[bucket]

    def _add_pairs(self, low: Iterable[int], high: Iterable[int], bucket: int) -> tuple[int, int]:
        keys, tails, shift = self._keys, self._tails, self._shift
        nb, span = self._newest_bucket, self._span()
        tag = bucket & TAG_MASK
        added = moved = words = 0
        for lo, hi in zip(low, high, strict=True):
            key, tail = (hi << 48) | (lo >> 16), lo & 0xFF00  # _split, inline: this loop runs per event
            i = key >> shift
            block = keys[i]
            if block is None:
                keys[i] = array("Q", (key,))
                tails[i] = array("H", (tail | tag,))
                words += 1
                added += 1
                continue
            ts = tails[i]
            assert ts is not None
            j, n = bisect_left(block, key), len(block)
            while j < n and block[j] == key:
                t = ts[j]
                if t ^ tail <= TAG_MASK:  # the same 72 bits: this ID is stored
                    age = (nb - t) & TAG_MASK
                    if age > span:  # stale: it counts again, in this bucket
                        ts[j] = tail | tag
                        added += 1
                    elif nb - age < bucket:  # live in an older bucket: it now lives in this one
                        self._unlive(nb - age)
                        ts[j] = tail | tag
                        moved += 1
                    break
                j += 1
            else:
                block.insert(j, key)
                ts.insert(j, tail | tag)
                words += 1
                added += 1
        self._words += words
        return added, moved

    def _add_words(self, low: Iterable[int], high: Iterable[int], bucket: int) -> tuple[int, int]:
        blocks = self._blocks
        assert blocks is not None
        nb, span = self._newest_bucket, self._span()
        tag = bucket & TAG_MASK
        added = moved = words = 0
        for lo, hi in zip(low, high, strict=True):
            x = lo & WORD_MASK
            block = blocks[hi]
            if block is None:
                blocks[hi] = array("Q", (x | tag,))
                words += 1
                added += 1
                continue
            j = bisect_left(block, x)
            if j < len(block):
                w = block[j]
                if w ^ x <= TAG_MASK:  # the same 72 bits: this ID is stored
                    age = (nb - w) & TAG_MASK
                    if age > span:  # stale: it counts again, in this bucket
                        block[j] = x | tag
                        added += 1
                    elif nb - age < bucket:  # live in an older bucket: it now lives in this one
                        self._unlive(nb - age)
                        block[j] = x | tag
                        moved += 1
                    continue
            block.insert(j, x | tag)
            words += 1
            added += 1
        self._words += words
        return added, moved
