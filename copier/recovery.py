"""Verifying a batch found in flight on takeover: what landed, what is left to redo.

A processor writes a chunk's digest batch (index ``batches + 1``) before it
puts, and commits it (``batches`` moves up, the position moves on) after the
put. A new owner that finds a digest batch one above the committed index
cannot know how much of its put landed: wholly, partly or not at all (or,
for a fenced writer's leftover, never started). Once the old lease has run
out, no put of the old owner can still be under way, so the new owner reads
the destination streams over the batch's time range and counts what it
finds. What the batch sent but the stream does not hold joins the *redo*
set: when the replayed records arrive, exactly those are forwarded
(``copier.plan``).

The committed state already carries a redo set ``R`` (from an earlier
verification) covering records up to ``redo_last``. The batch's sends ``S``
are of two kinds: sends that consumed ``R`` (records in the redo range) and
new sends past it. After the batch, what is still outstanding is::

    R - (S & R) + (S - L)          L: the sends found in the streams

``S & R`` (multiset intersection) are the sends that consumed ``R``, because
the plan sends from the redo range only what ``R`` still counts. Whatever
landed leaves the set; whatever did not (consumed or new) is in it. So the
set never outgrows one chunk plus what was already outstanding, and every
record in it lies in ``(committed position, redo_last]``: at most
``MAX_CHUNK_EVENTS`` digests.

Records without an event ID are recognised by their content (partition key
and bytes), and identical ones cannot be told apart: the read, which starts
a clock margin before the chunk, may count a copy that the chunk before put
a moment earlier. Counted as this chunk's, that copy would make the chunk's
own copy look landed when it is not: a loss. So :func:`earlier_copies`
discounts every unkeyed copy the preceding chunks put that could fall in
the read. A discount too many resends a copy that had landed: events
without an ID are delivered at least once (their producer retries are
forwarded too), never lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from copier.positions import Position
from copier.state import DigestBatch

__all__ = ["Resolution", "earlier_copies", "resolve"]


@dataclass(frozen=True)
class Resolution:
    redo_last: Position
    redo_digests: tuple[int, ...]
    landed: int
    missing: int


def _landed(sent: Iterable[int], found: Counter[int]) -> Counter[int]:
    """The sends the stream holds: each record found vouches for one send of its identity."""
    budget = Counter(found)
    landed: Counter[int] = Counter()
    for identity in sent:
        if budget[identity] > 0:
            budget[identity] -= 1
            landed[identity] += 1
    return landed


def resolve(
    batch: DigestBatch,
    found_target: Counter[int],
    found_deadletter: Counter[int],
    redo_last: Position | None,
    redo_digests: Iterable[int],
) -> Resolution:
    """The redo set after ``batch``, merged with the one the committed state carried."""
    target, deadletter = batch.target_digests(), batch.deadletter_digests()
    sent = Counter(target) + Counter(deadletter)
    landed = _landed(target, found_target) + _landed(deadletter, found_deadletter)
    before = Counter(redo_digests)
    left = (before - (sent & before)) + (sent - landed)
    last = batch.last if redo_last is None else max(batch.last, redo_last)
    landed_count = sum(landed.values())
    return Resolution(last, tuple(sorted(left.elements())), landed_count, sum(sent.values()) - landed_count)


def earlier_copies(started_ms: int, clock_skew_ms: int, earlier: Iterable[tuple[int, Iterable[int]]]) -> Counter[int]:
    """Unkeyed copies put by the chunks before one started at ``started_ms`` that its verification may read.

    ``earlier``: (started_ms, unkeyed digests) of the committed chunks before
    it, newest first. A chunk committed before the next one started, and
    Kinesis stamps a record within ``clock_skew_ms`` of the copier's clock, so
    a chunk's copies can fall in a read from ``started_ms - clock_skew_ms`` only
    if the chunk after it started at or after ``started_ms - 2 * clock_skew_ms``.
    """
    copies: Counter[int] = Counter()
    newer = started_ms
    for chunk_started, unkeyed in earlier:
        if newer < started_ms - 2 * clock_skew_ms:
            break
        copies.update(unkeyed)
        newer = chunk_started
    return copies
