"""Splitting records into PutRecords requests within the Kinesis limits."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TypeVar

from copier.core.limits import MAX_REQUEST_BYTES, MAX_REQUEST_RECORDS

__all__ = ["first_per_key", "split_requests"]

T = TypeVar("T")


def split_requests(items: Sequence[T], size_of: Callable[[T], int]) -> Iterator[list[T]]:
    """Consecutive groups of at most 500 records and 5 MiB, order kept.

    ``size_of`` gives an item's size counting its partition key. A single
    record over 1 MiB still gets a request of its own: Kinesis rejects it
    with a clear error rather than copier silently skipping it.
    """
    group: list[T] = []
    total = 0
    for item in items:
        size = size_of(item)
        if group and (len(group) >= MAX_REQUEST_RECORDS or total + size > MAX_REQUEST_BYTES):
            yield group
            group, total = [], 0
        group.append(item)
        total += size
    if group:
        yield group


def first_per_key(items: Sequence[T], key_of: Callable[[T], Hashable]) -> tuple[list[T], list[T]]:
    """(the first item of each key, the rest), both in the given order.

    Per-key order through retries: PutRecords reports failures per entry and
    lands the others, so two entries of one partition key in flight together
    can land out of order (the first throttled, the second not). Sending only
    the earliest unlanded entry of each key keeps each key's order whatever
    fails; the rest go in later rounds.
    """
    seen: set[Hashable] = set()
    first: list[T] = []
    rest: list[T] = []
    for item in items:
        key = key_of(item)
        if key in seen:
            rest.append(item)
        else:
            seen.add(key)
            first.append(item)
    return first, rest
