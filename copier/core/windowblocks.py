"""The dedup window's two storage forms: sorted blocks of 72-bit identities, each with an 8-bit bucket tag.

``copier.core.window.DedupWindow`` keeps time (buckets, expiry, the count
cap) and chooses the form; a form only stores: it finds an identity's tag,
adds a batch, drops the entries a sweep's table calls stale, and says how
much memory it holds. Both are memory-bound, hence arrays of machine words
searched with ``bisect`` (in C), and both loops that run per event are
written out inline, without a call per event.

*Pair blocks* (:class:`PairBlocks`), while the window holds fewer than
``DedupWindow.word_blocks_at`` IDs (2,500,000): 10 bytes an ID, plus about 6%
of growth margin and a few hundred bytes a block:

* an identity is split into a *key*, its top 64 bits (the digest's high 16
  bits above the low word's bits 16-63), kept in an ``array('Q')``, and a
  *tail*, the low word's bits 8-15 above an 8-bit bucket *tag*, kept at the
  same index of an ``array('H')``;
* the pairs sit in blocks, each sorted by key: block ``i`` holds the keys
  whose top ``bits`` bits are ``i``. A lookup or an insert is one binary
  search in a block of 512 to 1,024 keys on average, then a look at the
  tails of the keys equal to it (two identities share a key about once in
  2**64 pairs); an insert moves the rest of its block up (a ``memmove`` of a
  few kilobytes);
* the blocks *split* (:meth:`PairBlocks.split`) when they hold more than
  ``split_at`` (1,024) entries on average, and before a batch that would
  overfill them is added (a KPL batch of tens of thousands of events):
  ``bits`` grows by one and every block is cut in two where its keys' next
  bit turns to 1 (a binary search and two slices in C). They never merge;
  an empty one is freed.

*Word blocks* (:class:`WordBlocks`) from then on: 65,536 sorted arrays
(``'Q'``), one for each value of the digest's high 16 bits, so those bits
need no storage. A word is the rest of the 72 bits (the low word with its
low 8 bits cleared) or'ed with the 8-bit tag: 8 bytes an ID, plus 80 bytes an
array and the growth margin: 10.3 bytes an ID at 3.6 million. Their lookups
are binary searches in arrays of about 55 words, cheaper than in the pair
blocks' 1,024 (fewer comparisons, each turning an array item into a Python
int, and smaller moves that stay in the cache), but their fixed cost (5 MB)
is only small against millions of IDs.

In both forms an entry whose bucket expired is *stale*: the window ignores
it, an insert of the same identity makes it live again, and a *sweep* drops
it: it reads each array's tag bytes at C speed (``bytes.translate`` over
every second or eighth byte, with the window's table of live tags) and
rebuilds only the arrays holding a stale entry (``itertools.compress``).

Which block an ID lands in follows bits of an unkeyed hash of the event ID:
a producer that searched for IDs sharing their top 16 bits (about 65,536
hashes an ID) could fill one block and make inserts into it slow (a longer
move each); nothing is lost, and the producers are the operator's own jobs.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from collections.abc import Iterable
from itertools import compress

from copier.core.packing import LOW_MASK

__all__ = ["MAX_BITS", "SPLIT_AT", "TAG_MASK", "WORD_BLOCKS", "PairBlocks", "WordBlocks"]

SPLIT_AT = 1024  # entries a pair block holds on average before the pair blocks split in two
MAX_BITS = 12  # at most 4,096 pair blocks (the word blocks take over before they would fill)
WORD_BLOCKS = 1 << 16  # one word block for each value of a digest's high 16 bits
WORD_MASK = LOW_MASK ^ 0xFF  # a word: the digest's low word without its low 8 bits (they hold the tag)
LOW48 = (1 << 48) - 1
TAG_MASK = 0xFF
_TAIL_TAG_BYTE = 1 if sys.byteorder == "big" else 0  # where a tail's low byte (its tag) sits in its array's bytes
_WORD_TAG_BYTE = 7 if sys.byteorder == "big" else 0  # where a word's low byte (its tag) sits in its array's bytes


def _moved(counts: dict[int, int], bucket: int) -> None:
    """An entry of live ``bucket`` now lives in a newer one: one fewer in ``bucket``."""
    counts[bucket] -= 1
    if not counts[bucket]:
        del counts[bucket]


def _sizes(arrays: list[array[int] | None]) -> int:
    return sum(map(sys.getsizeof, filter(None, arrays))) + sys.getsizeof(arrays)


class PairBlocks:
    """Identities as (key, tail) pairs in blocks cut by their keys' top bits; see the module docstring."""

    def __init__(self, split_at: int = SPLIT_AT) -> None:
        self.split_at = split_at
        self.bits = 0
        self.shift = 64  # a key's block is key >> shift (the top ``bits`` bits; 0 while there is one block)
        self.keys: list[array[int] | None] = [None]  # per block: the keys, sorted ('Q')
        self.tails: list[array[int] | None] = [None]  # per block, at the same index: tail | tag ('H')
        self.words = 0  # entries stored, live and stale

    def tag_of(self, digest: int) -> int:
        """The bucket tag stored with this identity (its 72 bits), -1 when it is not stored."""
        lo = digest & LOW_MASK
        key, tail = ((digest >> 64) << 48) | (lo >> 16), lo & 0xFF00
        i = key >> self.shift
        block = self.keys[i]
        if block is None:
            return -1
        tails = self.tails[i]
        assert tails is not None
        j, n = bisect_left(block, key), len(block)
        while j < n and block[j] == key:
            t = tails[j]
            if t ^ tail <= TAG_MASK:  # the same tail: the same 72 bits
                return t & TAG_MASK
            j += 1
        return -1

    def add(
        self, low: Iterable[int], high: Iterable[int], bucket: int, newest: int, span: int, counts: dict[int, int]
    ) -> tuple[int, int]:
        """Store a batch tagged ``bucket``: (IDs that became live, IDs moved from an older live bucket). An ID
        stored stale (older than ``span`` buckets behind ``newest``) counts again; ``counts`` loses the moved."""
        keys, tails, shift = self.keys, self.tails, self.shift
        tag = bucket & TAG_MASK
        added = moved = words = 0
        for lo, hi in zip(low, high, strict=True):
            key, tail = (hi << 48) | (lo >> 16), lo & 0xFF00  # as tag_of, inline: this loop runs per event
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
                    age = (newest - t) & TAG_MASK
                    if age > span:  # stale: it counts again, in this bucket
                        ts[j] = tail | tag
                        added += 1
                    elif newest - age < bucket:  # live in an older bucket: it now lives in this one
                        _moved(counts, newest - age)
                        ts[j] = tail | tag
                        moved += 1
                    break
                j += 1
            else:
                block.insert(j, key)
                ts.insert(j, tail | tag)
                words += 1
                added += 1
        self.words += words
        return added, moved

    def split(self, words: int) -> None:
        """Split every block in two until ``words`` average at most ``split_at`` a block (or the blocks reach
        ``MAX_BITS``): each cut where the keys' next bit turns to 1, found by a binary search."""
        while words > self.split_at << self.bits and self.bits < MAX_BITS:
            self.bits += 1
            self.shift = 64 - self.bits
            keys: list[array[int] | None] = []
            tails: list[array[int] | None] = []
            for i, (block, tail) in enumerate(zip(self.keys, self.tails, strict=True)):
                if block is None or tail is None:
                    keys += (None, None)
                    tails += (None, None)
                    continue
                cut = bisect_left(block, (2 * i + 1) << self.shift)
                for lo, hi in ((0, cut), (cut, len(block))):
                    keys.append(block[lo:hi] if hi > lo else None)
                    tails.append(tail[lo:hi] if hi > lo else None)
            self.keys, self.tails = keys, tails

    def sweep(self, live: bytes) -> None:
        """Drop every entry whose tag ``live`` maps to 0; a block left empty is freed."""
        keys, tails = self.keys, self.tails
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
        self.words = words

    def memory_bytes(self) -> int:
        return _sizes(self.keys) + _sizes(self.tails)


