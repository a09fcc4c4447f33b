"""Verifying an in-flight batch found on takeover: what landed, what is left to redo.

A processor records its batch (``pending`` plus the batch's identities)
before it puts, and clears it when it commits. If it died in between, the
put may have landed wholly, partly or not at all. The successor, once the
old lease has run out (so no put of the old owner is still under way),
reads the destination streams from the batch's start and counts what it
finds. What was recorded but not found becomes the *redo* set: when the
replayed records arrive, exactly those are forwarded (``copier.plan``).
Redo sets compose: a successor that dies while redoing leaves a redo set
and a new pending batch, and its successor merges both.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from copier.positions import Position
from copier.state import DigestBatch, Pending

__all__ = ["Resolution", "resolve"]


@dataclass(frozen=True)
class Resolution:
    redo_last: Position
    redo_digests: tuple[bytes, ...]
    landed: int
    missing: int


def resolve(
    pending: Pending,
    batch: DigestBatch,
    found_target: Counter[bytes],
    found_deadletter: Counter[bytes],
    redo_last: Position | None,
    redo_digests: tuple[bytes, ...],
) -> Resolution:
    """Merge what did not land of ``batch`` into the redo set left by earlier owners."""
    left: Counter[bytes] = Counter(redo_digests)
    landed = 0
    missing = 0
    for recorded, found in ((batch.target, found_target), (batch.deadletter, found_deadletter)):
        budget = Counter(found)
        for identity in recorded:
            if budget[identity] > 0:
                budget[identity] -= 1
                landed += 1
            else:
                left[identity] += 1
                missing += 1
    last = pending.last if redo_last is None else max(pending.last, redo_last)
    digests = tuple(sorted((+left).elements()))
    return Resolution(last, digests, landed, missing)
