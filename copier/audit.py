"""The exactly-once audit: what was produced against what the target (and dead-letter stream) hold.

Pure logic, no I/O, so the verdict can be tested exhaustively; ``copier.verify``
does the reading and the printing. The inputs:

* the produced event IDs in production order. An ID may occur more than once
  (the producer wrote it again on a retry); only distinct IDs are expected in
  the target, and an ID's *production index* is its first occurrence, because
  the copier forwards the first copy and drops the later ones;
* the target records in the order the target holds them (each shard in
  sequence order, parents before children): event ID (None when the record
  has none), partition key and shard;
* the event IDs found in the dead-letter stream (None for an envelope without
  a recoverable ID). An ID found there was delivered, to the dead-letter
  stream instead of the target, so it is not lost.

The verdict: ``ok`` means nothing lost and nothing duplicated. Out-of-order
delivery is reported but does not fail the audit: Kinesis only orders within a
shard, and consumers that need order need it per partition key, so that is
where it is measured.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "AuditReport",
    "OutOfOrder",
    "TargetRecord",
    "Unkeyed",
    "audit",
    "first_copies",
    "order_violations",
    "production_index",
]

DEFAULT_EXAMPLES = 5


@dataclass(frozen=True)
class TargetRecord:
    """One record of the target stream, reduced to what the audit needs."""

    event_id: str | None
    partition_key: str
    shard_id: str
    sequence_number: str = ""


@dataclass(frozen=True)
class Unkeyed:
    """Where a target record without an event ID is, so an operator can look at it."""

    shard_id: str
    sequence_number: str
    partition_key: str


@dataclass(frozen=True)
class OutOfOrder:
    """A target record produced before a record that precedes it under the same partition key."""

    event_id: str
    partition_key: str
    after: str  # the event ID, produced later, that the target holds before it


@dataclass(frozen=True)
class AuditReport:
    """The audit's counts, with up to ``examples`` examples of each problem."""

    expected: int  # distinct produced IDs
    produced: int  # produced ID occurrences, duplicates included
    found: int  # target records
    dead_letter_records: int
    lost: int
    duplicated: int  # distinct IDs present more than once in the target
    extra_copies: int  # target records beyond the first of each duplicated ID
    unexpected: int  # distinct IDs in the target that were never produced
    unkeyed: int  # target records without an event ID
    dead_lettered: int  # distinct produced IDs found in the dead-letter stream
    out_of_order: int
    lost_examples: tuple[str, ...] = ()
    duplicated_examples: tuple[tuple[str, int], ...] = ()  # (event ID, copies in the target)
    unexpected_examples: tuple[str, ...] = ()
    unkeyed_examples: tuple[Unkeyed, ...] = ()
    dead_lettered_examples: tuple[str, ...] = ()
    out_of_order_examples: tuple[OutOfOrder, ...] = ()

    @property
    def ok(self) -> bool:
        """Exactly once: every produced event delivered, none delivered twice."""
        return self.lost == 0 and self.duplicated == 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every count and example (for ``copier verify --json``)."""
        return {
            "ok": self.ok,
            "expected": self.expected,
            "produced": self.produced,
            "found": self.found,
            "dead_letter_records": self.dead_letter_records,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "extra_copies": self.extra_copies,
            "unexpected": self.unexpected,
            "unkeyed": self.unkeyed,
            "dead_lettered": self.dead_lettered,
            "out_of_order": self.out_of_order,
            "examples": {
                "lost": list(self.lost_examples),
                "duplicated": [{"event_id": i, "copies": n} for i, n in self.duplicated_examples],
                "unexpected": list(self.unexpected_examples),
                "unkeyed": [
                    {"shard_id": u.shard_id, "sequence_number": u.sequence_number, "partition_key": u.partition_key}
                    for u in self.unkeyed_examples
                ],
                "dead_lettered": list(self.dead_lettered_examples),
                "out_of_order": [
                    {"event_id": o.event_id, "partition_key": o.partition_key, "after": o.after}
                    for o in self.out_of_order_examples
                ],
            },
        }


def production_index(produced: Iterable[str]) -> tuple[dict[str, int], int]:
    """Each distinct ID's first position in production order, and the number of occurrences.

    The first occurrence is the one that counts: a producer retry writes the
    same event later, and the copier forwards the first copy it reads.
    """
    index: dict[str, int] = {}
    occurrences = 0
    for event_id in produced:
        occurrences += 1
        index.setdefault(event_id, len(index))
    return index, occurrences


def order_violations(
    target: Iterable[TargetRecord], index: dict[str, int], limit: int
) -> tuple[int, tuple[OutOfOrder, ...]]:
    """Count target records produced before the latest-produced record that precedes them under their key.

    Only records with a production index take part: an unkeyed or unexpected
    record has no place in production order to compare.
    """
    latest: dict[str, tuple[int, str]] = {}  # partition key -> (highest production index so far, its ID)
    count = 0
    examples: list[OutOfOrder] = []
    for record in target:
        if record.event_id is None or record.event_id not in index:
            continue
        position = index[record.event_id]
        seen = latest.get(record.partition_key)
        if seen is not None and position < seen[0]:
            count += 1
            if len(examples) < limit:
                examples.append(OutOfOrder(record.event_id, record.partition_key, seen[1]))
        elif seen is None or position > seen[0]:
            latest[record.partition_key] = (position, record.event_id)
    return count, tuple(examples)


def first_copies(target: Iterable[TargetRecord]) -> list[TargetRecord]:
    """The target without the later copies of a duplicated ID (and without unkeyed records).

    A duplicate's later copy is judged as a duplicate; whether the *first*
    arrivals keep each key's order is the separate question that
    ``copier.ordering = partitionKey`` answers.
    """
    seen: set[str] = set()
    out: list[TargetRecord] = []
    for record in target:
        if record.event_id is not None and record.event_id not in seen:
            seen.add(record.event_id)
            out.append(record)
    return out


def audit(
    produced: Iterable[str],
    target: Iterable[TargetRecord],
    dead_letter: Iterable[str | None] = (),
    examples: int = DEFAULT_EXAMPLES,
) -> AuditReport:
    """Compare what was produced with what the target and dead-letter stream hold; see the module docstring."""
    index, occurrences = production_index(produced)
    records = list(target)
    copies: Counter[str] = Counter()
    unkeyed: list[Unkeyed] = []
    unkeyed_count = 0
    for record in records:
        if record.event_id is None:
            unkeyed_count += 1
            if len(unkeyed) < examples:
                unkeyed.append(Unkeyed(record.shard_id, record.sequence_number, record.partition_key))
        else:
            copies[record.event_id] += 1
    dead_letter_list = list(dead_letter)
    in_dead_letter = {i for i in dead_letter_list if i is not None}

    lost = [i for i in index if i not in copies and i not in in_dead_letter]
    dead_lettered = [i for i in index if i in in_dead_letter]
    duplicated = [(i, n) for i, n in copies.items() if n > 1]  # Counter keeps first-seen order
    unexpected = [i for i in copies if i not in index]
    disorder, disorder_examples = order_violations(records, index, examples)
    return AuditReport(
        expected=len(index),
        produced=occurrences,
        found=len(records),
        dead_letter_records=len(dead_letter_list),
        lost=len(lost),
        duplicated=len(duplicated),
        extra_copies=sum(n - 1 for _, n in duplicated),
        unexpected=len(unexpected),
        unkeyed=unkeyed_count,
        dead_lettered=len(dead_lettered),
        out_of_order=disorder,
        lost_examples=tuple(lost[:examples]),
        duplicated_examples=tuple(duplicated[:examples]),
        unexpected_examples=tuple(unexpected[:examples]),
        unkeyed_examples=tuple(unkeyed),
        dead_lettered_examples=tuple(dead_lettered[:examples]),
        out_of_order_examples=disorder_examples,
    )
