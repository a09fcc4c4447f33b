"""Whole Kinesis streams read from TRIM_HORIZON, page by page, within the Kinesis read limits.

Read-only and safe against production: it lists shards and reads them with
GetShardIterator and GetRecords (at most 5 calls and 2 MiB per second per
shard, and nothing for 5 s after a page of 10 MiB: ``copier.core.limits.read_pause_s``;
a reader that called sooner would be throttled, and each throttle uses a
retry of its budget), shards in parallel and parents before children, each shard in sequence
order, and writes nothing to AWS. A full read of a large stream takes a
while, so progress goes to stderr (``copier.adapters.progress``: a bar on a
terminal, a line every few seconds in a log), and with a directory of shard
files (``copier.adapters.shardfiles``) what was read is kept page by page:
a read interrupted goes on, when run again, after the last page kept.

``copier verify`` reads staging, target and dead-letter streams with it;
``copier export``, the chaos suite's check and the benchmarks share it.
This is an adapter module: every botocore error leaves it as a copier error
(``copier.adapters.aws.convert_aws_error``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import botocore.config
import botocore.exceptions

from copier.adapters.aws import convert_aws_error
from copier.adapters.kinesis import paged_shards
from copier.adapters.progress import PROGRESS_INTERVAL_S, Progress
from copier.adapters.sessions import host_session
from copier.adapters.shardfiles import ShardFiles, record_line, record_of
from copier.adapters.target import target_session
from copier.core.config import Config
from copier.core.errors import AwsError
from copier.core.limits import read_pause_s, record_size
from copier.core.retry import backoff_ms

__all__ = [
    "GET_RECORDS_INTERVAL_S",
    "GET_RECORDS_LIMIT",
    "MAX_ATTEMPTS",
    "MAX_BACKOFF_MS",
    "PROGRESS_INTERVAL_S",
    "READ_WORKERS",
    "KinesisRecord",
    "Progress",
    "StreamReader",
    "lineage_order",
    "make_client",
]

T = TypeVar("T")
KinesisRecord = dict[str, Any]

GET_RECORDS_INTERVAL_S = 0.2  # Kinesis allows 5 GetRecords per second per shard (longer after a large page)
GET_RECORDS_LIMIT = 10_000
MAX_ATTEMPTS = 10
MAX_BACKOFF_MS = 10_000
READ_WORKERS = 8
_EXPIRED = "ExpiredIteratorException"


def lineage_order(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shards with every parent before its children, otherwise in ListShards order.

    Records of one partition key move from a parent to a child at a split or
    merge; reading parents first keeps their production order intact.
    """
    by_id = {s["ShardId"]: s for s in shards}
    ordered: list[dict[str, Any]] = []
    placed: set[str] = set()

    def place(shard: dict[str, Any]) -> None:
        if shard["ShardId"] in placed:
            return
        placed.add(shard["ShardId"])
        for parent in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")):
            if parent in by_id:
                place(by_id[parent])
        ordered.append(shard)

    for shard in shards:
        place(shard)
    return ordered


def make_client(config: Config, target: bool = False) -> Any:
    """A Kinesis client for reads of staging, or of the target side (target and dead-letter streams).

    botocore may retry reads itself: a read cannot duplicate anything. The
    target side is read in its own region and, if one is configured, as the
    role copier assumes to reach it.
    """
    session = target_session(config) if target else host_session()
    return session.create_client(
        "kinesis",
        region_name=config.target_region if target else config.region,
        endpoint_url=config.target_endpoint if target else config.kinesis_endpoint,
        config=botocore.config.Config(retries={"mode": "standard"}, connect_timeout=5, read_timeout=30),
    )


