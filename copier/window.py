"""The per-shard window of recently forwarded event-ID digests.

A producer retry re-writes an event with a new sequence number, usually soon
after the first write and on the same shard. The window remembers the
digests of the most recent ``capacity`` events forwarded on a shard (at batch
granularity: a batch is dropped only when the batches after it still hold at
least ``capacity`` digests) so such a retry is recognised and dropped.

The window is persisted as one item per forwarded batch; a new owner of the
shard loads the newest items until it has ``capacity`` digests, and a child
shard after a split or merge starts from its parents' windows.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Sequence

__all__ = ["DedupWindow"]


class DedupWindow:
    """A bounded multiset of digests, oldest batch evicted first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._batches: deque[tuple[str, tuple[bytes, ...]]] = deque()
        self._counts: Counter[bytes] = Counter()
        self._size = 0

    def __contains__(self, digest: object) -> bool:
        return self._counts[digest] > 0 if isinstance(digest, bytes) else False

    def __len__(self) -> int:
        return self._size

    @property
    def batch_keys(self) -> list[str]:
        return [key for key, _ in self._batches]

    def add_batch(self, key: str, digests: Sequence[bytes]) -> None:
        """Remember a forwarded batch, then evict what the capacity no longer covers."""
        if self.capacity == 0 or not digests:
            return
        batch = tuple(digests)
        self._batches.append((key, batch))
        self._counts.update(batch)
        self._size += len(batch)
        self._evict()

    def _evict(self) -> None:
        while self._batches and self._size - len(self._batches[0][1]) >= self.capacity:
            _, old = self._batches.popleft()
            self._counts.subtract(old)
            self._size -= len(old)
            for digest in old:
                if self._counts[digest] <= 0:
                    del self._counts[digest]

    @classmethod
    def from_newest_first(cls, capacity: int, batches: Iterable[tuple[str, Sequence[bytes]]]) -> DedupWindow:
        """Build from stored batches listed newest first, taking only what capacity needs."""
        window = cls(capacity)
        chosen: list[tuple[str, Sequence[bytes]]] = []
        total = 0
        for key, digests in batches:
            if total >= capacity:
                break
            chosen.append((key, digests))
            total += len(digests)
        for key, digests in reversed(chosen):
            window.add_batch(key, digests)
        return window

    def merge(self, other: DedupWindow) -> None:
        """Take in another window's batches (a child shard inherits its parents')."""
        for key, digests in other._batches:
            self.add_batch(key, digests)
