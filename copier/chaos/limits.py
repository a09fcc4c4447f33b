"""Kinesis' per-shard throughput limits as token buckets: what the chaos proxy's ``limits`` profile enforces.

No local backend throttles a shard (moto, kinesis-mock and kinesalite take
whatever they are sent), so code that must live with the limits AWS
enforces never meets them in a test. These are AWS's numbers for a
provisioned shard (the Kinesis Data Streams quotas page):

* writes: 1,000 records and 1 MiB a second (a record counts its data and
  its partition key); a PutRecords entry over the limit fails alone, with
  ``ProvisionedThroughputExceededException``, and the others land;
* reads: 5 GetRecords calls and 2 MiB a second, shared by every reader of
  the shard; and a GetRecords that returned 10 MiB throttles the shard's
  next reads for 5 seconds.

(The numbers are :mod:`copier.core.limits`', which readers pace by.)

Each (stream, shard) has a bucket per limit, holding at most one second's
allowance and refilled continuously. Pure: the clock is passed in, so the
tests step it. Two choices where the quotas page says nothing exact:

* a record larger than a second's byte allowance (a stream's records may be
  up to 10 MiB) passes when the shard's byte bucket is full, and leaves it
  in debt: without that it could never be written;
* the bytes a GetRecords returned are known after it is served, so they are
  charged then; the bucket may go into debt, and the shard's reads are
  refused until it is positive again (a 10 MiB read is refused for 5 s by
  the rule above, the debt alone would last 4 s).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from copier.core.limits import (
    BIG_READ_BYTES,
    BIG_READ_PAUSE_S,
    READ_BYTES_PER_SHARD_S,
    READ_CALLS_PER_SHARD_S,
    WRITE_BYTES_PER_SHARD_S,
    WRITE_RECORDS_PER_SHARD_S,
)

__all__ = [
    "BIG_READ_BYTES",
    "BIG_READ_PAUSE_S",
    "MIB",
    "READ_BYTES_PER_S",
    "READ_CALLS_PER_S",
    "WRITE_BYTES_PER_S",
    "WRITE_RECORDS_PER_S",
    "Bucket",
    "ShardLimits",
]

MIB = 1024 * 1024
WRITE_RECORDS_PER_S = WRITE_RECORDS_PER_SHARD_S
WRITE_BYTES_PER_S = WRITE_BYTES_PER_SHARD_S
READ_CALLS_PER_S = READ_CALLS_PER_SHARD_S
READ_BYTES_PER_S = READ_BYTES_PER_SHARD_S


@dataclass
class Bucket:
    """A token bucket: ``rate`` tokens a second, at most ``rate`` held (one second's allowance); starts full."""

    rate: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.rate, self.level + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)

    @property
    def full(self) -> bool:
        return self.level >= self.rate


@dataclass
class _Shard:
    records: Bucket
    written: Bucket
    calls: Bucket
    read: Bucket
    paused_until: float = field(default=float("-inf"))


class ShardLimits:
    """The buckets of every (stream, shard) met so far; ``clock`` gives seconds (monotonic)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self._shards: dict[tuple[str, str], _Shard] = {}

    def _shard(self, stream: str, shard: str, now: float) -> _Shard:
        found = self._shards.get((stream, shard))
        if found is None:
            found = self._shards[(stream, shard)] = _Shard(
                Bucket(WRITE_RECORDS_PER_S, WRITE_RECORDS_PER_S, now),
                Bucket(WRITE_BYTES_PER_S, WRITE_BYTES_PER_S, now),
                Bucket(READ_CALLS_PER_S, READ_CALLS_PER_S, now),
                Bucket(READ_BYTES_PER_S, READ_BYTES_PER_S, now),
            )
        for bucket in (found.records, found.written, found.calls, found.read):
            bucket.refill(now)
        return found

    def admit_puts(self, stream: str, entries: Sequence[tuple[str | None, int]]) -> list[bool]:
        """Which entries of one PutRecords land, in order: each is (its shard, its size in bytes: data and
        partition key). An entry whose shard is unknown (None: no open shard holds its hash key, mid-reshard)
        is left to the backend. Admitted entries use their shard's allowance; refused ones use nothing."""
        now = self.clock()
        admitted = []
        for shard_id, size in entries:
            if shard_id is None:
                admitted.append(True)
                continue
            shard = self._shard(stream, shard_id, now)
            fits = shard.written.level >= size or shard.written.full
            ok = shard.records.level >= 1 and fits
            if ok:
                shard.records.level -= 1
                shard.written.level -= size
            admitted.append(ok)
        return admitted

    def admit_read(self, stream: str, shard_id: str) -> bool:
        """Whether a GetRecords of this shard may be served now; an admitted one uses a call of the shard's five
        a second (charge its answer's bytes with :meth:`charge_read`)."""
        now = self.clock()
        shard = self._shard(stream, shard_id, now)
        if now < shard.paused_until or shard.read.level <= 0 or shard.calls.level < 1:
            return False
        shard.calls.level -= 1
        return True

    def charge_read(self, stream: str, shard_id: str, size: int) -> None:
        """Charge the bytes a served GetRecords returned; 10 MiB or more pauses the shard's reads for 5 s."""
        now = self.clock()
        shard = self._shard(stream, shard_id, now)
        shard.read.level -= size
        if size >= BIG_READ_BYTES:
            shard.paused_until = now + BIG_READ_PAUSE_S