class WordBlocks:
    """Identities as words in 65,536 arrays, one per value of the digest's high 16 bits; see the module
    docstring."""

    def __init__(self, blocks: list[array[int] | None], words: int) -> None:
        self.blocks = blocks
        self.words = words  # entries stored, live and stale

    @classmethod
    def from_pairs(cls, pairs: PairBlocks, live: bytes) -> WordBlocks:
        """The live entries of ``pairs`` (by the table ``live``) as word blocks, each with its tag (about a second
        for 2.5 million IDs, once in a window's life)."""
        grouped: list[list[int] | None] = [None] * WORD_BLOCKS
        words = 0
        for keys, tails in zip(pairs.keys, pairs.tails, strict=True):
            if keys is None or tails is None:
                continue
            for key, tail in zip(keys, tails, strict=True):
                if live[tail & TAG_MASK]:
                    group = grouped[key >> 48]
                    if group is None:
                        grouped[key >> 48] = group = []
                    group.append(((key & LOW48) << 16) | tail)
                    words += 1
        return cls([None if group is None else array("Q", sorted(group)) for group in grouped], words)

    def tag_of(self, digest: int) -> int:
        """The bucket tag stored with this identity (its 72 bits), -1 when it is not stored."""
        block = self.blocks[digest >> 64]
        if block is None:
            return -1
        x = digest & WORD_MASK
        j = bisect_left(block, x)
        if j < len(block):
            w = block[j]
            if w ^ x <= TAG_MASK:  # the same 72 bits (x's tag byte is 0)
                return w & TAG_MASK
        return -1

    def add(
        self, low: Iterable[int], high: Iterable[int], bucket: int, newest: int, span: int, counts: dict[int, int]
    ) -> tuple[int, int]:
        """As :meth:`PairBlocks.add`."""
        blocks = self.blocks
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
                    age = (newest - w) & TAG_MASK
                    if age > span:  # stale: it counts again, in this bucket
                        block[j] = x | tag
                        added += 1
                    elif newest - age < bucket:  # live in an older bucket: it now lives in this one
                        _moved(counts, newest - age)
                        block[j] = x | tag
                        moved += 1
                    continue
            block.insert(j, x | tag)
            words += 1
            added += 1
        self.words += words
        return added, moved

    def sweep(self, live: bytes) -> None:
        """As :meth:`PairBlocks.sweep`."""
        blocks = self.blocks
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
        self.words = words

    def memory_bytes(self) -> int:
        return _sizes(self.blocks)
