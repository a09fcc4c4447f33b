"""The exactly-once audit: what was produced against every copy the target and the dead-letter stream hold.

Pure logic, no I/O, so the verdict can be tested exhaustively; ``copier.commands.verify``
and the chaos suite's check (``copier.chaos.check``) do the reading. The
audit's value types are in ``copier.core.audittypes``, its dead-letter checks in
``copier.core.deadlettercheck`` and its order judgement in ``copier.core.ordercheck``;
their names are still importable from here. Every claim is per copy and per
byte:

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
* A dead-letter record must be an envelope of a produced record, with its
  key and bytes, for a reason the record bears out (``copier.core.deadlettercheck``
  says what is checked). Anything else is *invalid* and fails the audit.
* Records without an event ID are exactly once as well: each produced one
  must be in the target (same key and bytes) or in a valid envelope; a copy
  beyond what was produced with that key and bytes (the copier sends such a
  record again when it cannot tell whether its first copy landed) is
  *explained* only by a ``possible_duplicates`` report that names it by its
  content digest (``unkeyed``: the copier's digest of the key and bytes it
  put, :func:`copier.core.audittypes.content_name`), one copy per name and
  report, arriving within the report's window (:func:`explain_unkeyed`);
  any other extra copy fails the audit. Identical records cannot be told
  apart, so the copies of one key and bytes are weighed together: the
  earliest are the ones produced, the latest the extra ones, and a report
  naming any copy of them (a record put to the target, then dead-lettered
  under another configuration, has two names) explains one. Copies whose
  key and bytes were never produced are counted (``unkeyed_unexpected``),
  as keyed IDs never produced are.
* A dead-letter record a redrive sent on to the target (``redriven``: the
  digest names a redrive recorded, ``copier.core.redrive``) is no copy of its
  own: the target's copy is the event's delivery (and is lost if missing).
* Order: per partition key *as produced* (not as the target holds it), in
  target order, the first copy of an event produced before the latest-produced
  event ahead of it is out of order (``copier.core.ordercheck``; reported, and the
  chaos check fails on it).
  Events the caller names ``unordered`` (a copy Kinesis placed on a shard that
  does not hold its key, under ``RecordDistributionStrategy = AUTO``: Kinesis
  kept no order for them) are left out of the judgement and counted.

* **Pending**: given where the copier has got to (``committed``: each
  staging shard's committed position, from the state table), a missing
  event whose every staging occurrence lies after its shard's committed
  position is not lost but not yet copied (an audit run while the copier is
  behind); one occurrence at or before it, and the copier has passed it:
  lost. Without ``committed``, every missing event is lost.

``ok`` means nothing lost, no unexplained copy, nothing changed, no invalid
dead-letter record; ``complete`` also that nothing is pending.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from copier.core.audittypes import (
    DEFAULT_EXAMPLES,
    AuditReport,
    DeadLetter,
    DuplicateReport,
    OutOfOrder,
    Produced,
    TargetRecord,
    Unkeyed,
    UnkeyedCopy,
    digest_name,
    event_key,
    show,
)
from copier.core.audittypes import Position as Position
from copier.core.deadlettercheck import check_dead_letter
from copier.core.deadlettercheck import key_problem as key_problem
from copier.core.identity import EventValue, id_digest
from copier.core.ordercheck import first_copies, order_violations, production_index
from copier.core.positions import Position as ShardPosition

__all__ = [
    "DEFAULT_EXAMPLES",
    "PAST_THE_END",
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
    "explain_unkeyed",
    "first_copies",
    "order_violations",
    "production_index",
    "show",
    "was_redriven",
]


Content = tuple[str, str | None]  # a record without an event ID: its partition key and the SHA-256 of its bytes
K = TypeVar("K", bound=Hashable)  # how the caller groups copies of one record's key and bytes


def _where(letter: DeadLetter) -> str:
    return f"{letter.shard_id}@{letter.sequence_number}"


def _order(copy: UnkeyedCopy) -> tuple[int, str]:
    return copy.order


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
            match = next((r for r in left if r.holds(arrival)), None)
            if match is None:
                unexplained.append(event_id)
                break
            left.remove(match)
            explained += 1
    return explained, unexplained


def explain_unkeyed(
    extra: Mapping[K, Sequence[UnkeyedCopy]],
    names: Mapping[K, Collection[str | None]],
    reports: Sequence[DuplicateReport],
) -> tuple[int, list[UnkeyedCopy]]:
    """Match each extra copy of a record without an ID (``extra``: per key and bytes, the copies beyond what
    was produced) to a report naming one of that content's names (``names``: the content_name of each of its
    copies, in either stream) whose window holds the copy's arrival; each name a report gives excuses one copy.
    Returns (explained, the copies no report explains, earliest first)."""
    allowances: dict[str, list[DuplicateReport]] = defaultdict(list)
    for report in reports:
        for name in report.unkeyed:
            allowances[name].append(report)
    explained = 0
    unexplained: list[UnkeyedCopy] = []
    for content, copies in extra.items():
        left = [(name, r) for name in sorted(filter(None, set(names.get(content, ())))) for r in allowances[name]]
        for copy in sorted(copies, key=_order):
            match = next((pair for pair in left if pair[1].holds(copy.arrival_ms)), None)
            if match is None:
                unexplained.append(copy)
                continue
            left.remove(match)
            explained += 1
    return explained, sorted(unexplained, key=_order)


# A closed shard's committed position: past every sequence number (Kinesis': at most 129 digits).
PAST_THE_END = ShardPosition(10**130)


def audit(
    produced: Iterable[Produced | EventValue],
    target: Iterable[TargetRecord],
    dead_letter: Iterable[DeadLetter] = (),
    reports: Sequence[DuplicateReport] = (),
    examples: int = DEFAULT_EXAMPLES,
    keyed_dead_letters: bool = True,
    unordered: Collection[EventValue] = frozenset(),
    committed: Mapping[str, ShardPosition] | None = None,
    staged: Mapping[EventValue, Sequence[Position]] | None = None,
    redriven: Collection[str] = frozenset(),
) -> AuditReport:
    """Compare what was produced with every copy the target and dead-letter stream hold; see the module
    docstring. A bare event ID in ``produced`` is a :class:`Produced` with nothing else known.

    ``committed``: each staging shard's committed position (a shard not in it has none: everything in it is
    still to come; a closed one maps to :data:`PAST_THE_END`); ``staged``: where each event ID occurs in
    staging, when ``produced`` does not say (a manifest of IDs); ``redriven``: the digest names of what redrives
    sent from the dead-letter stream (each record's own, and keyed events' IDs)."""
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
    pool: dict[Content, list[UnkeyedCopy]] = defaultdict(list)  # copies without an ID, by key and bytes
    unkeyed: list[Unkeyed] = []
    unkeyed_count = 0
    changed: list[str] = []
    changed_count = 0
    for record in records:
        if record.event_id is None:
            unkeyed_count += 1
            spot = f"{record.shard_id}@{record.sequence_number} (partition key {record.partition_key})"
            pool[(record.partition_key, record.sha256)].append(UnkeyedCopy(record.arrival_ms, record.content, spot))
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
    unkeyed_letters: list[DeadLetter] = []
    redriven_letters = 0
    for letter in letters:
        problem = check_dead_letter(letter, at, keyed_dead_letters, positions_known)
        if problem is not None:
            invalid_count += 1
            if len(invalid) < examples:
                invalid.append(f"{_where(letter)}: {problem}")
            continue
        original = at.get(letter.position) if letter.position is not None else None
        event_id = original.event_id if original is not None else letter.event_id
        if redriven and was_redriven(letter, event_id, redriven):
            redriven_letters += 1
            continue
        if event_id is not None:
            copies[event_id].arrivals.append(letter.arrival_ms)
            dead_ids.add(event_id)
        else:
            unkeyed_letters.append(letter)

    lost = [i for i in index if i not in copies]
    pending: list[EventValue] = []
    if committed is not None:
        where: dict[EventValue, list[Position]] = defaultdict(list)
        for p in keyed:
            if p.position is not None:
                where[p.event_id].append(p.position)  # type: ignore[index]
        for event_id, places in (staged or {}).items():
            where[event_id].extend(places)
        pending = [i for i in lost if where.get(i) and all(_to_come(place, committed) for place in where[i])]
        waiting = set(pending)
        lost = [i for i in lost if i not in waiting]
    duplicated = [(i, len(c.arrivals)) for i, c in copies.items() if len(c.arrivals) > 1]
    explained, unexplained = explain({i: copies[i].arrivals for i, _ in duplicated}, reports)
    unexpected = [i for i, c in copies.items() if i not in index and c.in_target]
    judged = [r for r in first_copies(records) if r.event_id not in unordered]
    disorder, disorder_examples = order_violations(judged, index, examples, produced_keys or None)

    without_id = [p for p in records_produced if p.event_id is None]
    left = _unkeyed(without_id, pool, unkeyed_letters, committed, reports)
    extra = sum(n - 1 for _, n in duplicated)
    return AuditReport(
        expected=len(index),
        produced=occurrences,
        found=len(records),
        dead_letter_records=len(letters),
        redriven=redriven_letters,
        lost=len(lost),
        pending=len(pending),
        unkeyed_pending=left.pending,
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
        unkeyed_lost=len(left.lost),
        unkeyed_extra_copies=left.extra,
        unkeyed_explained=left.explained,
        unkeyed_unexplained=len(left.unexplained),
        unkeyed_unexpected=left.unexpected,
        reported_unkeyed=sum(len(r.unkeyed) for r in reports),
        lost_examples=tuple(lost[:examples]),
        pending_examples=tuple(pending[:examples]),
        duplicated_examples=tuple(duplicated[:examples]),
        unexplained_examples=tuple(unexplained[:examples]),
        unexpected_examples=tuple(unexpected[:examples]),
        unkeyed_examples=tuple(unkeyed),
        dead_lettered_examples=tuple([i for i in index if i in dead_ids][:examples]),
        out_of_order_examples=disorder_examples,
        changed_examples=tuple(changed),
        invalid_dead_letter_examples=tuple(invalid),
        unkeyed_lost_examples=tuple(left.lost[:examples]),
        unkeyed_unexplained_examples=tuple(c.where for c in left.unexplained[:examples]),
    )


@dataclass
class _UnkeyedVerdict:
    """What became of the records produced without an event ID (see :func:`_unkeyed`)."""

    lost: list[str] = field(default_factory=list)  # staging positions ("?" where unknown)
    pending: int = 0
    extra: int = 0
    explained: int = 0
    unexplained: list[UnkeyedCopy] = field(default_factory=list)
    unexpected: int = 0  # copies whose key and bytes were never produced


def _unkeyed(
    produced: Sequence[Produced],
    pool: Mapping[Content, list[UnkeyedCopy]],
    letters: Sequence[DeadLetter],
    committed: Mapping[str, ShardPosition] | None,
    reports: Sequence[DuplicateReport],
) -> _UnkeyedVerdict:
    """The records produced without an event ID against their copies: ``pool``, the target's copies by key and
    bytes; ``letters``, the valid dead-letter envelopes of such records. An envelope that points at a produced
    record delivers that one (its further envelopes are extra copies of it); every other copy delivers any
    produced record of its key and bytes, earliest first, so that the extra copies are the latest."""
    places = {p.position for p in produced if p.position is not None}
    dead_at: dict[Position, list[UnkeyedCopy]] = defaultdict(list)
    pool = {content: list(copies) for content, copies in pool.items()}
    for letter in letters:
        copy = UnkeyedCopy(letter.arrival_ms, letter.content, f"{_where(letter)} (dead-letter stream)")
        if letter.position in places:
            dead_at[letter.position].append(copy)  # type: ignore[index]
        else:
            pool.setdefault((letter.partition_key or "", letter.sha256), []).append(copy)
    out = _UnkeyedVerdict()
    names: dict[Content, list[str | None]] = defaultdict(list)  # every name any copy of a content goes by
    extra: dict[Content, list[UnkeyedCopy]] = defaultdict(list)
    taken: Counter[Content] = Counter()
    for copies in pool.values():
        copies.sort(key=_order)
    for p in produced:
        content = (p.partition_key or "", p.sha256)
        here = sorted(dead_at.pop(p.position, []), key=_order) if p.position is not None else []
        if here:
            names[content] += [c.content for c in here]
            extra[content] += here[1:]
        elif taken[content] < len(pool.get(content, ())):
            taken[content] += 1
        elif committed is not None and p.position is not None and _to_come(p.position, committed):
            out.pending += 1
        else:
            out.lost.append(f"{p.position[0]}@{p.position[1]}/{p.position[2]}" if p.position else "?")
    made = {(p.partition_key or "", p.sha256) for p in produced}
    for content, copies in pool.items():
        names[content] += [c.content for c in copies]
        if content in made:
            extra[content] += copies[taken[content] :]
        else:
            out.unexpected += len(copies)
    out.extra = sum(len(copies) for copies in extra.values())
    out.explained, out.unexplained = explain_unkeyed(extra, names, reports)
    return out


def was_redriven(letter: DeadLetter, event_id: EventValue | None, redriven: Collection[str]) -> bool:
    """Did a redrive send this dead-letter record (its own digest), or its event (the event's ID)? ``redriven``:
    the digest names redrives recorded (``copier.commands.verify.redriven_record``). ``copier verify``, ``copier
    audit`` and the chaos check all decide by this one rule, so that they give one verdict on the same data."""
    return letter.content in redriven or (event_id is not None and digest_name(id_digest(event_id)) in redriven)


def _to_come(place: Position, committed: Mapping[str, ShardPosition]) -> bool:
    """Does the copier still have this staging place ahead of it (after its shard's committed position)?"""
    shard_id, seq, subseq = place
    done = committed.get(shard_id)
    return done is None or (seq, subseq) > (done.seq, done.subseq)


def _matches(versions: set[tuple[str | None, str | None]], record: TargetRecord) -> bool:
    """Is the target record one of the produced versions of its event (key and bytes, where known)?"""
    for key, digest in versions:
        if (key is None or key == record.partition_key) and (digest is None or digest == record.sha256):
            return True
    return False