class StreamReader:
    """Reads whole streams within the Kinesis read limits, shards in parallel, each in order.

    Every botocore error leaves as a CopierError: transient ones (throttling,
    5xx) are retried with jittered backoff up to ``max_attempts`` times, fatal
    ones (missing stream, denied access) at once.
    """

    def __init__(
        self,
        client: Any,
        progress: Progress,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        workers: int = READ_WORKERS,
        max_attempts: int = MAX_ATTEMPTS,
        max_backoff_ms: int = MAX_BACKOFF_MS,
        page_records: int = GET_RECORDS_LIMIT,
        files: ShardFiles | None = None,
    ) -> None:
        """``files``: keep what :meth:`read` reads there, and read on from what an earlier run kept."""
        self._client = client
        self._files = files
        self._page_records = page_records
        self._progress = progress
        self._sleep = sleep
        self._clock = clock
        self._workers = workers
        self._max_attempts = max_attempts
        self._max_backoff_ms = max_backoff_ms
        self._stop = threading.Event()
        self._reached = False  # a call has been answered: later connection errors are retried as transient
        # (stream, shard ID) of each shard whose read ended at a null NextShardIterator: AWS's sign that a closed
        # shard was read to its end (its EndingSequenceNumber need not be its last record's number)
        self.closed_ends: set[tuple[str, str]] = set()

    @property
    def progress(self) -> Progress:
        """Where this reader says how far it is (a caller reading pages itself says the rest there)."""
        return self._progress

    def _call(self, operation: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """One API call, retried while its error is transient (an expired iterator is the caller's)."""
        attempt = 0
        while True:
            try:
                answer = fn(**kwargs)
                self._reached = True
                return answer
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                error = convert_aws_error(operation, exc)
                attempt += 1
                if not self._reached and isinstance(exc, botocore.exceptions.EndpointConnectionError):
                    raise error from exc  # nothing answers there at all (botocore tried already): say so now
                if not error.retryable or error.code == _EXPIRED or attempt >= self._max_attempts:
                    raise error from exc
                self._sleep(backoff_ms(attempt, self._max_backoff_ms) / 1000)

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """Every shard of the stream (open, and closed within retention), parents first."""
        listed = paged_shards(lambda **kw: self._call("ListShards", self._client.list_shards, **kw), stream)
        return lineage_order(listed)

    def _iterator(self, stream: str, shard_id: str, after: str | None, since_ms: int | None = None) -> str | None:
        """An iterator at the shard's start (or at ``since_ms``), or just after the last record read (when one
        expired)."""
        kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id}
        if after is None and since_ms is not None:
            kwargs.update(ShardIteratorType="AT_TIMESTAMP", Timestamp=since_ms / 1000)
        elif after is None:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"
        else:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=after)
        answer = self._call("GetShardIterator", self._client.get_shard_iterator, **kwargs)
        iterator: str | None = answer.get("ShardIterator")
        return iterator

    def pages(
        self,
        stream: str,
        shard_id: str,
        after: str | None = None,
        label: str | None = None,
        since_ms: int | None = None,
    ) -> Iterator[list[KinesisRecord]]:
        """The shard's records page by page, from TRIM_HORIZON (or after the sequence number ``after``, or those
        that arrived from ``since_ms`` on) to its end; with ``label``, each page's MillisBehindLatest goes to the
        progress of that stream.

        A closed shard ends when NextShardIterator is null; any shard ends at
        an empty page with MillisBehindLatest 0, which is the end of an open
        shard (and of a closed parent on backends that never null its iterator).
        """
        iterator = self._iterator(stream, shard_id, after, since_ms)
        last_sequence = after
        previous_call, pause = float("-inf"), GET_RECORDS_INTERVAL_S
        while iterator and not self._stop.is_set():
            self._sleep(max(0.0, previous_call + pause - self._clock()))
            previous_call = self._clock()
            try:
                page = self._call(
                    "GetRecords", self._client.get_records, ShardIterator=iterator, Limit=self._page_records
                )
            except AwsError as exc:
                if exc.code != _EXPIRED:
                    raise
                iterator = self._iterator(stream, shard_id, last_sequence, since_ms)
                continue
            records: list[KinesisRecord] = page.get("Records", [])
            pause = read_pause_s(sum(record_size(r.get("PartitionKey", ""), r["Data"]) for r in records))
            if label is not None:
                self._progress.behind(label, shard_id, page.get("MillisBehindLatest"))
            if records:
                last_sequence = records[-1]["SequenceNumber"]
                yield records
            iterator = page.get("NextShardIterator")
            if iterator is None:
                self.closed_ends.add((stream, shard_id))
            if not records and page.get("MillisBehindLatest") == 0:
                return

    def _read_shard(
        self,
        stream: str,
        label: str,
        shard: dict[str, Any],
        convert: Callable[[str, KinesisRecord], T],
        on_page: Callable[[str], None] | None = None,
    ) -> list[T]:
        """One shard's records, converted: those kept by an earlier run first (with ``files``), then the rest
        read after them, each page kept as it comes. A closed shard read to its end is marked ended (an open
        one is read on from where it was, the next time: it may have records since)."""
        shard_id = shard["ShardId"]
        out: list[T] = []
        after: str | None = None
        files, name = self._files, f"{label}-{shard_id}"
        if files is not None:
            mark = files.open(name)
            out.extend(convert(shard_id, record_of(line)) for line in files.lines(name))
            self._progress.records(label, mark.lines)
            after = mark.last
            if mark.ended:
                self._progress.shard_done(label, shard_id)
                return out
        for records in self.pages(stream, shard_id, after, label):
            if on_page is not None:
                on_page(shard_id)
            out.extend(convert(shard_id, r) for r in records)
            if files is not None:
                files.append(name, [record_line(shard_id, r) for r in records], records[-1]["SequenceNumber"])
            self._progress.records(label, len(records))
        if files is not None and not self._stop.is_set():
            files.append(name, [], None, ended="EndingSequenceNumber" in shard.get("SequenceNumberRange", {}))
        self._progress.shard_done(label, shard_id)
        return out

    def read(
        self,
        stream: str,
        label: str,
        convert: Callable[[str, KinesisRecord], T],
        on_page: Callable[[str], None] | None = None,
    ) -> list[T]:
        """Every record of the stream, converted, shard by shard in lineage order, each in sequence order
        (``on_page``: told the shard of each page that held records, from the reading threads)."""
        shards = self.shards(stream)
        self._progress.start(label, len(shards))
        if not shards:
            return []
        self._stop.clear()
        with ThreadPoolExecutor(max_workers=min(self._workers, len(shards))) as pool:
            futures: list[Future[list[T]]] = [
                pool.submit(self._read_shard, stream, label, s, convert, on_page) for s in shards
            ]
            try:
                return [record for future in futures for record in future.result()]
            finally:
                self._stop.set()  # on an error, the other shards' reads end at their next page
                for future in futures:
                    future.cancel()
