"""Putting a planned chunk until every record has landed, exactly once.

The loop, per round: split what is left into PutRecords requests; before
each request make sure the lease outlives the put; keep the entries that
landed; retry only the entries that failed, after a jittered backoff. A
request whose outcome is unknown (timeout, lost connection, 5xx) is not
resent: after the put timeout has passed, the destination is read, only
in the shards those entries hash to and only from the chunk's start to
the verification's start plus the clock margin (nothing of the put arrives
later), and only the entries not found there are retried. The shards read are those
the entries hash to in a shard map taken before the request was sent (a
map refreshed after it may name only the children of a shard split in the
meantime); entries without an event ID are never counted as landed (an
identical record from another shard cannot be told from theirs, see
``copier.core.recovery``): they are sent again, and reported as possible
duplicates before they are (``PutSession.on_unverifiable_resend``).

What a per-entry ``ErrorCode`` proves (``copier.core.errors``):
``ProvisionedThroughputExceededException``, that the entry was not written
(retried); ``InternalFailure`` or a code AWS does not document, nothing: the
entry is verified as an ambiguous request's entries are, alone.

With ``copier.ordering = partitionKey`` (the default) a round sends only the
earliest unlanded entry of each partition key, so a key's entries land in
staging order through partial failures, throttling and ambiguous puts; a
key with many entries in a chunk takes as many rounds (measured cost:
docs/benchmarks.md). ``none`` sends everything at once.

It returns only when everything landed. It raises
:class:`~copier.core.errors.FencedError` when the lease cannot be renewed (the
shard was taken over) and a host-wide :class:`~copier.core.errors.FatalAwsError`
(a missing stream, denied access). A request AWS refuses as final (a record
over the stream's record limit, lowered since the chunk was planned: Kinesis
refuses the whole request) is handed to the caller's :data:`Replan` with the
round's other unwritten entries: what a changed limit refuses becomes a
dead-letter entry, recorded before it is put. When nothing changes (no
dead-letter stream, or a refusal that is not a limit's), the shard stalls: it
is retried at the longest backoff and reported through ``on_stall`` each
time, so an operator sees it while the host's other shards go on. Everything
else is retried.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from copier.core.batching import first_per_key, split_requests
from copier.core.errors import (
    ENTRY_CODES,
    NOT_WRITTEN_ENTRY_CODES,
    AmbiguousPutError,
    AwsError,
    FatalAwsError,
    TransientAwsError,
)
from copier.core.plan import Outgoing
from copier.core.ports import Clock, Found, Identity, Streams
from copier.core.positions import Position
from copier.core.retry import backoff_ms
from copier.core.shardmap import ShardMap, shards_covering

__all__ = ["ForwardStats", "Forwarder", "PutSession", "Replan"]

T = TypeVar("T")

#: What the caller makes of entries AWS refused as final (a record over a stream's record limit lowered since
#: the chunk was planned): ``(destination, entries)`` -> the entries that change (a record now for the dead-letter
#: stream, an envelope rewrapped), by position, recorded in the chunk's digest batch before anything of them is
#: put; empty when nothing changes (the shard stalls). The entries given are proven not written: refused,
#: throttled, or verified absent.
Replan = Callable[[str, list[Outgoing], FatalAwsError], dict[Position, Outgoing]]


class PutSession(Protocol):
    """What a :class:`Forwarder` needs from the shard it puts for (``copier.shard.session.ShardSession``):
    the lease kept, records recognised when read back, calls retried as the shard retries them, and what
    happened said (metrics and logs)."""

    def ensure_lease(self) -> None:
        """Before a request: make sure the lease outlives it; FencedError when it cannot be renewed."""

    def identity_for(self, destination: str) -> Identity:
        """How a record put to ``destination`` ("target" or "deadletter") is recognised when read back."""

    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        """Run an AWS call until it succeeds (transient faults retried, a fault of this shard's stalls it)."""

    def on_put_request(self, stream: str, entries: int, failed: int, millis: float | None) -> None:
        """One PutRecords answered (``failed`` -1: its outcome unknown)."""

    def on_put_retry(self, code: str, entries: int, attempt: int) -> None:
        """Entries that failed with ``code`` are retried."""

    def on_landed(self, destination: str, entries: Sequence[Outgoing], at_ms: int) -> None:
        """Entries are known to have landed in ``destination`` at local time ``at_ms`` (an answer, or a
        verification read that found them): their age at the target (``copier.core.recordage``)."""

    def on_stall(self, call: str, error: AwsError, attempt: int) -> None:
        """AWS rejects this shard's request as final: retried at the longest backoff, said each time."""

    def on_unverifiable_resend(self, entries: Sequence[Outgoing], read_from_ms: int) -> None:
        """Entries without an event ID whose put's outcome is unknown are about to be sent again: reported as
        possible duplicates first (they cannot be verified: identical records cannot be told apart)."""

    def latest_arrival_ms(self) -> int:
        """The latest Kinesis arrival time (AWS time) a record of a put that ended before now can carry: this
        host's clock now plus the bound on its offset from AWS time, read around it."""

    def host_wide(self, error: FatalAwsError) -> bool:
        """Does the error end the process (a fault no shard of the host gets past), or stall this shard?"""


@dataclass
class _Answers:
    """What one round's answers prove of its entries."""

    failed: list[Outgoing] = field(default_factory=list)  # not written: sent again
    unknown: list[Outgoing] = field(default_factory=list)  # may have been written: verified before anything else
    codes: Counter[str] = field(default_factory=Counter)
    refused: FatalAwsError | None = None  # AWS refused a request (or an entry) as final: re-plan, or stall


def _elsewhere(changed: dict[Position, Outgoing], entry: Outgoing) -> bool:
    """Did a re-plan send ``entry`` to another stream?"""
    new = changed.get(entry.position)
    return new is not None and new.destination != entry.destination


@dataclass
class ForwardStats:
    requests: int = 0
    retried_entries: int = 0
    ambiguous_requests: int = 0
    verified_landed: int = 0
    records_read: int = 0
    widened_reads: int = 0  # verifications that had to read every target shard (see _verify)


def _partition_key(entry: Outgoing) -> str:
    return entry.partition_key


def _position(entry: Outgoing) -> Position:
    return entry.position


def _size_bound(entry: Outgoing) -> int:
    """At least what an entry counts against the request limits (a key's UTF-8 takes at most 4 bytes a
    character), without encoding the key: requests may split a little early, never too late."""
    return len(entry.data) + 4 * len(entry.partition_key)


class Forwarder:
    """Puts one chunk's outgoing records to their streams; see the module docstring."""

    def __init__(
        self,
        streams: Streams,
        clock: Clock,
        session: PutSession,
        stream_names: dict[str, str],
        put_timeout_ms: int,
        max_backoff_ms: int,
        ordered: bool = True,
    ) -> None:
        self.streams = streams
        self.clock = clock
        self.session = session
        self.stream_names = stream_names
        self.put_timeout_ms = put_timeout_ms
        self.max_backoff_ms = max_backoff_ms
        self.ordered = ordered
        self.attempted: list[Outgoing] = []

    def forward(self, outgoing: Sequence[Outgoing], read_from_ms: int, replan: Replan | None = None) -> ForwardStats:
        """Put every entry until it landed; see the module docstring. :attr:`attempted` lists the entries a
        request was sent for, so far (a caller fenced midway knows what may have landed).

        ``read_from_ms``: the earliest Kinesis arrival time any of these puts can have, in AWS time (the
        caller's clock reading before the first put, less the bound on its offset taken at that same
        moment): where verifying an ambiguous put starts reading. Taken by the caller, not here, because a
        clock step between the reading and a later bound would pair a time of one clock with the bound of
        another.

        ``replan``: what the caller makes of entries AWS refused as final (see :data:`Replan`); an entry it
        sends to the dead-letter stream instead is put there after the target's."""
        self.attempted = []
        stats = ForwardStats()
        outgoing = list(outgoing)  # as given: a re-plan changes the caller's plan, and says what it moved
        moved: list[Outgoing] = []
        for destination in ("target", "deadletter"):
            entries = [o for o in outgoing if o.destination == destination] + moved
            if entries:
                moved = self._forward_to(destination, entries, read_from_ms, stats, replan)
                assert not moved or destination == "target", "a re-plan moves entries to the dead-letter stream only"
        return stats

    def _forward_to(
        self,
        destination: str,
        entries: list[Outgoing],
        read_from_ms: int,
        stats: ForwardStats,
        replan: Replan | None,
    ) -> list[Outgoing]:
        """Put ``entries`` to one stream until each landed; the entries a re-plan sent elsewhere."""
        stream = self.stream_names[destination]
        landed: Counter[int] = Counter()
        left = list(entries)
        moved: list[Outgoing] = []
        ordered = self.ordered and destination == "target"
        attempt = 0
        while left:
            # copier.ordering = partitionKey: one entry per key in flight (see first_per_key).
            sending, waiting = first_per_key(left, _partition_key) if ordered else (left, [])
            routes = self._routes(destination, stream)
            answers = self._send(destination, stream, sending, landed, stats)
            failed = answers.failed
            if answers.unknown:
                failed.extend(self._verify(destination, stream, answers.unknown, read_from_ms, landed, stats, routes))
            refused = answers.refused
            if refused is not None and failed and replan is not None:
                changed = replan(destination, failed, refused)
                if changed:
                    refused = None  # the entries a changed limit refused are re-planned, not retried as they were
                    moved.extend(changed[o.position] for o in failed if _elsewhere(changed, o))
                    failed = [changed.get(o.position, o) for o in failed if not _elsewhere(changed, o)]
            if failed:
                failed.sort(key=lambda o: o.position)
                stats.retried_entries += len(failed)
                for code, count in answers.codes.items():
                    self.session.on_put_retry(code, count, attempt)
                if refused is not None:
                    self.session.on_stall("PutRecords", refused, attempt)
                    self.clock.sleep_ms(self.max_backoff_ms)
                else:
                    self.clock.sleep_ms(backoff_ms(attempt, self.max_backoff_ms))
                attempt += 1
            left = sorted(failed + waiting, key=_position) if waiting else failed
        return moved

    def _send(
        self, destination: str, stream: str, sending: list[Outgoing], landed: Counter[int], stats: ForwardStats
    ) -> _Answers:
        """One round's requests: what landed joins ``landed`` (and is said, with the time of its answer); the
        rest is sorted by what its answer proves."""
        answers = _Answers()
        for request in split_requests(sending, _size_bound):
            deadline = time.monotonic() + self.put_timeout_ms / 1000  # read before the lease check: its whole life
            self.session.ensure_lease()
            stats.requests += 1
            self.attempted.extend(request)
            sent = time.monotonic()
            try:
                sending_now = [(o.partition_key, o.data, o.b64) for o in request]
                results = self.streams.put_records(stream, sending_now, deadline=deadline)
            except AmbiguousPutError as exc:
                stats.ambiguous_requests += 1
                answers.unknown.extend(request)
                answers.codes[exc.code] += len(request)
                self.session.on_put_request(stream, len(request), -1, None)
                continue
            except FatalAwsError as exc:
                if self.session.host_wide(exc):
                    raise
                answers.refused = exc  # rejected as a whole: nothing of it landed
                answers.failed.extend(request)
                answers.codes[exc.code] += len(request)
                continue
            except TransientAwsError as exc:
                answers.failed.extend(request)
                answers.codes[exc.code] += len(request)
                self.session.on_put_request(stream, len(request), len(request), None)
                continue
            failures = 0
            ok: list[Outgoing] = []
            for entry, code in zip(request, results, strict=True):
                if code is None:
                    landed[entry.identity] += 1
                    ok.append(entry)
                    continue
                failures += 1
                answers.codes[code] += 1
                if code in NOT_WRITTEN_ENTRY_CODES:
                    answers.failed.append(entry)
                    continue
                answers.unknown.append(entry)  # InternalFailure, or a code AWS does not document: may be written
                if code not in ENTRY_CODES:
                    answers.refused = FatalAwsError("PutRecords", code, "an entry refused, a code AWS does not list")
            self.session.on_put_request(stream, len(request), failures, (time.monotonic() - sent) * 1000)
            if ok:
                self.session.on_landed(destination, ok, self.clock.now_ms())
        return answers

    def _routes(self, destination: str, stream: str) -> ShardMap | None:
        """The target's shard map before a round is sent (what verifying its ambiguous requests reads)."""
        if destination != "target":
            return None
        shard_map: ShardMap = self.session.retrying("list_target_shards", lambda: self.streams.shard_map(stream))
        return shard_map

    def _verify(
        self,
        destination: str,
        stream: str,
        unknown: list[Outgoing],
        read_from_ms: int,
        landed: Counter[int],
        stats: ForwardStats,
        routes: ShardMap | None,
    ) -> list[Outgoing]:
        """After any put still in flight has finished, read what is there; return the entries to retry.

        The read ends at the verification's start plus the clock margin: every put of the round ended by its
        deadline, and the put timeout waited out since lets whatever the server held of it land, so nothing of
        it arrives later. Without an end, a target shard others keep writing to never shows an empty page at
        its tip, and the read would go on for as long as they write (docs/protocol.md, "A batch")."""
        self.clock.sleep_ms(self.put_timeout_ms)
        until_ms = self.session.latest_arrival_ms()
        retry = [e for e in unknown if destination == "target" and e.event_id is None]  # cannot be told apart
        if retry:
            self.session.on_unverifiable_resend(retry, read_from_ms)  # said before it is sent again
        checkable = [e for e in unknown if not (destination == "target" and e.event_id is None)]
        if not checkable:
            return retry
        shards: Collection[int] | None = None
        if routes is not None:
            shards = shards_covering(routes, (e.partition_key for e in checkable))
        identity = self.session.identity_for(destination)

        def read(wanted: Collection[int] | None) -> Counter[int]:
            found: Found = self.session.retrying(
                "verify_put",
                lambda: self.streams.read_identities(
                    stream, wanted, read_from_ms, until_ms, identity, keep_alive=self.session.ensure_lease
                ),
            )
            stats.records_read += found.records_read
            return found.identities

        identities = read(shards)
        if shards is not None and any(identities[e.identity] <= landed[e.identity] for e in checkable):
            # Not where its key hashes to: the target may ignore keys (RecordDistributionStrategy = AUTO, even
            # switched since the last look): every shard of the map before the put, and their children, first.
            identities = read(None)
            stats.widened_reads += 1
        found: list[Outgoing] = []
        for entry in checkable:
            if identities[entry.identity] > landed[entry.identity]:
                landed[entry.identity] += 1
                stats.verified_landed += 1
                found.append(entry)
            else:
                retry.append(entry)
        if found:  # when it landed is not known: when it was found is an upper bound
            self.session.on_landed(destination, found, self.clock.now_ms())
        return sorted(retry, key=_position)
