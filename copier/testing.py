"""Fakes shipped with copier: an in-memory state store, a fixed clock, a recording target.

They run through the same contract tests as the real implementations
(``tests/test_state_contract.py``), so a test that passes against a fake
exercises the behaviour the real store has.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from copier.errors import FencedError
from copier.state import DigestBatch, ShardState, StateConflict, StateStore

__all__ = ["FakeClock", "InMemoryStateStore", "InMemoryStreams"]


class InMemoryStateStore(StateStore):
    """A StateStore in a dict, with DynamoDB's conditional-write semantics; counts writes."""

    def __init__(self) -> None:
        self._items: dict[str, ShardState] = {}
        self._batches: dict[str, dict[str, DigestBatch]] = {}
        self._lock = threading.Lock()
        self.write_requests = 0

    def get(self, key: str) -> ShardState | None:
        with self._lock:
            return self._items.get(key)

    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        with self._lock:
            self.write_requests += 1
            current = self._items.get(key)
            if (current is None) != (seen is None) or (current and seen and current.version != seen.version):
                raise StateConflict(key)
            self._items[key] = new

    def write(self, key: str, owner: ShardState, new: ShardState, batch: DigestBatch | None = None) -> None:
        with self._lock:
            self.write_requests += 1
            current = self._items.get(key)
            if current is None or current.epoch != owner.epoch or current.owner != owner.owner or current.successor:
                raise FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
            self._items[key] = new
            if batch is not None:
                self._batches.setdefault(key, {})[batch.batch_key] = batch

    def digests(self, key: str, newest_first: bool = True) -> Iterator[DigestBatch]:
        with self._lock:
            batches = sorted(self._batches.get(key, {}).values(), key=lambda b: b.batch_key, reverse=newest_first)
        yield from batches

    def digest_batch(self, key: str, batch_key: str) -> DigestBatch | None:
        with self._lock:
            return self._batches.get(key, {}).get(batch_key)

    def corrupt(self, key: str, **changes: object) -> None:
        """Change an item behind the owner's back (a test's stand-in for another writer)."""
        with self._lock:
            self._items[key] = replace(self._items[key], **changes)  # type: ignore[arg-type]


class FakeClock:
    """A clock that moves only when slept on or advanced: tests of leases need no waiting."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms
        self.slept: list[int] = []

    def now_ms(self) -> int:
        return self.now

    def sleep_ms(self, ms: int) -> None:
        self.slept.append(ms)
        self.now += max(0, ms)

    def advance(self, ms: int) -> None:
        self.now += ms


PutFault = Callable[[str, list[tuple[str, bytes]]], tuple[list[bool], BaseException | None]]


def _all_land(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
    return [True] * len(entries), None


class InMemoryStreams:
    """Kinesis streams in lists, with a fault hook for what a local backend cannot do.

    ``fault(stream, entries)`` returns which entries land and an optional
    exception to raise after landing them: per-entry throttling (entries that
    do not land get ``ProvisionedThroughputExceededException``), an ambiguous
    put (``AmbiguousPutError`` after a subset landed), a crash mid-put.
    """

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.records: dict[str, list[tuple[str, bytes, int]]] = {}
        self.shard_parents: dict[str, list[str]] = {}
        self.fault: PutFault = _all_land
        self.clock = clock or FakeClock()
        self.put_calls = 0

    def put_records(self, stream: str, entries: Sequence[tuple[str, bytes]]) -> list[str | None]:
        self.put_calls += 1
        land, error = self.fault(stream, list(entries))
        out: list[str | None] = []
        for (pk, data), ok in zip(entries, land, strict=True):
            if ok:
                self.records.setdefault(stream, []).append((pk, data, self.clock.now_ms()))
            out.append(None if ok else "ProvisionedThroughputExceededException")
        if error is not None:
            raise error
        return out

    def identities_since(self, stream: str, since_ms: int, identity: Callable[[str, bytes], bytes]) -> Counter[bytes]:
        return Counter(identity(pk, data) for pk, data, at in self.records.get(stream, []) if at >= since_ms)

    def parents(self, stream: str, shard_id: str) -> list[str]:
        return list(self.shard_parents.get(shard_id, []))

    def data(self, stream: str) -> list[bytes]:
        return [data for _, data, _ in self.records.get(stream, [])]
