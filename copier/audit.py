"""The exactly-once audit: what was produced against every copy the target and the dead-letter stream hold.

Pure logic, no I/O, so the verdict can be tested exhaustively; ``copier.verify``
and the chaos suite's check (``copier.chaos.check``) do the reading. Every
claim is per copy and per byte:

* **Produced** records (:class:`Produced`): each event the producer wrote
  (an event ID may occur more than once: a producer retry), with, when the
  source knows them, its partition key, the SHA-256 of its bytes and its
  staging position; and the records written without an event ID. An event
  ID is a JSON value: the string ``"1"`` and the integer ``1`` are two IDs.
* **Copies** of an event: its records in the target and the dead-letter
  envelopes that carry it, counted together. None: lost. More than one: a
  duplicate, *explained* only copy by copy: each ``possible_duplicates``
  report (:class:`DuplicateReport`) that names the ID excuses one extra
  copy that arrived within the report's window, and no more.
* A target copy must be byte for byte what was produced under its ID
  (partition key and SHA-256), where the source says: else it is *changed*.
* A dead-letter record must be an envelope (``copier.plan``) that points
  at a produced record (source shard and position), with that record's key
  and bytes (its data, or its SHA-256 when the data was too large to keep),
  and a reason that the record bears out (no event ID, too large, a key
  Kinesis refuses). Anything else is *invalid* and fails the audit. When
  the source says no keyed event should be there (``keyed_dead_letters``
  False), an envelope of one fails too.
* Records without an event ID are at least once: each produced one must be
  in the target (same key and bytes) or in a valid envelope; extra copies
  are counted, not failed.
* Order: per partition key *as produced* (not as the target holds it), in
  target order, the first copy of an event produced before the latest-produced
  event ahead of it is out of order (reported; the chaos check fails on it).
  Events the caller names ``unordered`` (a copy Kinesis placed on a shard that
  does not hold its key, under ``RecordDistributionStrategy = AUTO``: Kinesis
  kept no order for them) are left out of the judgement and counted.

``ok`` means nothing lost, no unexplained copy, nothing changed, no invalid
dead-letter record.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from copier.identity import EventValue, key_length
from copier.limits import MAX_PARTITION_KEY_CHARS

__all__ = [
    "DEFAULT_EXAMPLES",
    "AuditReport",
    "DeadLetter",
    "DuplicateReport",
    "OutOfOrder",
    "Produced",
    "TargetRecord",
    "Unkeyed",
    "audit",
    "check_dead_letter",
    "event_key",
    "explain",
    "first_copies",
    "order_violations",
    "production_index",
    "show",
]

DEFAULT_EXAMPLES = 5
Position = tuple[str, int, int]  # (staging shard, sequence number, sub-sequence number)


def show(event_id: EventValue) -> str:
    """An event ID as reports print it: a string as is, an integer as a number (``#1``) so 1 and "1" differ."""
    return event_id if isinstance(event_id, str) else f"#{event_id}"


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


@dataclass(frozen=True)
class DuplicateReport:
    """A ``possible_duplicates`` log line: these IDs may have one extra copy arriving in [from_ms, until_ms]."""

    event_ids: tuple[EventValue, ...]
    from_ms: int = 0
    until_ms: int | None = None  # None: open
    shard_id: str = ""
    batch: int = 0


@dataclass(frozen=True)
class Unkeyed:
    """Where a target record without an event ID is, so an operator can look at it."""

    shard_id: str
    sequence_number: str
    partition_key: str


@dataclass(frozen=True)
class OutOfOrder:
    """A target record produced before a record that precedes it under the same (produced) partition key."""

    event_id: EventValue
    partition_key: str
    after: EventValue  # the event ID, produced later, that the target holds before it


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
    unordered: int = 0  # events left out of the order judgement (see the module docstring)
    explained_copies: int = 0  # extra copies a report excuses
    unexplained_copies: int = 0
    reports: int = 0  # possible_duplicates reports considered
    reported_ids: int = 0  # IDs they name, each report counted
    changed: int = 0  # target copies whose key or bytes differ from what was produced under their ID
    invalid_dead_letters: int = 0
    unkeyed_expected: int = 0  # produced records without an event ID
    unkeyed_lost: int = 0
    unkeyed_extra_copies: int = 0
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

    @property
    def ok(self) -> bool:
        """Exactly once for keyed events, at least once for the rest, each copy as produced."""
        return (
            self.lost == 0
            and self.unexplained_copies == 0
            and self.changed == 0
            and self.invalid_dead_letters == 0
            and self.unkeyed_lost == 0
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict of every count and example (for ``copier verify --json``)."""
        counts = {
            name: getattr(self, name)
            for name in (
                "expected",
                "produced",
                "found",
                "dead_letter_records",
                "lost",
                "duplicated",
                "extra_copies",
                "explained_copies",
                "unexplained_copies",
                "reports",
                "reported_ids",
                "changed",
                "unexpected",
                "unkeyed",
                "unkeyed_expected",
                "unkeyed_lost",
                "unkeyed_extra_copies",
                "dead_lettered",
                "invalid_dead_letters",
                "out_of_order",
                "unordered",
            )
        }
        return {
            "ok": self.ok,
            **counts,
            "examples": {
                "lost": list(self.lost_examples),
                "duplicated": [{"event_id": i, "copies": n} for i, n in self.duplicated_examples],
                "unexplained": list(self.unexplained_examples),
                "unexpected": list(self.unexpected_examples),
                "changed": list(self.changed_examples),
                "unkeyed": [
                    {"shard_id": u.shard_id, "sequence_number": u.sequence_number, "partition_key": u.partition_key}
                    for u in self.unkeyed_examples
                ],
                "unkeyed_lost": list(self.unkeyed_lost_examples),
                "dead_lettered": list(self.dead_lettered_examples),
                "invalid_dead_letters": list(self.invalid_dead_letter_examples),
                "out_of_order": [
                    {"event_id": o.event_id, "partition_key": o.partition_key, "after": o.after}
                    for o in self.out_of_order_examples
                ],
            },
        }


def production_index(produced: Iterable[EventValue]) -> tuple[dict[EventValue, int], int]:
    """Each distinct ID's first position in production order, and the number of occurrences.

    The first occurrence is the one that counts: a producer retry writes the
    same event later, and the copier forwards the first copy it reads.
    """
    index: dict[EventValue, int] = {}
    occurrences = 0
    for event_id in produced:
        occurrences += 1
        index.setdefault(event_id, len(index))
    return index, occurrences


def order_violations(
    target: Iterable[TargetRecord],
    index: dict[EventValue, int],
    limit: int,
    keys: dict[EventValue, str] | None = None,
) -> tuple[int, tuple[OutOfOrder, ...]]:
    """Count target records produced before the latest-produced record that precedes them under their key.

    ``keys``: each event's partition key as produced (a target that rewrote
    keys must not hide a reorder); without it, the target's own keys. Only
    records with a production index take part.
    """
    latest: dict[str, tuple[int, EventValue]] = {}  # partition key -> (highest production index so far, its ID)
    count = 0
    examples: list[OutOfOrder] = []
    for record in target:
        if record.event_id is None or record.event_id not in index:
            continue
        position = index[record.event_id]
        key = keys.get(record.event_id, record.partition_key) if keys is not None else record.partition_key
        seen = latest.get(key)
        if seen is not None and position < seen[0]:
            count += 1
            if len(examples) < limit:
                examples.append(OutOfOrder(record.event_id, key, seen[1]))
        elif seen is None or position > seen[0]:
            latest[key] = (position, record.event_id)
    return count, tuple(examples)


def first_copies(target: Iterable[TargetRecord]) -> list[TargetRecord]:
    """The target without the later copies of a duplicated ID (and without unkeyed records).

    A duplicate's later copy is judged as a duplicate; whether the *first*
    arrivals keep each key's order is the separate question that
    ``copier.ordering = partitionKey`` answers.
    """
    seen: set[EventValue] = set()
    out: list[TargetRecord] = []
    for record in target:
        if record.event_id is not None and record.event_id not in seen:
            seen.add(record.event_id)
            out.append(record)
    return out


# -- dead letters -------------------------------------------------------------------------------------

_REASONS = {  # reason kind -> what the envelope's reason says (copier.plan)
    "no_id": "no event ID",
    "oversize": "exceeds",
    "key": "partition key",
}


def key_problem(partition_key: str) -> str | None:
    """Why Kinesis refuses a partition key (empty, over 256 characters), or None."""
    if not partition_key:
        return "empty"
    return "too long" if key_length(partition_key) > MAX_PARTITION_KEY_CHARS else None


def _reason_kind(reason: str) -> str | None:
    for kind, text in _REASONS.items():
        if text in reason:
            return kind
    return None


def _where(letter: DeadLetter) -> str:
    return f"{letter.shard_id}@{letter.sequence_number}"


def check_dead_letter(
    letter: DeadLetter,
    at: dict[Position, Produced] | None = None,
    keyed_dead_letters: bool = True,
    positions_known: bool = False,
) -> str | None:
    """Why a dead-letter record does not check out against what was produced (None: it does)."""
    if letter.problem is not None:
        return letter.problem
    kind = _reason_kind(letter.reason)
    if kind is None:
        return f"unknown reason {letter.reason!r}"
    if not positions_known or at is None:
        return None
    if letter.position is None or letter.position not in at:
        return f"points at no produced record ({letter.position})"
    produced = at[letter.position]
    if produced.sha256 is not None and letter.sha256 != produced.sha256:
        return "its bytes are not the produced record's"
    if produced.partition_key is not None and letter.partition_key != produced.partition_key:
        return "its partition key is not the produced record's"
    if produced.dead_letter is not None and produced.dead_letter != kind:
        return f"reason {kind} for a record produced to be dead-lettered as {produced.dead_letter}"
    if produced.dead_letter is None and kind == "no_id" and produced.event_id is not None:
        return "says 'no event ID' of a record that has one"
    if kind == "oversize" and produced.size is not None:
        sizes = [int(n) for n in re.findall(r"(\d+) bytes", letter.reason)]
        if len(sizes) != 2 or sizes[0] != produced.size or sizes[0] <= sizes[1]:
            return f"says too large ({letter.reason}) of a record of {produced.size} bytes"
    if kind == "key" and produced.partition_key is not None and key_problem(produced.partition_key) is None:
        return "says its partition key is invalid, and it is not"
    if produced.dead_letter is None and produced.event_id is not None and not keyed_dead_letters:
        return "a keyed event that no rule sends to the dead-letter stream"
    return None


# -- the audit -------------------------------------------------------------------------------------------


@dataclass
class _Copies:
    """Every copy of one event ID: target records and dead-letter envelopes, with their arrival times."""

    arrivals: list[int] = field(default_factory=list)
    in_target: int = 0


def explain(arrivals: dict[EventValue, list[int]], reports: Sequence[DuplicateReport]) -> tuple[int, list[EventValue]]:
    """Match each extra copy (all but the earliest) to a report naming its ID whose window holds its arrival;
    a report excuses one copy per ID it names. ``arrivals``: every copy's arrival, per duplicated ID.
    Returns (explained, IDs with an unexplained copy)."""
    allowances: dict[EventValue, list[DuplicateReport]] = defaultdict(list)
    for report in reports:
        for event_id in dict.fromkeys(report.event_ids):
            allowances[event_id].append(report)
    explained = 0
    unexplained: list[EventValue] = []
    for event_id, times in arrivals.items():
        extra = sorted(times)[1:]
        left = list(allowances.get(event_id, ()))
        for arrival in extra:
            match = next(
                (r for r in left if r.from_ms <= arrival and (r.until_ms is None or arrival <= r.until_ms)), None
            )
            if match is None:
                unexplained.append(event_id)
                break
            left.remove(match)
            explained += 1
    return explained, unexplained


def audit(
    produced: Iterable[Produced | EventValue],
    target: Iterable[TargetRecord],
    dead_letter: Iterable[DeadLetter] = (),
    reports: Sequence[DuplicateReport] = (),
    examples: int = DEFAULT_EXAMPLES,
    keyed_dead_letters: bool = True,
    unordered: Collection[EventValue] = frozenset(),
) -> AuditReport:
    """Compare what was produced with every copy the target and dead-letter stream hold; see the module
    docstring. A bare event ID in ``produced`` is a :class:`Produced` with nothing else known."""
    records_produced = [p if isinstance(p, Produced) else Produced(p) for p in produced]
    keyed = [p for p in records_produced if p.event_id is not None]
    index, occurrences = production_index(p.event_id for p in keyed)  # type: ignore[misc]
    versions: dict[EventValue, set[tuple[str | None, str | None]]] = defaultdict(set)
    produced_keys: dict[EventValue, str] = {}
    for p in keyed:
        assert p.event_id is not None
        versions[p.event_id].add((p.partition_key, p.sha256))
        if p.partition_key is not None:
            produced_keys.setdefault(p.event_id, p.partition_key)
    at = {p.position: p for p in records_produced if p.position is not None}
    positions_known = bool(at)

    records = list(target)
    copies: dict[EventValue, _Copies] = defaultdict(_Copies)
    unkeyed_found: Counter[tuple[str, str | None]] = Counter()
    unkeyed: list[Unkeyed] = []
    unkeyed_count = 0
    changed: list[str] = []
    changed_count = 0
    for record in records:
        if record.event_id is None:
            unkeyed_count += 1
            unkeyed_found[(record.partition_key, record.sha256)] += 1
            if len(unkeyed) < examples:
                unkeyed.append(Unkeyed(record.shard_id, record.sequence_number, record.partition_key))
            continue
        found = copies[record.event_id]
        found.arrivals.append(record.arrival_ms)
        found.in_target += 1
        if record.event_id in versions and not _matches(versions[record.event_id], record):
            changed_count += 1
            if len(changed) < examples:
                changed.append(f"{show(record.event_id)} at {record.shard_id}@{record.sequence_number}")

    letters = list(dead_letter)
    invalid: list[str] = []
    invalid_count = 0
    dead_ids: set[EventValue] = set()
    unkeyed_dead: Counter[Position] = Counter()
    for letter in letters:
        problem = check_dead_letter(letter, at, keyed_dead_letters, positions_known)
        if problem is not None:
            invalid_count += 1
            if len(invalid) < examples:
                invalid.append(f"{_where(letter)}: {problem}")
            continue
        original = at.get(letter.position) if letter.position is not None else None
        event_id = original.event_id if original is not None else letter.event_id
        if event_id is not None:
            copies[event_id].arrivals.append(letter.arrival_ms)
            dead_ids.add(event_id)
        elif letter.position is not None:
            unkeyed_dead[letter.position] += 1

    lost = [i for i in index if i not in copies]
    duplicated = [(i, len(c.arrivals)) for i, c in copies.items() if len(c.arrivals) > 1]
    explained, unexplained = explain({i: copies[i].arrivals for i, _ in duplicated}, reports)
    unexpected = [i for i, c in copies.items() if i not in index and c.in_target]
    judged = [r for r in first_copies(records) if r.event_id not in unordered]
    disorder, disorder_examples = order_violations(judged, index, examples, produced_keys or None)

    without_id = [p for p in records_produced if p.event_id is None]
    unkeyed_lost: list[str] = []
    unkeyed_extra = 0
    left = Counter(unkeyed_found)
    for p in without_id:
        if p.position is not None and unkeyed_dead[p.position] > 0:
            unkeyed_extra += unkeyed_dead[p.position] - 1
            unkeyed_dead[p.position] = 0
            continue
        if left[(p.partition_key or "", p.sha256)] > 0:
            left[(p.partition_key or "", p.sha256)] -= 1
            continue
        unkeyed_lost.append(f"{p.position[0]}@{p.position[1]}/{p.position[2]}" if p.position else "?")
    unkeyed_extra += sum(left.values()) if without_id else 0
    extra = sum(n - 1 for _, n in duplicated)
    return AuditReport(
        expected=len(index),
        produced=occurrences,
        found=len(records),
        dead_letter_records=len(letters),
        lost=len(lost),
        duplicated=len(duplicated),
        extra_copies=extra,
        unexpected=len(unexpected),
        unkeyed=unkeyed_count,
        dead_lettered=len([i for i in index if i in dead_ids]),
        out_of_order=disorder,
        unordered=len(set(unordered) & set(index)),
        explained_copies=explained,
        unexplained_copies=extra - explained,
        reports=len(reports),
        reported_ids=sum(len(set(r.event_ids)) for r in reports),
        changed=changed_count,
        invalid_dead_letters=invalid_count,
        unkeyed_expected=len(without_id),
        unkeyed_lost=len(unkeyed_lost),
        unkeyed_extra_copies=unkeyed_extra,
        lost_examples=tuple(lost[:examples]),
        duplicated_examples=tuple(duplicated[:examples]),
        unexplained_examples=tuple(unexplained[:examples]),
        unexpected_examples=tuple(unexpected[:examples]),
        unkeyed_examples=tuple(unkeyed),
        dead_lettered_examples=tuple([i for i in index if i in dead_ids][:examples]),
        out_of_order_examples=disorder_examples,
        changed_examples=tuple(changed),
        invalid_dead_letter_examples=tuple(invalid),
        unkeyed_lost_examples=tuple(unkeyed_lost[:examples]),
    )


def _matches(versions: set[tuple[str | None, str | None]], record: TargetRecord) -> bool:
    """Is the target record one of the produced versions of its event (key and bytes, where known)?"""
    for key, digest in versions:
        if (key is None or key == record.partition_key) and (digest is None or digest == record.sha256):
            return True
    return False


def event_key(value: EventValue) -> str:
    """An event ID as one string that keeps its type (JSON): for stores that hold strings only (Spark)."""
    return json.dumps(value, ensure_ascii=False)
