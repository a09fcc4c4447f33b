"""Per-shard state: the value objects and the store interface.

Two kinds of item per staging shard (``docs/protocol.md`` has the whole protocol):

* the *state item*: the fencing epoch, the owner and its lease, the
  committed position (with its record's staging arrival and its age when
  its chunk had landed: the replication checkpoint), the index of the last
  committed digest batch, what is left to redo of a verified batch, an
  announced successor, the window's reach, a stall its owner is in, and counters. Small (well under 1 KB)
  and rewritten by every commit.
* one *digest batch* per forwarded chunk (at most ``MAX_CHUNK_EVENTS`` events):
  the digests of what it puts, its last position, when its put started, its
  staging arrival range and the target shards its entries hash to. It is
  written *before* the put and is the chunk's intent: its index is one above
  the state item's ``batches`` until the commit makes it committed.

Which digest batches count: those with an index at or below the state
item's ``batches``. A batch one above is in flight (or a dead writer's
leftover) and is verified by the next owner; anything a fenced writer leaves
behind is either verified that way or overwritten, never read as forwarded.
:meth:`StateStore.put_batch` refuses to overwrite a batch written under a
higher epoch, so a zombie cannot replace what a newer owner recorded.

The store is behind :class:`StateStore` so the protocol runs the same against
DynamoDB (``copier.adapters.dynamo``) and the in-memory fake (``copier.testing``).
Every state write as owner is conditioned on the writer still being the
owner: ``epoch`` and ``owner`` unchanged and no successor announced. A failed
condition raises :class:`~copier.core.errors.FencedError`.

Writes are idempotent (absolute values, no increments): a write retried
after an ambiguous failure leaves the same item as one that went through once.
"""

from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from copier.core.limits import MAX_RETENTION_MS
from copier.core.packing import digest_count, unpack_digests
from copier.core.positions import Position

__all__ = [
    "COUNTERS",
    "STATE_FORMAT",
    "DigestBatch",
    "ShardState",
    "StateConflict",
    "StateStore",
    "batch_key",
    "digest_expiry_ms",
    "shard_key",
]

#: Version of the item layout; copier refuses items of another (see copier.adapters.dynamo).
STATE_FORMAT = 2

COUNTERS = ("forwarded", "duplicates", "replays", "unkeyed", "dead_lettered", "already_landed", "before_start")


def shard_key(stream_name: str, shard_id: str) -> str:
    """The items' partition key: one table can serve several staging streams."""
    return f"{stream_name}/{shard_id}"


def digest_expiry_ms(now_ms: int, arrival_max_ms: int, window_ms: int, retention_ms: int | None, floor_ms: int) -> int:
    """When a digest batch whose newest staging arrival is ``arrival_max_ms`` may expire: once nothing staging can
    still deliver needs it (a retry within the window of it, delivered at the latest when the staging retention
    ends), an hour later, and never before ``floor_ms`` after ``now_ms``. A retention that cannot be read (None)
    counts as the longest Kinesis allows (docs/protocol.md, "Digest lifetime")."""
    retention = MAX_RETENTION_MS if retention_ms is None else retention_ms
    return max(now_ms + floor_ms, arrival_max_ms + window_ms + retention + 3_600_000)


def batch_key(index: int) -> str:
    """A digest batch's sort key: zero-padded so that sort order is index order."""
    return f"batch#{index:012d}"


@dataclass(frozen=True)
class ShardState:
    """What the state item says about one shard."""

    epoch: int = 0
    version: int = 0
    owner: str | None = None
    lease_until_ms: int = 0
    position: Position | None = None
    batches: int = 0  # index of the last committed digest batch
    redo_last: Position | None = None
    redo_digests: tuple[int, ...] = ()
    # the plan settings the redo digests were computed under ("" with a redo set: an earlier copier's, which
    # stored none: ShardSession.stored_settings)
    redo_settings: str = ""
    redo_suspect: bool = False  # the verification could not see all it should (see copier.core.plan.Redo)
    successor: str | None = None
    # the announced successor's measured clock bound when it announced itself: how long a fenced owner must
    # leave it to take over (``copier.shard.ownership.Ownership.gone_ms``)
    successor_bound_ms: int | None = None
    closed: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    updated_ms: int = 0
    behind_ms: int | None = None
    window_ids: int = 0
    window_oldest_ms: int = 0
    window_newest_ms: int = 0
    window_cut: bool = False
    # the dedup window (ms) its owner's digest batches were written under, their lifetime reckoned from it (None:
    # not recorded, an earlier copier): a larger configured window holds only for events forwarded from then on
    window_ms: int | None = None
    clock_bound_ms: int | None = None  # the owner's measured clock bound (copier.core.clockcheck) at its last write
    # the application's start whose earlier events the shard's history holds (copier.shard.prestart); None: not yet
    prestart_ms: int | None = None
    # The replication checkpoint (``copier status``): the staging arrival of the record at ``position`` (AWS time),
    # and how long after it the commit's chunk had landed in full, in AWS time (None: an earlier copier's commit).
    position_arrival_ms: int | None = None
    position_age_ms: int | None = None
    # Why the owner is stalled (``copier.shard.session.Stall``: "rejected", "stream_settings"; None: it is not),
    # what stalls it (the call and AWS's code, or the setting) and since when (its clock): ``copier status``
    # reads them. Written with the owner's writes, so a stall that refuses the state writes themselves (this
    # host's clock, a state item DynamoDB rejects) is not here: its lease and lag say it instead.
    stall_reason: str | None = None
    stall_detail: str = ""
    stall_since_ms: int | None = None

    def with_counts(self, **delta: int) -> ShardState:
        return replace(self, counters=self.counted(**delta))

    def counted(self, **delta: int) -> dict[str, int]:
        """The counters with ``delta`` added: for a ``replace`` that changes other fields too (one new state,
        not two: a commit builds one per chunk)."""
        counters = dict(self.counters)
        for name, value in delta.items():
            counters[name] = counters.get(name, 0) + value
        return counters

    @property
    def redo_counter(self) -> Counter[int]:
        return Counter(self.redo_digests)


