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
low 8 bits of the low word are dropped, see ``IDENTITY_MASK``): a new ID is
taken for a forwarded one, and dropped, only if those 72 bits equal those
of one of the IDs in the window, about 3.6e6 / 2**72 = 8e-16 an event
against a full hour at 1,000 events/s. The digests stored in the state
table keep all 80 bits (a verification compares them all).

Memory is the constraint: an hour at a shard's write limit is 3.6 million
IDs, and a host runs dozens of shards. A Python ``set`` of digests costs
about 95 bytes an ID. The window has two forms, one at a time:

*A table* while it holds fewer than ``block_threshold`` IDs (1,000,000):
12 bytes a slot, kept between 55% and 75% full, so 16 to 22 bytes an ID
(``memory_bytes``; 20 right after a takeover's load), plus a transient copy
while it is rebuilt:

* open addressing with linear probing over two machine arrays: ``_keys``
  (``'Q'``: the digest's low 64 bits with the low 8 cleared; 0 marks an empty
  slot, so a low word of 0 is stored as ``ZERO_LOW``) and ``_aux`` (``'I'``:
  the digest's high 16 bits, shifted left 16, or'ed with a 16-bit bucket
  tag); an entry's home slot is ``(key >> 8) % slots``;
* a bucket is live while it may hold an arrival within the horizon of the
  newest; entries of expired buckets are *stale*: lookups ignore them, an
  insert takes over the first stale slot on its probe path, and when live
  and stale entries fill 75% of the slots the rest are dropped in place
  (``_compact``), or, if too few are stale, the table grows by 1.36 times;
* tags are bucket numbers modulo 2**16; every entry's bucket lies within
  2**16 of the newest (a rebuild is forced before it could not), so a tag
  always names exactly one bucket.

*Blocks* from then on: 65,536 sorted arrays (``'Q'``), one for each value of
the digest's high 16 bits, so those bits need no storage. A word is the
rest of the 72 bits (the low word with its low 8 bits cleared) or'ed with
an 8-bit bucket tag: 8 bytes an ID, plus 80 bytes an array, Python's growth
margin and the stale words not yet swept: 10.3 bytes an ID at 3.6 million
(``copier.bench``, section 3), under 12 from about 2 million. A lookup or
an insert is one binary search in an array of about 55 words (``bisect``,
in C): about 0.2 us more a lookup than the table's probe, 0.6 us more an
insert with the sweeps. Stale words stay in their arrays until a *sweep*
drops them: it reads each array's tag bytes at C speed (``bytes.translate``
over every eighth byte) and rebuilds only the arrays holding a stale word
(``itertools.compress``). A sweep runs once an eighth of the words are
stale (every four buckets or so at a steady rate; 0.3 s for 3.6 million
IDs), and before any word could be 256 buckets old, so an 8-bit tag always
names exactly one bucket. The blocks never turn back into a table; an
array left empty is freed. The array is chosen by bits of an unkeyed hash of
the event ID: a producer that searched for IDs sharing their top 16 bits
(about 65,536 hashes an ID) could fill one array and make inserts into it
slow (a copy of the array each); nothing is lost, and the producers are
the operator's own jobs.

In both forms:

* time in *buckets* of ``horizon / 32``: an entry's tag is the bucket of the
  newest arrival of the chunk that added it, so it is remembered at least as
  long as its own arrival requires, and longer by up to one bucket plus the
  arrival span of its chunk (harmless: an ID seen again is a duplicate
  however late; the guarantee is the lower bound);
* a count cap (``copier.dedupWindowMaxEvents``) guards memory: above it the
  oldest buckets expire early and :attr:`DedupWindow.cut_short` says so.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, compress

from copier.core.packing import LOW_MASK

__all__ = ["BUCKETS_PER_HORIZON", "IDENTITY_MASK", "DedupWindow", "WindowStats"]

BUCKETS_PER_HORIZON = 32
MIN_SLOTS = 1024
GROW_LOAD = 0.55  # after a rebuild that grows the table: 22 bytes an ID, growth by 1.36x
RESERVE_LOAD = 0.6  # after a bulk reservation (a takeover's load): 20 bytes an ID
MAX_LOAD = 0.75  # occupied slots (live and stale) that trigger a rebuild: 16 bytes an ID
MIN_LOAD = 0.3  # live entries below which a larger table shrinks
TAG_MASK = 0xFFFF
TAG_LIMIT = 60_000  # buckets between the oldest entry and the newest before a forced rebuild

