"""Putting a planned batch until every record has landed, exactly once.

The loop, per round: split what is left into PutRecords requests; before
each request make sure the lease outlives the put; keep the entries that
landed; retry only the entries that failed, after a jittered backoff. A
request whose outcome is unknown (timeout, lost connection, 5xx) is not
resent: after the put timeout has passed, the destination stream is read
from the batch's start and only the entries not found there are retried.

It returns only when everything landed. It raises
:class:`~copier.errors.FencedError` when the lease cannot be renewed (the
shard was taken over) and :class:`~copier.errors.FatalAwsError` when retrying
cannot help; every other failure is retried.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from copier.batching import split_requests
from copier.errors import AmbiguousPutError, TransientAwsError
from copier.limits import record_size
from copier.plan import Outgoing
from copier.retry import backoff_ms

__all__ = ["Forwarder", "Streams", "Clock"]


class Clock(Protocol):
    def now_ms(self) -> int: ...
    def sleep_ms(self, ms: int) -> None: ...


class Streams(Protocol):
    def put_records(self, stream: str, entries: Sequence[tuple[str, bytes]]) -> list[str | None]: ...
    def identities_since(
        self, stream: str, since_ms: int, identity: Callable[[str, bytes], bytes]
    ) -> Counter[bytes]: ...


@dataclass
class ForwardStats:
    requests: int = 0
    retried_entries: int = 0
    ambiguous_requests: int = 0
    verified_landed: int = 0


class Forwarder:
    """Puts one batch's outgoing records to their streams; see the module docstring."""

    def __init__(
        self,
        streams: Streams,
        clock: Clock,
        stream_names: dict[str, str],
        ensure_lease: Callable[[], None],
        identity_for: Callable[[str], Callable[[str, bytes], bytes]],
        put_timeout_ms: int,
        clock_skew_ms: int,
        max_backoff_ms: int,
        on_retry: Callable[[str, int, int], None] = lambda code, entries, attempt: None,
        on_request: Callable[[str, int, int], None] = lambda stream, entries, failed: None,
    ) -> None:
        self.streams = streams
        self.clock = clock
        self.stream_names = stream_names
        self.ensure_lease = ensure_lease
        self.identity_for = identity_for
        self.put_timeout_ms = put_timeout_ms
        self.clock_skew_ms = clock_skew_ms
        self.max_backoff_ms = max_backoff_ms
        self.on_retry = on_retry
        self.on_request = on_request

    def forward(self, outgoing: Sequence[Outgoing], started_ms: int) -> ForwardStats:
        stats = ForwardStats()
        for destination in ("target", "deadletter"):
            entries = [o for o in outgoing if o.destination == destination]
            if entries:
                self._forward_to(destination, entries, started_ms, stats)
        return stats

    def _forward_to(self, destination: str, entries: list[Outgoing], started_ms: int, stats: ForwardStats) -> None:
        stream = self.stream_names[destination]
        landed: Counter[bytes] = Counter()
        left = list(entries)
        attempt = 0
        while left:
            failed: list[Outgoing] = []
            unknown: list[Outgoing] = []
            codes: Counter[str] = Counter()
            for request in split_requests(left, lambda o: record_size(o.partition_key, o.data)):
                self.ensure_lease()
                stats.requests += 1
                try:
                    results = self.streams.put_records(stream, [(o.partition_key, o.data) for o in request])
                except AmbiguousPutError as exc:
                    stats.ambiguous_requests += 1
                    unknown.extend(request)
                    codes[exc.code] += len(request)
                    self.on_request(stream, len(request), -1)
                    continue
                except TransientAwsError as exc:
                    failed.extend(request)
                    codes[exc.code] += len(request)
                    self.on_request(stream, len(request), len(request))
                    continue
                before = len(failed)
                for entry, code in zip(request, results, strict=True):
                    if code is None:
                        landed[entry.identity] += 1
                    else:
                        failed.append(entry)
                        codes[code] += 1
                self.on_request(stream, len(request), len(failed) - before)
            if unknown:
                # Let any put still in flight finish, then look at what is there.
                self.clock.sleep_ms(self.put_timeout_ms)
                found = self.streams.identities_since(
                    stream, started_ms - self.clock_skew_ms, self.identity_for(destination)
                )
                for entry in unknown:
                    if found[entry.identity] > landed[entry.identity]:
                        landed[entry.identity] += 1
                        stats.verified_landed += 1
                    else:
                        failed.append(entry)
            if failed:
                failed.sort(key=lambda o: o.position)
                stats.retried_entries += len(failed)
                for code, count in codes.items():
                    self.on_retry(code, count, attempt)
                self.clock.sleep_ms(backoff_ms(attempt, self.max_backoff_ms))
                attempt += 1
            left = failed
