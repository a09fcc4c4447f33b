"""Fakes shipped with copier: an in-memory state store, a fixed clock, a recording target.

They run through the same contract tests as the real implementations
(``tests/test_state_contract.py``), so a test that passes against a fake
exercises the behaviour the real store has.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any

from copier.errors import FatalAwsError, FencedError, TransientAwsError
from copier.limits import MAX_PARTITION_KEY_CHARS, MAX_RECORD_BYTES, record_size
from copier.plan import SourceRecord
from copier.ports import Found, Identity
from copier.positions import Position
from copier.shardmap import ShardMap, descendants, shard_id_of, shard_number
from copier.state import DigestBatch, ShardState, StateConflict, StateStore
from copier.streamsettings import AUTO, PARTITION_KEY, StreamSettings

__all__ = [
    "FakeClock",
    "FlakyKinesis",
    "InMemoryStateStore",
    "InMemoryStreams",
    "even_shards",
    "flaky_kinesis",
    "read_flaky_log",
]


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
            if current is None or current.epoch != owner.epoch or current.owner != owner.owner or current.successor:
                raise FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
            self._items[key] = new

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        with self._lock:
            self.write_requests += 1
            stored = self._live(key)
            existing = stored.get(batch.index)
            if existing is not None and existing.epoch > batch.epoch:
                raise FencedError(f"{key}: {batch.key} was written under an epoch above {batch.epoch}")
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


def even_shards(count: int) -> list[dict[str, Any]]:
    """ListShards entries of ``count`` open shards splitting the hash key space evenly."""
    step = 2**128 // count
    return shards_from([n * step for n in range(count)])


def shards_from(starts: Sequence[int]) -> list[dict[str, Any]]:
    """ListShards entries of open shards starting at these hash keys (the first 0), each ending where the next
    starts, the last at the top of the key space."""
    ends = [start - 1 for start in starts[1:]] + [2**128 - 1]
    return [
        {
            "ShardId": shard_id_of(n),
            "HashKeyRange": {"StartingHashKey": str(start), "EndingHashKey": str(end)},
            "SequenceNumberRange": {"StartingSequenceNumber": "0"},
        }
        for n, (start, end) in enumerate(zip(starts, ends, strict=True))
    ]


class InMemoryStreams:
    """Kinesis streams in lists, routed to shards by partition key, with what the tests need to draw.

    * Shards: each stream starts with ``shard_counts.get(stream, 1)`` shards splitting the hash key space
      evenly; :meth:`split` and :meth:`merge` reshard it as Kinesis does (the parents close and keep
      their records, the children take new ones, ListShards names the parents).
    * The shard map a processor gets (:meth:`shard_map`) may be stale, as the real one is (cached for
      minutes): with ``map_max_age_ms`` set it is a snapshot refreshed when older than that on the fake
      clock, or by :meth:`refresh_map`.
    * Retention: records older than ``retention_ms[stream]`` (default 24 h) can no longer be read.
    * Reads page: ``read_page`` records a GetRecords page (0: one page a shard), each page advancing
      the clock by ``page_ms`` and calling ``on_read_page`` (a test's hook: a rival takes over mid-read).
    * Validation as Kinesis does it: a request with a partition key that is empty or longer than 256
      characters, or with a record larger than the stream's ``max_record_bytes``, is refused whole
      (``ValidationException``).
    * ``fault(stream, entries)`` returns which entries land and an optional exception to raise after
      landing them: per-entry throttling (entries that do not land get
      ``ProvisionedThroughputExceededException``), an ambiguous put (``AmbiguousPutError`` after a
      subset landed), a crash mid-put; ``after_put``, if set, runs once after the landed entries are
      stored and before that exception (a reshard while a put is ambiguous).
    * Staging: :meth:`add_staging` keeps records a processor can read back (:meth:`read_source`).
    * Record distribution: a stream in ``auto`` ignores partition keys, as Kinesis' ``AUTO`` strategy does:
      each landed entry goes to an open shard drawn by ``scatter`` (default: round robin);
      ``auto_until[stream]``, if set, is when the stream is switched back (on the fake clock);
      :meth:`settings` reports the strategy and the record limit as DescribeStreamSummary would.
    * Layout: :meth:`set_ranges` gives a stream shards of chosen hash key ranges instead of even ones.
    """

    def __init__(
        self,
        clock: FakeClock | None = None,
        shard_counts: dict[str, int] | None = None,
        *,
        retention_ms: dict[str, int] | None = None,
        max_record_bytes: dict[str, int] | None = None,
    ) -> None:
        self.records: dict[str, list[tuple[str, bytes, int, int]]] = {}  # (pk, data, arrival, shard number)
        self.shard_parents: dict[str, list[str]] = {}
        self.shard_counts = dict(shard_counts or {})
        self.retention_ms = dict(retention_ms or {})
        self.max_record_bytes = dict(max_record_bytes or {})
        self.fault: PutFault = _all_land
        self.clock = clock or FakeClock()
        self.put_calls = 0
        self.reads: list[Found] = []
        self.map_max_age_ms: int | None = None
        self.read_page = 0
        self.page_ms = 0
        self.on_read_page: Callable[[], None] | None = None
        self.after_put: Callable[[], None] | None = None  # once, after a request's entries landed
        self.unlisted: set[str] = set()  # shards ListShards no longer lists (expired with the retention)
        self._listed: dict[str, list[dict[str, Any]]] = {}
        self._maps: dict[str, tuple[int, ShardMap]] = {}
        self._staging: dict[str, list[SourceRecord]] = {}
        self.auto: set[str] = set()  # streams with RecordDistributionStrategy = AUTO
        self.auto_until: dict[str, int] = {}  # stream -> when it goes back to USER_PARTITION_KEY
        self._turn = 0
        self.scatter: Callable[[int], int] = self._round_robin  # open shards -> the index of the one to take

    def _round_robin(self, n: int) -> int:
        self._turn += 1
        return self._turn % n

    def settings(self, stream: str, refresh: bool = False) -> StreamSettings:
        """What DescribeStreamSummary says of the stream."""
        if stream in self.auto_until and self.clock.now_ms() >= self.auto_until[stream]:
            self.auto.discard(stream)
            del self.auto_until[stream]
        return StreamSettings(
            name=stream,
            retention_ms=self._kept_ms(stream),
            max_record_bytes=self.max_record_bytes.get(stream, MAX_RECORD_BYTES),
            distribution=AUTO if stream in self.auto else PARTITION_KEY,
            open_shards=len(self.current_map(stream).ranges),
        )

    # -- shards -----------------------------------------------------------------------------------

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """ListShards: every shard of the stream, open and closed."""
        if stream not in self._listed:
            self._listed[stream] = even_shards(self.shard_counts.get(stream, 1))
        return self._listed[stream]

    def set_ranges(self, stream: str, starts: Sequence[int]) -> None:
        """The stream's shards start at these hash keys (the first 0): set before anything reads the stream."""
        self._listed[stream] = shards_from(starts)

    def current_map(self, stream: str) -> ShardMap:
        """The open shards now (what a fresh ListShards says)."""
        return ShardMap.of(self.shards(stream))

    def shard_map(self, stream: str) -> ShardMap:
        now = self.clock.now_ms()
        cached = self._maps.get(stream)
        if self.map_max_age_ms is None:
            return self.current_map(stream)
        if cached is None or now - cached[0] > self.map_max_age_ms:
            cached = (now, self.current_map(stream))
            self._maps[stream] = cached
        return cached[1]

    def refresh_map(self, stream: str) -> None:
        """The processor's cached shard map is refreshed now (as after its maximum age)."""
        self._maps[stream] = (self.clock.now_ms(), self.current_map(stream))

    def _new_shard(self, stream: str, low: int, high: int, parents: list[str]) -> dict[str, Any]:
        listed = self.shards(stream)
        number = max(shard_number(s["ShardId"]) for s in listed) + 1
        shard: dict[str, Any] = {
            "ShardId": shard_id_of(number),
            "HashKeyRange": {"StartingHashKey": str(low), "EndingHashKey": str(high)},
            "SequenceNumberRange": {"StartingSequenceNumber": "0"},
            "ParentShardId": parents[0],
        }
        if len(parents) > 1:
            shard["AdjacentParentShardId"] = parents[1]
        listed.append(shard)
        self.shard_parents[shard["ShardId"]] = list(parents)
        return shard

    def _open(self, stream: str, shard_id: str) -> dict[str, Any]:
        for shard in self.shards(stream):
            if shard["ShardId"] == shard_id and "EndingSequenceNumber" not in shard["SequenceNumberRange"]:
                return shard
        raise ValueError(f"{shard_id} is not an open shard of {stream}")

    def split(self, stream: str, shard_id: str) -> list[str]:
        """SplitShard at the middle of the shard's range: the parent closes, two children open."""
        parent = self._open(stream, shard_id)
        low, high = int(parent["HashKeyRange"]["StartingHashKey"]), int(parent["HashKeyRange"]["EndingHashKey"])
        middle = (low + high) // 2
        parent["SequenceNumberRange"]["EndingSequenceNumber"] = "1"
        return [
            self._new_shard(stream, low, middle, [shard_id])["ShardId"],
            self._new_shard(stream, middle + 1, high, [shard_id])["ShardId"],
        ]

    def merge(self, stream: str, shard_id: str, adjacent_id: str) -> str:
        """MergeShards of two adjacent open shards: both close, one child covers both ranges."""
        a, b = self._open(stream, shard_id), self._open(stream, adjacent_id)
        ranges = [int(s["HashKeyRange"][k]) for s in (a, b) for k in ("StartingHashKey", "EndingHashKey")]
        for shard in (a, b):
            shard["SequenceNumberRange"]["EndingSequenceNumber"] = "1"
        return str(self._new_shard(stream, min(ranges), max(ranges), [shard_id, adjacent_id])["ShardId"])

    def adjacent_open_pairs(self, stream: str) -> list[tuple[str, str]]:
        """Pairs of open shards whose hash key ranges touch (what MergeShards accepts)."""
        ranges = self.current_map(stream).ranges
        return [
            (ranges[i][2], ranges[i + 1][2]) for i in range(len(ranges) - 1) if ranges[i][1] + 1 == ranges[i + 1][0]
        ]

    def parents(self, stream: str, shard_id: str, ancestor: bool = False) -> list[str]:
        """As ListShards tells: a shard in ``unlisted`` has expired (an ancestor: no parents; the processor's
        own shard: not listed yet, a transient error)."""
        if shard_id in self.unlisted:
            if ancestor:
                return []
            raise TransientAwsError("ListShards", "ShardNotListed", f"{shard_id} is not listed in {stream} yet")
        return list(self.shard_parents.get(shard_id, []))

    def retention(self, stream: str) -> int | None:
        """The stream's retention in milliseconds (DescribeStreamSummary)."""
        return self._kept_ms(stream)

    def _kept_ms(self, stream: str) -> int:
        return self.retention_ms.get(stream, 24 * 3_600_000)

    # -- puts ---------------------------------------------------------------------------------------

    def _validate(self, stream: str, pairs: list[tuple[str, bytes]]) -> None:
        limit = self.max_record_bytes.get(stream, MAX_RECORD_BYTES)
        for pk, data in pairs:
            if not 1 <= len(pk) <= MAX_PARTITION_KEY_CHARS:
                raise FatalAwsError("PutRecords", "ValidationException", f"partition key of {len(pk)} characters")
            if record_size(pk, data) > limit:
                raise FatalAwsError("PutRecords", "ValidationException", f"record over {limit} bytes")

    def put_records(
        self, stream: str, entries: Sequence[tuple[str, bytes] | tuple[str, bytes, str | None]]
    ) -> list[str | None]:
        self.put_calls += 1
        pairs = [(entry[0], entry[1]) for entry in entries]
        self._validate(stream, pairs)
        land, error = self.fault(stream, pairs)
        routes = self.current_map(stream)
        out: list[str | None] = []
        for (pk, data), ok in zip(pairs, land, strict=True):
            if ok:
                if stream in self.auto:
                    shard = shard_number(routes.ranges[self.scatter(len(routes.ranges))][2])
                else:
                    shard = shard_number(routes.shard_for(pk) or routes.ranges[0][2])
                self.records.setdefault(stream, []).append((pk, data, self.clock.now_ms(), shard))
            out.append(None if ok else "ProvisionedThroughputExceededException")
        hook, self.after_put = self.after_put, None
        if hook is not None:
            hook()
        if error is not None:
            raise error
        return out

    # -- reads --------------------------------------------------------------------------------------

    def read_identities(
        self,
        stream: str,
        shards: Collection[int] | None,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
        keep_alive: Callable[[], None] | None = None,
    ) -> Found:
        listed = self.shards(stream)
        if shards is None:
            wanted = {s["ShardId"] for s in listed}
        else:
            wanted = descendants(listed, {shard_id_of(n) for n in shards})
        found = Found(shards_read=len(wanted))
        oldest = self.clock.now_ms() - self._kept_ms(stream)
        for shard_id in sorted(wanted):
            number = shard_number(shard_id)
            page = 0
            for pk, data, at, shard in list(self.records.get(stream, [])):
                if shard != number or at < since_ms or at < oldest:
                    continue
                found.records_read += 1
                if until_ms is not None and at > until_ms:
                    break
                found.identities[identity(pk, data)] += 1
                page += 1
                if self.read_page and page >= self.read_page:
                    page = 0
                    self._next_page(keep_alive)
            self._next_page(keep_alive)
        self.reads.append(found)
        return found

    def _next_page(self, keep_alive: Callable[[], None] | None) -> None:
        self.clock.advance(self.page_ms)
        if self.on_read_page is not None:
            self.on_read_page()
        if keep_alive is not None:
            keep_alive()

    def data(self, stream: str) -> list[bytes]:
        return [data for _, data, _, _ in self.records.get(stream, [])]

    # -- staging ------------------------------------------------------------------------------------

    def add_staging(self, shard_id: str, records: Sequence[SourceRecord]) -> None:
        """Records written to a staging shard, readable back by :meth:`read_source` within retention."""
        self._staging.setdefault(shard_id, []).extend(records)

    def set_staging(self, shard_id: str, records: Sequence[SourceRecord]) -> None:
        """The staging shard holds these records instead (a test rewrote some)."""
        self._staging[shard_id] = list(records)

    def read_source(self, stream: str, shard_id: str, first: Position, last: Position) -> Iterator[list[SourceRecord]]:
        """The staging shard's records from ``first`` to ``last`` (both included), still within retention."""
        oldest = self.clock.now_ms() - self._kept_ms(stream)
        wanted = [r for r in self._staging.get(shard_id, []) if first <= r.position <= last and r.arrival_ms >= oldest]
        for i in range(0, len(wanted), self.read_page or len(wanted) or 1):
            yield wanted[i : i + (self.read_page or len(wanted))]


# --- fault injection for the Spark staging writer ---------------------------------------------

# PutRecords calls seen by FlakyKinesis in this process, per key. Spark runs tasks in several Python
# worker processes and reuses them between jobs, so the schedule is per process and keyed by test.
_FLAKY_CALLS: Counter[str] = Counter()


class FlakyKinesis:
    """A Kinesis client that makes chosen PutRecords entries fail, around a real boto3 client.

    moto never throttles, so this is how tests reach the writer's retry path.
    Per process and ``key``: the first ``request_failures`` PutRecords calls
    fail as a whole (a 503 ``ServiceUnavailable``, nothing sent); the next
    ``fail_calls`` calls fail the entries at positions 0, ``every``, 2 *
    ``every``, ... with ``error_codes`` in turn (those entries are not sent,
    as Kinesis does not store failed entries); later calls pass through.
    With ``log_path``, every call appends a JSON line (pid, call number,
    entries, injected failures by code) so a test can count calls across
    Spark's worker processes. Picklable: the real client is built lazily from
    the writer settings, in the process that uses it.
    """

    def __init__(
        self,
        settings: Any,
        *,
        key: str = "default",
        fail_calls: int = 3,
        every: int = 2,
        error_codes: Sequence[str] = ("ProvisionedThroughputExceededException", "InternalFailure"),
        request_failures: int = 0,
        log_path: str | None = None,
    ) -> None:
        if every < 1 or not error_codes:
            raise ValueError("every must be >= 1 and error_codes non-empty")
        self.settings = settings
        self.key = key
        self.fail_calls = fail_calls
        self.every = every
        self.error_codes = tuple(error_codes)
        self.request_failures = request_failures
        self.log_path = log_path
        self._real: Any = None

    @property
    def client(self) -> Any:
        if self._real is None:
            from copier.spark import default_client

            self._real = default_client(self.settings)
        return self._real

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_real": None}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.client, name)  # list_shards, get_records, ...: the real client's

    def _log(self, **line: Any) -> None:
        if self.log_path is not None:
            import json
            import os

            with open(self.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"pid": os.getpid(), "key": self.key, **line}) + "\n")

    def put_records(self, *, StreamName: str, Records: list[dict[str, Any]], **kwargs: Any) -> dict[str, Any]:  # noqa: N803
        call = _FLAKY_CALLS[self.key]
        _FLAKY_CALLS[self.key] += 1
        if call < self.request_failures:
            import botocore.exceptions

            self._log(call=call, entries=len(Records), injected={"ServiceUnavailable": len(Records)}, request=True)
            raise botocore.exceptions.ClientError(
                {
                    "Error": {"Code": "ServiceUnavailable", "Message": "injected by FlakyKinesis"},
                    "ResponseMetadata": {"HTTPStatusCode": 503},
                },
                "PutRecords",
            )
        failed: dict[int, str] = {}
        if call < self.request_failures + self.fail_calls:
            codes = self.error_codes
            failed = {i: codes[n % len(codes)] for n, i in enumerate(range(0, len(Records), self.every))}
        send = [r for i, r in enumerate(Records) if i not in failed]
        answer = self.client.put_records(StreamName=StreamName, Records=send, **kwargs) if send else {"Records": []}
        landed = iter(answer["Records"])
        results = [
            {"ErrorCode": failed[i], "ErrorMessage": "injected by FlakyKinesis"} if i in failed else next(landed)
            for i in range(len(Records))
        ]
        self._log(call=call, entries=len(Records), injected=dict(Counter(failed.values())), request=False)
        return {"FailedRecordCount": sum(1 for r in results if r.get("ErrorCode")), "Records": results}


def flaky_kinesis(settings: Any, **options: Any) -> FlakyKinesis:
    """A ``WriterSettings.client_factory``: ``functools.partial(flaky_kinesis, key=..., fail_calls=...)``."""
    return FlakyKinesis(settings, **options)


def read_flaky_log(path: str) -> list[dict[str, Any]]:
    """The calls FlakyKinesis logged to ``path``, in every process."""
    import json

    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
