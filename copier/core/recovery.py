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
(``copier.core.plan``).

The reads and identities follow the settings the batch was *recorded*
with (``DigestBatch.settings``), not the new owner's: a rolling deploy of a
new dedup key or dead-letter stream must not make a landed record look
missing, nor a missing one look landed.

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
``MAX_CHUNK_EVENTS`` digests. All three are counted in the identities of
the redo set's settings: when a batch consumed a redo set recorded under
other settings, it stored each send's identity under those settings too
(``DigestBatch.redo_ids``), and the result stays in them.

Records without an event ID are recognised only by their content (partition
key and bytes), and identical ones cannot be told apart: not this shard's
from another staging shard's (several producers, explicit hash keys, a
parent and its child), nor this chunk's from the chunk before. Counting a
copy found in the target as this batch's would lose this batch's own copy
whenever the copy found was another's. So a verification never counts an
unkeyed send as landed: every unkeyed send of a batch in flight is sent
again. Events without an ID are delivered at least once, never lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from copier.core.packing import digest_count, unpack_digests
from copier.core.positions import Position
from copier.core.state import DigestBatch

__all__ = ["Resolution", "resolve"]


@dataclass(frozen=True)
class Resolution:
    redo_last: Position
    redo_digests: tuple[int, ...]
    redo_settings: str  # the settings redo_digests are computed under
    landed: int
    missing: int
    unkeyed_resent: int  # unkeyed sends sent again because a verification cannot tell them apart


def _landed(sent: list[int], found: Counter[int]) -> list[bool]:
    """Which sends the stream holds: each record found vouches for one send of its identity."""
    budget = Counter(found)
    out = []
    for identity in sent:
        hit = budget[identity] > 0
        if hit:
            budget[identity] -= 1
        out.append(hit)
    return out


def resolve(
    batch: DigestBatch,
    found_target: Counter[int],
    found_deadletter: Counter[int],
    redo_last: Position | None,
    redo_digests: Iterable[int],
    recorded: str,
) -> Resolution:
    """The redo set after ``batch``, merged with the one the committed state carried.

    ``recorded``: the batch's plan settings as the verifier read them, encoded: its own ``settings``, or, for
    a batch of an earlier copier that stored none, what that copier planned under spelled out (IDs read as
    it read them, keys counted as it counted them). The redo set keeps its identities, so it must name
    them: an empty name would read as "the current settings" when the records are replayed."""
    keyed, deadletter = unpack_digests(batch.keyed), unpack_digests(batch.deadletter)
    unkeyed = digest_count(batch.unkeyed)
    landed = _landed(keyed, found_target) + [False] * unkeyed + _landed(deadletter, found_deadletter)
    ids = unpack_digests(batch.redo_ids) if batch.redo_ids else batch.entry_digests()
    if len(ids) != len(landed):
        raise ValueError(f"{batch.key}: {len(ids)} redo identities for {len(landed)} entries")
    sent = Counter(ids)
    found = Counter(identity for identity, hit in zip(ids, landed, strict=True) if hit)
    before = Counter(redo_digests)
    left = (before - (sent & before)) + (sent - found)
    last = batch.last if redo_last is None else max(batch.last, redo_last)
    count = sum(found.values())
    return Resolution(
        last,
        tuple(sorted(left.elements())),
        batch.redo_settings or recorded,
        count,
        len(ids) - count,
        unkeyed,
    )
