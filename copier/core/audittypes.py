"""The audit's value types: what was produced, what was read back, what the copier reported, and the verdict.

Frozen dataclasses and nothing else: no I/O and no judgement, so that every
side shares them: the readers that build them (``copier.core.auditinputs``, the
chaos suite's check, the Spark audit job), the audit that judges them
(``copier.core.audit``) and the reports that print them (``copier.core.verifyreport``).

An event ID is a JSON value: the string ``"1"`` and the integer ``1`` are two
IDs, and reports print them apart (:func:`show`, :func:`event_key`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from copier.core.identity import EventValue, content_digest

__all__ = [
    "DEFAULT_EXAMPLES",
    "AuditReport",
    "DeadLetter",
    "DuplicateReport",
    "OutOfOrder",
    "Position",
    "Produced",
    "TargetRecord",
    "Unkeyed",
    "UnkeyedCopy",
    "content_name",
    "digest_name",
    "event_key",
    "show",
]

DEFAULT_EXAMPLES = 5
Position = tuple[str, int, int]  # (staging shard, sequence number, sub-sequence number)


def show(event_id: EventValue) -> str:
    """An event ID as reports print it: a string as is, an integer as a number (``#1``) so 1 and "1" differ."""
    return event_id if isinstance(event_id, str) else f"#{event_id}"


def event_key(value: EventValue) -> str:
    """An event ID as one string that keeps its type (JSON): for stores that hold strings only (Spark)."""
    return json.dumps(value, ensure_ascii=False)


def digest_name(digest: int) -> str:
    """An 80-bit digest as a report writes it: 20 hex digits."""
    return f"{digest:020x}"


def content_name(partition_key: str, data: bytes) -> str:
    """How a ``possible_duplicates`` report names a record without an event ID: the copier's content digest of
    its partition key and bytes, as it was put (``copier.core.identity.content_digest``)."""
    return digest_name(content_digest(partition_key, data))


@dataclass(frozen=True)
class Produced:
    """One record as the producer wrote it. Unknown details are None (a manifest of IDs only)."""

    event_id: EventValue | None
    partition_key: str | None = None
    sha256: str | None = None  # of the record's bytes
    position: Position | None = None
    dead_letter: str | None = None  # the reason kind it must be dead-lettered for ("no_id", "oversize", "key")
    size: int | None = None  # bytes it counts against the limits (data and UTF-8 partition key)


@dataclass(frozen=True)
class TargetRecord:
    """One record of the target stream, reduced to what the audit needs."""

    event_id: EventValue | None
    partition_key: str
    shard_id: str
    sequence_number: str = ""
    sha256: str | None = None
    arrival_ms: int = 0
    content: str | None = None  # its content_name, for a record without an event ID (None: not known)


@dataclass(frozen=True)
class DeadLetter:
    """One dead-letter record as read: the envelope's fields, or why it is not one (``problem``)."""

    shard_id: str
    sequence_number: str
    arrival_ms: int = 0
    problem: str | None = None
    reason: str = ""
    position: Position | None = None
    partition_key: str | None = None
    sha256: str | None = None  # of the original bytes (from the data, or the envelope's dataSha256)
    event_id: EventValue | None = None  # read from the original bytes, when the envelope keeps them
    content: str | None = None  # the dead-letter record's own content_name (its key and envelope bytes)


@dataclass(frozen=True)
class DuplicateReport:
    """A ``possible_duplicates`` log line: these IDs may have one extra copy arriving in [from_ms, until_ms],
    and so may the records without an event ID it names (``unkeyed``: their content_name, once per copy that
    may be extra: identical records sent again are named as often)."""

    event_ids: tuple[EventValue, ...]
    from_ms: int = 0
    until_ms: int | None = None  # None: open
    shard_id: str = ""
    batch: int = 0
    unkeyed: tuple[str, ...] = ()

    def holds(self, arrival_ms: int) -> bool:
        """Does its window hold a copy that arrived then?"""
        return self.from_ms <= arrival_ms and (self.until_ms is None or arrival_ms <= self.until_ms)


@dataclass(frozen=True)
class Unkeyed:
    """Where a target record without an event ID is, so an operator can look at it."""

    shard_id: str
    sequence_number: str
    partition_key: str


@dataclass(frozen=True)
class UnkeyedCopy:
    """One copy of a record without an event ID (in the target, or a dead-letter envelope of one), as the
    audit weighs it: when it arrived, how a report would name it, and where it is (for an example)."""

    arrival_ms: int
    content: str | None  # its content_name; None where it cannot be known (no partition key: Firehose files)
    where: str

    @property
    def order(self) -> tuple[int, str]:
        """Earliest first; of copies that arrived together, by where they are (every audit breaks ties so)."""
        return self.arrival_ms, self.where


@dataclass(frozen=True)
class OutOfOrder:
    """A target record produced before a record that precedes it under the same (produced) partition key."""

    event_id: EventValue
    partition_key: str
    after: EventValue  # the event ID, produced later, that the target holds before it


# ``copier verify --json``'s count names (each says what it counts: events or records, and where) and the
# report fields they come from.
JSON_COUNTS = {
    "expected_events": "expected",
    "produced_events": "produced",
    "target_records": "found",
    "dead_letter_stream_records": "dead_letter_records",
    "redriven_dead_letter_records": "redriven",
    "lost": "lost",
    "pending": "pending",
    "duplicated": "duplicated",
    "extra_copies": "extra_copies",
    "explained_copies": "explained_copies",
    "unexplained_copies": "unexplained_copies",
    "possible_duplicates_reports": "reports",
    "reported_ids": "reported_ids",
    "changed": "changed",
    "unexpected": "unexpected",
    "target_records_without_id": "unkeyed",
    "produced_without_id": "unkeyed_expected",
    "lost_without_id": "unkeyed_lost",
    "pending_without_id": "unkeyed_pending",
    "extra_copies_without_id": "unkeyed_extra_copies",
    "explained_copies_without_id": "unkeyed_explained",
    "unexplained_copies_without_id": "unkeyed_unexplained",
    "unexpected_without_id": "unkeyed_unexpected",
    "reported_without_id": "reported_unkeyed",
    "dead_lettered_events": "dead_lettered",
    "invalid_dead_letter_records": "invalid_dead_letters",
    "out_of_order": "out_of_order",
    "unordered": "unordered",
}


@dataclass(frozen=True)
class AuditReport:
    """The audit's counts, with up to ``examples`` examples of each problem."""

    expected: int  # distinct produced IDs
    produced: int  # produced ID occurrences, duplicates included
    found: int  # target records
    dead_letter_records: int
    lost: int
    duplicated: int  # distinct IDs with more than one copy (target and dead-letter stream together)
    extra_copies: int  # copies beyond the first of each duplicated ID
    unexpected: int  # distinct IDs in the target that were never produced
    unkeyed: int  # target records without an event ID
    dead_lettered: int  # distinct produced IDs delivered as dead-letter envelopes
    out_of_order: int
    unordered: int = 0  # events left out of the order judgement (see copier.core.audit's docstring)
    redriven: int = 0  # dead-letter records a redrive sent on to the target (no copies of their own)
    explained_copies: int = 0  # extra copies a report excuses
    unexplained_copies: int = 0
    reports: int = 0  # possible_duplicates reports considered
    reported_ids: int = 0  # IDs they name, each report counted
    changed: int = 0  # target copies whose key or bytes differ from what was produced under their ID
    invalid_dead_letters: int = 0
    unkeyed_expected: int = 0  # produced records without an event ID
    unkeyed_lost: int = 0
    unkeyed_extra_copies: int = 0  # copies beyond what was produced of records without an ID (same key and bytes)
    unkeyed_explained: int = 0  # of those, copies a report excuses
    unkeyed_unexplained: int = 0
    unkeyed_unexpected: int = 0  # target copies without an ID whose key and bytes were never produced
    reported_unkeyed: int = 0  # records without an ID the reports name, each name counted
    pending: int = 0  # missing IDs whose every staging occurrence the copier has still ahead of it
    unkeyed_pending: int = 0  # missing records without an ID that the copier has still ahead of it
    lost_examples: tuple[EventValue, ...] = ()
    duplicated_examples: tuple[tuple[EventValue, int], ...] = ()  # (event ID, copies)
    unexplained_examples: tuple[EventValue, ...] = ()
    unexpected_examples: tuple[EventValue, ...] = ()
    unkeyed_examples: tuple[Unkeyed, ...] = ()
    dead_lettered_examples: tuple[EventValue, ...] = ()
    out_of_order_examples: tuple[OutOfOrder, ...] = ()
    changed_examples: tuple[str, ...] = ()
    invalid_dead_letter_examples: tuple[str, ...] = ()
    unkeyed_lost_examples: tuple[str, ...] = ()
    unkeyed_unexplained_examples: tuple[str, ...] = ()  # where each copy is
    pending_examples: tuple[EventValue, ...] = ()

    @property
    def ok(self) -> bool:
        """Exactly once for every event, keyed or not, each copy as produced: nothing lost, and every copy
        beyond the first explained by a ``possible_duplicates`` report."""
        return (
            self.lost == 0
            and self.unexplained_copies == 0
            and self.changed == 0
            and self.invalid_dead_letters == 0
            and self.unkeyed_lost == 0
            and self.unkeyed_unexplained == 0
        )

    @property
    def complete(self) -> bool:
        """``ok``, and nothing still to be copied."""
        return self.ok and self.pending == 0 and self.unkeyed_pending == 0

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every count and example (for ``copier verify --json``)."""
        counts = {json_name: getattr(self, name) for json_name, name in JSON_COUNTS.items()}
        return {
            "ok": self.ok,
            "complete": self.complete,
            **counts,
            "examples": {
                "lost": list(self.lost_examples),
                "pending": list(self.pending_examples),
                "duplicated": [{"event_id": i, "copies": n} for i, n in self.duplicated_examples],
                "unexplained": list(self.unexplained_examples),
                "unexpected": list(self.unexpected_examples),
                "changed": list(self.changed_examples),
                "target_records_without_id": [
                    {"shard_id": u.shard_id, "sequence_number": u.sequence_number, "partition_key": u.partition_key}
                    for u in self.unkeyed_examples
                ],
                "lost_without_id": list(self.unkeyed_lost_examples),
                "unexplained_copies_without_id": list(self.unkeyed_unexplained_examples),
                "dead_lettered_events": list(self.dead_lettered_examples),
                "invalid_dead_letter_records": list(self.invalid_dead_letter_examples),
                "out_of_order": [
                    {"event_id": o.event_id, "partition_key": o.partition_key, "after": o.after}
                    for o in self.out_of_order_examples
                ],
            },
        }
