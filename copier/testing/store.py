"""InMemoryStateStore: the shard state store in a dict, with DynamoDB's conditional-write semantics.

It runs through the same contract tests as the DynamoDB store
(``tests/test_state_contract.py``), so a test that passes against it
exercises the behaviour the real store has.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace

from copier.core.errors import FencedError
from copier.core.state import BoardItem, DigestBatch, ShardState, StateConflict, StateStore
from copier.testing.clock import FakeClock

__all__ = ["InMemoryStateStore"]


class InMemoryStateStore(StateStore):
    """A StateStore in a dict, with DynamoDB's conditional-write semantics; counts writes.

    With a ``clock``, digest batches expire as DynamoDB's TTL makes them: a
    batch whose expiry (``expires_ms``, else ``started_ms + ttl_ms``) has
    passed is gone (DynamoDB deletes within days of expiry, so a real reader
    may still see it; the fake takes the harder case).
    """

    def __init__(self, clock: FakeClock | None = None, ttl_ms: int | None = None) -> None:
        self._items: dict[str, ShardState] = {}
        self._batches: dict[str, dict[int, DigestBatch]] = {}
        self._posted: dict[str, BoardItem] = {}
        self.posted_reads = 0  # GetItems of application items (the simulation counts them)
        self._lock = threading.Lock()
        self.write_requests = 0
        self.clock = clock
        self.ttl_ms = ttl_ms

    def _expired(self, batch: DigestBatch) -> bool:
        if self.clock is None:
            return False
        expires = getattr(batch, "expires_ms", 0) or (
            batch.started_ms + self.ttl_ms if self.ttl_ms is not None else None
        )
        return expires is not None and expires < self.clock.now_ms()

    def _live(self, key: str) -> dict[int, DigestBatch]:
        stored = self._batches.setdefault(key, {})
        for index in [i for i, b in stored.items() if self._expired(b)]:
            del stored[index]
        return stored

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

    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        with self._lock:
            self.write_requests += 1
            current = self._items.get(key)
            if (
                current is None
                or current.epoch != owner.epoch
                or current.owner != owner.owner
                or current.successor
                or current.version >= new.version
            ):
                raise FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
            self._items[key] = new

    def get_posted(self, key: str) -> BoardItem | None:
        with self._lock:
            self.posted_reads += 1
            return self._posted.get(key)

    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        with self._lock:
            self.write_requests += 1
            if self._posted.get(key) != seen:
                raise StateConflict(key)
            new = self._posted[key] = BoardItem(seen.version + 1 if seen is not None else 1, text)
            return new

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        with self._lock:
            self.write_requests += 1
            stored = self._live(key)
            existing = stored.get(batch.index)
            if existing is not None and (existing.epoch, existing.revision) > (batch.epoch, batch.revision):
                raise FencedError(f"{key}: {batch.key} was written under an epoch above {batch.epoch} or re-planned")
            stored[batch.index] = batch

    def get_batch(self, key: str, index: int) -> DigestBatch | None:
        with self._lock:
            return self._live(key).get(index)

    def batches(self, key: str, upto: int, page_size: int | None = None) -> Iterator[DigestBatch]:
        with self._lock:
            found = sorted((b for i, b in self._live(key).items() if 1 <= i <= upto), key=lambda b: -b.index)
        yield from found

    def corrupt(self, key: str, **changes: object) -> None:
        """Change an item behind the owner's back (a test's stand-in for another writer)."""
        with self._lock:
            self._items[key] = replace(self._items[key], **changes)  # type: ignore[arg-type]
