"""Order judgement: does the target keep, per partition key, the order in which events were produced?

Per partition key *as produced* (not as the target holds it), in target
order, the first copy of an event produced before the latest-produced event
ahead of it is out of order. A producer retry's later occurrence of an ID
does not count (the first occurrence sets its place in production order),
and a duplicate's later copy is judged as a duplicate, not as a reorder.
Pure logic over the audit's value types (``copier.core.audittypes``).
"""

from __future__ import annotations

from collections.abc import Iterable

from copier.core.audittypes import OutOfOrder, TargetRecord
from copier.core.identity import EventValue

__all__ = ["first_copies", "order_violations", "production_index"]


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