IDENTITY_MASK = LOW_MASK ^ 0xFF  # the bits of a digest's low word the window compares (and its high 16)
ZERO_LOW = 0x80  # how the table stores a low word of 0 (0 marks an empty slot; no real word has these bits)
BLOCK_THRESHOLD = 1_000_000  # IDs from which the table becomes blocks: about 13 bytes an ID either way there
BLOCKS = 1 << 16  # one sorted array for each value of the high 16 bits
BLOCK_TAG_MASK = 0xFF
BLOCK_TAG_LIMIT = 200  # buckets between the oldest word and the newest before a forced sweep (< 256: no word wraps)
SWEEP_STALE = 8  # a sweep runs once more than 1/SWEEP_STALE of the words are stale
_TAG_BYTE = 7 if sys.byteorder == "big" else 0  # where a word's low byte (its tag) sits in its array's bytes


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
        self, horizon_ms: int, max_ids: int, min_slots: int = MIN_SLOTS, block_threshold: int = BLOCK_THRESHOLD
    ) -> None:
        if horizon_ms < 0 or max_ids < 0:
            raise ValueError("horizon_ms and max_ids must be >= 0")
        self.horizon_ms = horizon_ms
        self.max_ids = max_ids
        self.enabled = horizon_ms > 0 and max_ids > 0
        self.bucket_ms = max(1, horizon_ms // BUCKETS_PER_HORIZON)
        self.newest_ms = 0
        self._newest_bucket = 0
        self._oldest_live = 0  # lowest bucket whose entries count
        self._floor = 0  # no entry in the table (or word in the blocks) has a lower bucket
        self._counts: dict[int, int] = {}  # live bucket -> entries
        self._live = 0
        self._cap_floor: int | None = None  # the count cap expired every bucket below this one
        self._min_slots = max(8, min_slots)
        self._block_threshold = block_threshold
        self._blocks: list[array[int] | None] | None = None  # the blocks, once the table became them
        self._words = 0  # words in the blocks, live and stale
        self._allocate(self._min_slots if self.enabled else 1)

    # -- sizing ---------------------------------------------------------------

    def _allocate(self, slots: int) -> None:
        self._slots = slots
        self._keys: array[int] = array("Q", bytes(8 * slots))
        self._aux: array[int] = array("I", bytes(4 * slots))
        self._used = 0  # occupied slots, live or stale
        self._limit = int(slots * MAX_LOAD)

    def _span(self) -> int:
        return self._newest_bucket - self._oldest_live

    def _rebuild(self, live_needed: int, load: float = GROW_LOAD) -> None:
        """Copy the live entries into a table sized for ``live_needed`` at ``load`` (or into blocks, if that many
        IDs reach the threshold)."""
        if live_needed >= self._block_threshold:
            self._to_blocks()
            return
        keys, aux = self._keys, self._aux
        nb, span = self._newest_bucket, self._span()
        self._allocate(max(self._min_slots, int(live_needed / load) + 1))
        new_keys, new_aux, slots = self._keys, self._aux, self._slots
        used = 0
        for k, a in zip(keys, aux, strict=True):
            if k and ((nb - a) & TAG_MASK) <= span:
                j = (k >> 8) % slots
                while new_keys[j]:
                    j += 1
                    if j == slots:
                        j = 0
                new_keys[j] = k
                new_aux[j] = a
                used += 1
        self._used = used
        self._floor = self._oldest_live

    def _compact(self) -> None:
        """Drop the stale entries in place, moving live ones back into the holes (no second table).

        One pass from an empty slot: within each cluster, a stale entry
        becomes a hole, and a live entry moves to the first hole at or after
        its home slot, which keeps every entry reachable from its home with
        no empty slot on the way (the linear-probing invariant).
        """
        keys, aux, slots = self._keys, self._aux, self._slots
        nb, span = self._newest_bucket, self._span()
        start = keys.index(0)  # the table is never full, so an empty slot exists
        holes: list[int] = []  # offsets from start of the current cluster's holes, ascending
        used = 0
        for offset in range(1, slots):
            i = start + offset
            if i >= slots:
                i -= slots
            k = keys[i]
            if not k:
                holes.clear()  # end of a cluster: its holes cannot serve the next one
                continue
            a = aux[i]
            if ((nb - a) & TAG_MASK) > span:
                keys[i] = 0
                holes.append(offset)
                continue
            used += 1
            if not holes:
                continue
            home = ((k >> 8) % slots - start) % slots
            at = bisect_left(holes, home)
            if at == len(holes):
                continue  # every hole lies before its home: it stays
            j = start + holes.pop(at)
            if j >= slots:
                j -= slots
            keys[j] = k
            aux[j] = a
            keys[i] = 0
            holes.append(offset)
        self._used = used
        self._floor = self._oldest_live

    def _make_room(self, live_now: int) -> None:
        """The table is full (live and stale): compact it if a fifth is stale, and grow it if still nearly full."""
        if self._used - live_now >= self._used // 5:
            self._compact()
        if self._used >= self._limit * 0.8:
            self._rebuild(live_now)

    def _to_blocks(self) -> None:
        """Turn the table into blocks: its live entries sorted into one array per high 16 bits, for good."""
        nb, span = self._newest_bucket, self._span()
        grouped: list[array[int] | None] = [None] * BLOCKS
        words = 0
        for k, a in zip(self._keys, self._aux, strict=True):
            if k and ((nb - a) & TAG_MASK) <= span:
                word = (k & IDENTITY_MASK) | (a & BLOCK_TAG_MASK)
                block = grouped[a >> 16]
                if block is None:
                    grouped[a >> 16] = array("Q", (word,))
                else:
                    block.append(word)
                words += 1
        self._keys = array("Q")
        self._aux = array("I")
        self._slots = self._used = self._limit = 0
        for i, block in enumerate(grouped):
            if block is not None:
                grouped[i] = array("Q", sorted(block))
        self._blocks = grouped
        self._words = words
        self._floor = self._oldest_live

    def reserve(self, more: int) -> None:
        """Make room for ``more`` new IDs without rebuilding while they are added (bulk loads)."""
        if self.enabled and self._blocks is None and self._used + more > self._limit:
            self._rebuild(self._live + more, RESERVE_LOAD)

    def memory_bytes(self) -> int:
        """Bytes held by the table's arrays, or by the blocks and their list (the per-bucket counts add a few
        kilobytes). Summed over the blocks (a few milliseconds): for logs and benchmarks, not per batch."""
        blocks = self._blocks
        if blocks is not None:
            return sum(map(sys.getsizeof, filter(None, blocks))) + sys.getsizeof(blocks)
        return self._keys.buffer_info()[1] * 8 + self._aux.buffer_info()[1] * 4

    def __len__(self) -> int:
        return self._live

    # -- time -------------------------------------------------------------------

    def advance(self, arrival_ms: int) -> None:
        """The shard has seen an arrival this new: expire what the horizon no longer covers."""
        if not self.enabled or arrival_ms <= self.newest_ms:
            return
        newest_bucket = arrival_ms // self.bucket_ms
        horizon_floor = (arrival_ms - self.horizon_ms) // self.bucket_ms
        if newest_bucket - self._floor > (TAG_LIMIT if self._blocks is None else BLOCK_TAG_LIMIT):
            # drop the stale before the newest bucket moves: under the old one every tag still names one bucket
            self._expire_below(horizon_floor)
            if self._blocks is None:
                self._rebuild(self._live)
            else:
                self._sweep()
        self.newest_ms = arrival_ms
        self._newest_bucket = newest_bucket
        expired = self._expire_below(horizon_floor)
        if self._blocks is not None:
            self._maybe_sweep()
            return
        if expired and self._slots > self._min_slots and self._live < self._slots * MIN_LOAD:
            self._rebuild(self._live)

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
        while self._live > self.max_ids and self._counts:
            self._expire_below(min(self._counts) + 1)
            self._cap_floor = self._oldest_live

    def _maybe_sweep(self) -> None:
        """Sweep the blocks if enough of their words are stale (:meth:`advance` sweeps before a tag could name two
        buckets)."""
        if self._words == self._live:
            self._floor = self._oldest_live  # nothing stale is stored
        elif self._words - self._live > self._words // SWEEP_STALE:
            self._sweep()

    def _sweep(self) -> None:
        """Drop every stale word: each array's tag bytes mapped to live (1) or stale (0) in C, and only the
        arrays holding a stale word rebuilt from the live ones."""
        blocks = self._blocks
        assert blocks is not None
        nb, span = self._newest_bucket, self._span()
        live = bytes(1 if ((nb - tag) & BLOCK_TAG_MASK) <= span else 0 for tag in range(256))
        words = 0
        for i, block in enumerate(blocks):
            if block is None:
                continue
            mask = block.tobytes()[_TAG_BYTE::8].translate(live)
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
        blocks = self._blocks
        if blocks is not None:
            block = blocks[digest >> 64]
            if block is None:
                return False
            x = digest & IDENTITY_MASK
            j = bisect_left(block, x)
            if j < len(block):
                w = block[j]
                if w ^ x <= BLOCK_TAG_MASK:  # the same 72 bits (x's tag byte is 0)
                    return ((self._newest_bucket - w) & BLOCK_TAG_MASK) <= self._newest_bucket - self._oldest_live
            return False
        low = (digest & IDENTITY_MASK) or ZERO_LOW
        high = digest >> 64
        keys, slots = self._keys, self._slots
        i = (low >> 8) % slots
        while True:
            k = keys[i]
            if k == low:
                a = self._aux[i]
                if a >> 16 == high:
                    return ((self._newest_bucket - a) & TAG_MASK) <= self._span()
            elif not k:
                return False
            i += 1
            if i == slots:
                i = 0

    def add(self, digests: Iterable[int], arrival_ms: int) -> None:
        """Remember digests forwarded by a batch whose newest arrival is ``arrival_ms``."""
        values = digests if isinstance(digests, list) else list(digests)
        self.add_columns([d & LOW_MASK for d in values], [d >> 64 for d in values], arrival_ms)

    def add_columns(self, low: Iterable[int], high: Iterable[int], arrival_ms: int) -> None:
        """:meth:`add` from the two columns of a stored digest list (``copier.core.packing``), without int objects."""
        if not self.enabled:
            return
        self.advance(arrival_ms)
        bucket = arrival_ms // self.bucket_ms
        if bucket < self._oldest_live:
            return  # older than the horizon (or than what the cap keeps)
        if self._blocks is not None:
            added, moved = self._add_to_blocks(low, high, bucket)
        else:
            added, moved = self._add_to_table(low, high, bucket)
        if added or moved:
            counts = self._counts
            counts[bucket] = counts.get(bucket, 0) + added + moved
            self._live += added
            self._enforce_cap()
            if self._blocks is not None:
                self._maybe_sweep()
            elif self._live >= self._block_threshold:
                self._to_blocks()

    def _unlive(self, bucket: int) -> None:
        """An entry of live ``bucket`` moves to a newer one."""
        counts = self._counts
        counts[bucket] -= 1
        if not counts[bucket]:
            del counts[bucket]

    def _add_to_table(self, low: Iterable[int], high: Iterable[int], bucket: int) -> tuple[int, int]:
        nb, span = self._newest_bucket, self._span()
        tag = bucket & TAG_MASK
        added = moved = 0
        keys, aux, slots, used, limit = self._keys, self._aux, self._slots, self._used, self._limit
        lows, highs = iter(low), iter(high)
        for lo, hi in zip(lows, highs, strict=True):
            if used >= limit:
                self._used = used
                self._make_room(self._live + added)
                if self._blocks is not None:  # the table became blocks: this ID and the rest go there
                    more, also = self._add_to_blocks(chain((lo,), lows), chain((hi,), highs), bucket)
                    return added + more, moved + also
                keys, aux, slots, used, limit = self._keys, self._aux, self._slots, self._used, self._limit
            lo = (lo & IDENTITY_MASK) or ZERO_LOW
            i = (lo >> 8) % slots
            reuse = -1  # the first stale slot on the way: the new entry goes there
            while True:
                k = keys[i]
                if not k:
                    if reuse < 0:
                        reuse = i
                        used += 1
                    keys[reuse] = lo
                    aux[reuse] = (hi << 16) | tag
                    added += 1
                    break
                a = aux[i]
                if k == lo and a >> 16 == hi:
                    age = (nb - a) & TAG_MASK
                    if age > span:  # stale: it counts again, in this bucket
                        aux[i] = (hi << 16) | tag
                        added += 1
                    elif nb - age < bucket:  # live in an older bucket: it now lives in this one
                        self._unlive(nb - age)
                        aux[i] = (hi << 16) | tag
                        moved += 1
                    break
                if reuse < 0 and ((nb - a) & TAG_MASK) > span:
                    reuse = i
                i += 1
                if i == slots:
                    i = 0
        self._used = used
        return added, moved

    def _add_to_blocks(self, low: Iterable[int], high: Iterable[int], bucket: int) -> tuple[int, int]:
        blocks = self._blocks
        assert blocks is not None
        nb, span = self._newest_bucket, self._span()
        tag = bucket & BLOCK_TAG_MASK
        added = moved = words = 0
        for lo, hi in zip(low, high, strict=True):
            x = lo & IDENTITY_MASK
            block = blocks[hi]
            if block is None:
                blocks[hi] = array("Q", (x | tag,))
                words += 1
                added += 1
                continue
            j = bisect_left(block, x)
            if j < len(block):
                w = block[j]
                if w ^ x <= BLOCK_TAG_MASK:  # the same 72 bits: this ID is stored
                    age = (nb - w) & BLOCK_TAG_MASK
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
