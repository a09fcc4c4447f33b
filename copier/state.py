"""Per-shard state: the value objects and the store interface.

One *state item* per staging shard holds the fencing epoch, the owner and
its lease, the committed position, the in-flight batch (``pending``), what is
left to redo of a verified batch, an announced successor, and counters. One
*digest item* per forwarded batch holds the identities of what it put, for
the dedup window and for verifying the batch if its owner dies mid-put.

The store is behind :class:`StateStore` so the protocol runs the same against
DynamoDB (``copier.dynamo``) and the in-memory fake (``copier.testing``).
Every write that changes a shard's state is conditioned on the writer still
being the owner: ``epoch`` unchanged and no successor announced. A failed
condition raises :class:`~copier.errors.FencedError`.

Writes are idempotent (absolute values, no increments): a write retried
after an ambiguous failure leaves the same item as one that went through once.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from copier.positions import Position

__all__ = ["COUNTERS", "DigestBatch", "Pending", "ShardState", "StateConflict", "StateStore", "shard_key"]

COUNTERS = ("forwarded", "duplicates", "replays", "unkeyed", "dead_lettered", "already_landed", "possible_duplicates")


def shard_key(stream_name: str, shard_id: str) -> str:
    """The state item's partition key: one table can serve several staging streams."""
    return f"{stream_name}/{shard_id}"


@dataclass(frozen=True)
class Pending:
    """The batch in flight: recorded before its put, cleared by its commit."""

    batch_key: str
    last: Position
    started_ms: int


@dataclass(frozen=True)
class ShardState:
    """What the state item says about one shard."""

    epoch: int = 0
    version: int = 0
    owner: str | None = None
    lease_until_ms: int = 0
    position: Position | None = None
    pending: Pending | None = None
    redo_last: Position | None = None
    redo_digests: tuple[bytes, ...] = ()
    successor: str | None = None
    closed: bool = False
    batches: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    updated_ms: int = 0
    behind_ms: int | None = None

    def with_counts(self, **delta: int) -> ShardState:
        counters = dict(self.counters)
        for name, value in delta.items():
            counters[name] = counters.get(name, 0) + value
        return replace(self, counters=counters)

    @property
    def redo_counter(self) -> Counter[bytes]:
        return Counter(self.redo_digests)


@dataclass(frozen=True)
class DigestBatch:
    """The identities one batch put, per destination; kept for the window and for verification."""

    batch_key: str
    target: tuple[bytes, ...]
    deadletter: tuple[bytes, ...]
    window: tuple[bytes, ...]
    created_ms: int


class StateConflict(Exception):
    """A takeover or announcement raced with another writer; re-read and decide again."""


class StateStore(abc.ABC):
    """Conditional reads and writes of shard state; implementations convert their own errors."""

    @abc.abstractmethod
    def get(self, key: str) -> ShardState | None:
        """Strongly consistent read of the state item, or None if the shard was never seen."""

    @abc.abstractmethod
    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        """Write ``new`` if the item is still at ``seen.version`` (absent if ``seen`` is None).

        Used by a successor to announce itself and to take over; a
        :class:`StateConflict` means someone wrote in between: re-read.
        """

    @abc.abstractmethod
    def write(self, key: str, owner: ShardState, new: ShardState, batch: DigestBatch | None = None) -> None:
        """Replace the state as its owner, with ``batch`` in the same transaction.

        Conditioned on the item still having ``owner.epoch`` and ``owner.owner``
        and no announced successor; otherwise :class:`~copier.errors.FencedError`.
        """

    @abc.abstractmethod
    def digests(self, key: str, newest_first: bool = True) -> Iterator[DigestBatch]:
        """The shard's stored digest batches, newest first."""

    @abc.abstractmethod
    def digest_batch(self, key: str, batch_key: str) -> DigestBatch | None:
        """One stored digest batch."""

    def window_batches(self, key: str, capacity: int) -> list[tuple[str, Sequence[bytes]]]:
        """Newest batches until ``capacity`` window digests are covered."""
        out: list[tuple[str, Sequence[bytes]]] = []
        total = 0
        if capacity <= 0:
            return out
        for batch in self.digests(key):
            out.append((batch.batch_key, batch.window))
            total += len(batch.window)
            if total >= capacity:
                break
        return out
