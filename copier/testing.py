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

from copier.errors import FencedError
from copier.ports import Found, Identity
from copier.shardmap import ShardMap, shard_id_of, shard_number
from copier.state import DigestBatch, ShardState, StateConflict, StateStore

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
    """A StateStore in a dict, with DynamoDB's conditional-write semantics; counts writes."""

    def __init__(self) -> None:
        self._items: dict[str, ShardState] = {}
        self._batches: dict[str, dict[int, DigestBatch]] = {}
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
            stored = self._batches.setdefault(key, {})
            existing = stored.get(batch.index)
            if existing is not None and existing.epoch > batch.epoch:
                raise FencedError(f"{key}: {batch.key} was written under an epoch above {batch.epoch}")
            stored[batch.index] = batch

    def get_batch(self, key: str, index: int) -> DigestBatch | None:
        with self._lock:
            return self._batches.get(key, {}).get(index)

    def batches(self, key: str, upto: int, page_size: int | None = None) -> Iterator[DigestBatch]:
        with self._lock:
            found = sorted((b for i, b in self._batches.get(key, {}).items() if 1 <= i <= upto), key=lambda b: -b.index)
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
    return [
        {
            "ShardId": shard_id_of(n),
            "HashKeyRange": {
                "StartingHashKey": str(n * step),
                "EndingHashKey": str(2**128 - 1 if n == count - 1 else (n + 1) * step - 1),
            },
            "SequenceNumberRange": {"StartingSequenceNumber": "0"},
        }
        for n in range(count)
    ]


class InMemoryStreams:
    """Kinesis streams in lists, routed to shards by partition key, with a fault hook for what a backend cannot do.

    ``fault(stream, entries)`` returns which entries land and an optional
    exception to raise after landing them: per-entry throttling (entries that
    do not land get ``ProvisionedThroughputExceededException``), an ambiguous
    put (``AmbiguousPutError`` after a subset landed), a crash mid-put.
    Streams have one shard unless ``shard_counts`` says otherwise.
    """

    def __init__(self, clock: FakeClock | None = None, shard_counts: dict[str, int] | None = None) -> None:
        self.records: dict[str, list[tuple[str, bytes, int, int]]] = {}  # (pk, data, arrival, shard number)
        self.shard_parents: dict[str, list[str]] = {}
        self.shard_counts = dict(shard_counts or {})
        self.fault: PutFault = _all_land
        self.clock = clock or FakeClock()
        self.put_calls = 0
        self.reads: list[Found] = []

    def shard_map(self, stream: str) -> ShardMap:
        return ShardMap.of(even_shards(self.shard_counts.get(stream, 1)))

    def put_records(
        self, stream: str, entries: Sequence[tuple[str, bytes] | tuple[str, bytes, str | None]]
    ) -> list[str | None]:
        self.put_calls += 1
        pairs = [(entry[0], entry[1]) for entry in entries]
        land, error = self.fault(stream, pairs)
        routes = self.shard_map(stream)
        out: list[str | None] = []
        for (pk, data), ok in zip(pairs, land, strict=True):
            if ok:
                shard = shard_number(routes.shard_for(pk) or shard_id_of(0))
                self.records.setdefault(stream, []).append((pk, data, self.clock.now_ms(), shard))
            out.append(None if ok else "ProvisionedThroughputExceededException")
        if error is not None:
            raise error
        return out

    def read_identities(
        self,
        stream: str,
        shards: Collection[int] | None,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
    ) -> Found:
        found = Found(shards_read=self.shard_counts.get(stream, 1) if shards is None else len(shards))
        done: set[int] = set()  # shards read past until_ms: a reader stops at the first such record
        for pk, data, at, shard in self.records.get(stream, []):
            if (shards is None or shard in shards) and at >= since_ms and shard not in done:
                found.records_read += 1
                if until_ms is not None and at > until_ms:
                    done.add(shard)
                    continue
                found.identities[identity(pk, data)] += 1
        self.reads.append(found)
        return found

    def parents(self, stream: str, shard_id: str) -> list[str]:
        return list(self.shard_parents.get(shard_id, []))

    def data(self, stream: str) -> list[bytes]:
        return [data for _, data, _, _ in self.records.get(stream, [])]


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