@dataclass(frozen=True)
class DigestBatch:
    """What one chunk puts, recorded before its put; see the module docstring.

    Digest lists are kept packed (``copier.core.packing``): a reader loads them
    into the window without a Python object per digest.
    """

    index: int
    epoch: int
    last: Position
    started_ms: int
    keyed: bytes = b""  # target entries with an event ID: their ID digests (the window)
    unkeyed: bytes = b""  # target entries without one: content digests
    deadletter: bytes = b""  # dead-letter envelopes: content digests
    arrival_min_ms: int = 0
    arrival_max_ms: int = 0
    target_shards: tuple[int, ...] = ()  # numbers of the target shards its entries hash to
    settings: str = ""  # copier.core.plan.PlanSettings.encode() of the plan ("": a batch of an earlier copier)
    dead_ids: bytes = b""  # ID digests of the keyed events it dead-lettered (the window learns them)
    redo_ids: bytes = b""  # each entry's identity under redo_settings, in entry order (see copier.core.recovery)
    # the settings of the redo set it consumed, when they differ from ``settings``; after a re-plan, those the
    # chunk was first planned under (copier.core.replan)
    redo_settings: str = ""
    expires_ms: int = 0  # when DynamoDB's TTL may delete it (0: the store decides)
    clock_bound_ms: int | None = None  # its writer's measured clock bound when it was written
    revision: int = 0  # its writer's re-plans of it (copier.core.replan): a lower one never replaces a higher
    # ID digests of keyed events that arrived before the application's start (copier.core.startpoint): never put,
    # learned by the window all the same. A batch of them alone (copier.shard.prestart) has ``last`` (0, 0).
    before_ids: bytes = b""

    @property
    def key(self) -> str:
        return batch_key(self.index)

    @property
    def keyed_count(self) -> int:
        return digest_count(self.keyed) + digest_count(self.dead_ids) + digest_count(self.before_ids)

    def target_digests(self) -> list[int]:
        """Every target entry's identity, keyed then unkeyed."""
        return unpack_digests(self.keyed) + unpack_digests(self.unkeyed)

    def deadletter_digests(self) -> list[int]:
        return unpack_digests(self.deadletter)

    def entry_digests(self) -> list[int]:
        """Every entry's identity in entry order: keyed, unkeyed, dead-lettered."""
        return self.target_digests() + self.deadletter_digests()


@dataclass(frozen=True)
class BoardItem:
    """An item of the application's, not of a shard, in the state table (``copier.core.summaryboard``): its
    text and the version a conditional write of it names."""

    version: int
    text: str


class StateConflict(Exception):
    """A takeover or announcement raced with another writer; re-read and decide again."""


class StateStore(abc.ABC):
    """Conditional reads and writes of shard state; implementations convert their own errors."""

    @abc.abstractmethod
    def get(self, key: str) -> ShardState | None:
        """Strongly consistent read of the state item, or None if the shard was never seen."""

    def get_many(self, keys: Iterable[str]) -> dict[str, ShardState]:
        """The state items of several shards (absent ones left out); for ``copier status``."""
        found = {key: self.get(key) for key in keys}
        return {key: state for key, state in found.items() if state is not None}

    @abc.abstractmethod
    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        """Write ``new`` if the item is still at ``seen.version`` (absent if ``seen`` is None).

        Used by a successor to announce itself and to take over; a
        :class:`StateConflict` means someone wrote in between: re-read.
        """

    @abc.abstractmethod
    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        """Replace the state as its owner.

        Conditioned on the item still having ``owner.epoch`` and ``owner.owner``,
        no announced successor, and a version below ``new.version`` (a late
        copy of an older write must not roll the item back); otherwise
        :class:`~copier.core.errors.FencedError`. A retry of a write that went
        through is refused too: the caller reads the item back
        (``ShardSession.write``).
        """

    @abc.abstractmethod
    def get_posted(self, key: str) -> BoardItem | None:
        """Strongly consistent read of an application item (``copier.core.summaryboard``), None if absent."""

    @abc.abstractmethod
    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        """Write an application item, if it is still ``seen`` (absent if ``seen`` is None), to expire (TTL)
        at ``expires_ms``; the item as written. :class:`StateConflict`: another host wrote it in between."""

    @abc.abstractmethod
    def put_batch(self, key: str, batch: DigestBatch) -> None:
        """Store a digest batch unless one of a higher epoch, or of the same epoch and a higher revision (a late
        first attempt of a write its re-plan replaced, ``copier.core.replan``), holds its index (then FencedError).

        Not conditioned on the state item (that would take a transaction,
        billed twice): a batch above the committed index counts for nothing
        until a commit or a verification makes it count.
        """

    @abc.abstractmethod
    def get_batch(self, key: str, index: int) -> DigestBatch | None:
        """One digest batch, strongly consistent."""

    @abc.abstractmethod
    def batches(self, key: str, upto: int, page_size: int | None = None) -> Iterator[DigestBatch]:
        """The committed digest batches, index ``upto`` down to 1, read lazily (stop early to read less).

        ``page_size``: batches a read fetches (default: as many as fit a 1 MB
        page); small when the caller wants only the newest few.
        """
