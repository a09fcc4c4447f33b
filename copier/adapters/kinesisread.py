"""Kinesis reads: a staging range read again as the daemon delivers it, and the bounded reads of a verification.

A staging range is read from a position (a fenced processor's dropped backlog)
or from a time (what arrived before a new application's start).

Both read at most 5 GetRecords a second per shard, the Kinesis read limit,
which a stream's consumers share. ``copier.adapters.kinesis.KinesisStreams`` lists the
shards and hands them over with each call.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any

from copier.core.errors import AwsError, TransientAwsError
from copier.core.health import Waiting
from copier.core.kpl import as_daemon_delivers
from copier.core.plan import SourceRecord
from copier.core.ports import Found, Identity
from copier.core.positions import Position
from copier.core.shardmap import descendants, shard_id_of

__all__ = ["ARRIVALS_INTERVAL_S", "FIRST_PAGE", "GET_RECORDS_LIMIT", "KinesisReads"]

GET_RECORDS_LIMIT = 10_000
FIRST_PAGE = 500
ARRIVALS_INTERVAL_S = 1.0  # read_arrivals' pace: one of the shard's 5 GetRecords a second
PAGE_RETRIES = 30  # a staging page refused (throttled) this many times in a row, a second apart, goes up
WAITING_READS = 3  # GetRecords of one record a look at a shard's first record not forwarded may take


class KinesisReads:
    """GetRecords loops over a staging client and a target-side read client; ``calling(operation, fn, **kw)``
    converts botocore errors (``copier.adapters.aws``)."""

    def __init__(self, calling: Callable[..., Any], staging: Any, read: Any, sleep: Callable[[float], None]) -> None:
        self._calling = calling
        self._staging = staging
        self._read = read
        self._sleep = sleep

    def read_source(
        self, stream: str, listed: list[dict[str, Any]], shard_id: str, first: Position, last: Position
    ) -> Iterator[list[SourceRecord]]:
        """A staging shard's records from ``first`` to ``last`` (both included), as the daemon delivers them.

        For a fenced processor that dropped what it held (``copier.shard``):
        read AT_SEQUENCE_NUMBER ``first``, KPL aggregates de-aggregated as the
        KCL does (``copier.core.kpl.as_daemon_delivers``, with the shard's hash key
        range), positions outside the range left out, at most 5 GetRecords a
        second. Records the stream's retention removed are not there.
        """
        at = {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": first.seq_str}
        return self._source_pages(
            stream, listed, shard_id, at, lambda seq, arrival: seq > last.seq, lambda p: first <= p <= last, None
        )

    def read_arrivals(
        self,
        stream: str,
        listed: list[dict[str, Any]],
        shard_id: str,
        since_ms: int,
        until_ms: int,
        keep_alive: Callable[[], None] | None = None,
    ) -> Iterator[list[SourceRecord]]:
        """A staging shard's records as the daemon delivers them, from AT_TIMESTAMP ``since_ms`` up to (without)
        the first record that arrived at or after ``until_ms``: what arrived before a new application's start
        (``copier.shard.prestart``). At most one GetRecords a second (``ARRIVALS_INTERVAL_S``: the shard's 5 a
        second are shared with the daemons reading it), pages of ``FIRST_PAGE`` records doubling (a shard whose
        first record is past ``until_ms`` costs one small page)."""
        at = {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": since_ms / 1000}
        return self._source_pages(
            stream,
            listed,
            shard_id,
            at,
            lambda seq, arrival: arrival >= until_ms,
            lambda p: True,
            keep_alive,
            FIRST_PAGE,
            ARRIVALS_INTERVAL_S,
        )

    def _source_pages(
        self,
        stream: str,
        listed: list[dict[str, Any]],
        shard_id: str,
        at: dict[str, Any],
        past: Callable[[int, int], bool],
        wanted: Callable[[Position], bool],
        keep_alive: Callable[[], None] | None,
        first_page: int = GET_RECORDS_LIMIT,
        interval_s: float = 0.2,
    ) -> Iterator[list[SourceRecord]]:
        """A staging shard's records from the iterator ``at`` until the first Kinesis record that is ``past``
        (its sequence number and arrival), de-aggregated as the daemon delivers them, ``wanted`` positions only."""
        shard = next((s for s in listed if s["ShardId"] == shard_id), None)
        if shard is None:
            raise TransientAwsError("ListShards", "ShardNotListed", f"{shard_id} is not listed in {stream} yet")
        hash_range = (int(shard["HashKeyRange"]["StartingHashKey"]), int(shard["HashKeyRange"]["EndingHashKey"]))

        def iterator_at(after: str | None) -> str | None:
            """At ``at``, or just after the last record read (an iterator expires after 5 minutes)."""
            where = (
                at if after is None else {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": after}
            )
            answer = self._calling(
                "GetShardIterator", self._staging.get_shard_iterator, StreamName=stream, ShardId=shard_id, **where
            )
            return answer.get("ShardIterator")  # type: ignore[no-any-return]

        last: str | None = None
        iterator = iterator_at(last)
        limit = first_page
        waited = 0
        while iterator:
            if keep_alive is not None:
                keep_alive()
            try:
                page = self._calling("GetRecords", self._staging.get_records, ShardIterator=iterator, Limit=limit)
            except AwsError as exc:  # the shard's read limits are shared: throttling is waited out here, a while
                if exc.code == "ExpiredIteratorException":
                    iterator = iterator_at(last)
                    continue
                waited += 1
                if not exc.retryable or waited > PAGE_RETRIES:
                    raise  # the caller's retrying says so, and reads again
                self._sleep(max(interval_s, 1.0))
                continue
            waited = 0
            out: list[SourceRecord] = []
            for record in page.get("Records", []):
                seq = int(record["SequenceNumber"])
                last = record["SequenceNumber"]
                arrival = _arrival_ms(record)
                if past(seq, arrival):
                    if out:
                        yield out
                    return
                view = as_daemon_delivers(bytes(record["Data"]), record["PartitionKey"], hash_range)
                for subseq, (key, data) in enumerate(view.records):
                    position = Position(seq, subseq if view.aggregated else 0)
                    if wanted(position):
                        out.append(SourceRecord(position, key, data, arrival))
            if out:
                yield out
            iterator = page.get("NextShardIterator")
            if not page.get("Records") and page.get("MillisBehindLatest", 0) == 0:
                return
            limit = min(GET_RECORDS_LIMIT, limit * 2)
            if iterator:
                self._sleep(interval_s)  # at most 5 GetRecords a second a shard, shared with its other readers

    def read_identities(
        self,
        stream: str,
        listed: list[dict[str, Any]],
        shards: Collection[int] | None,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
        keep_alive: Callable[[], None] | None = None,
    ) -> Found:
        """Count record identities in the given shards (and their descendants) over a time range.

        Used to verify a put whose outcome is unknown: once the put has
        finished or timed out, what the stream holds of it is all that ever
        will. Each shard is read from ``since_ms`` (GetShardIterator
        AT_TIMESTAMP) until a record arrived after ``until_ms``, or to the end;
        pages start small and double, so a read past the bound reads at most
        one page too many; and at most 5 GetRecords a second per shard, the
        Kinesis read limit, which the target's consumers share. ``keep_alive``
        runs before every page (the caller keeps its lease through a long read).
        """
        if shards is None:
            wanted = {s["ShardId"] for s in listed}
        else:
            wanted = descendants(listed, {shard_id_of(n) for n in shards})
        found = Found()
        for shard in listed:
            if shard["ShardId"] in wanted:
                found.shards_read += 1
                self._read_shard(stream, shard["ShardId"], since_ms, until_ms, identity, found, keep_alive)
        return found

    def waiting(self, stream: str, shard_id: str, start: dict[str, Any]) -> Waiting:
        """The first record of a staging shard from ``start`` (GetShardIterator's arguments), for ``copier
        status``: one GetShardIterator and GetRecords of one record, up to ``WAITING_READS`` of them (a
        GetRecords may answer no record although later ones exist: ``MillisBehindLatest`` above 0 says so).
        Never more than one record (at most the stream's record size) from the shard's 2 MiB/s."""
        iterator: str | None = self._calling(
            "GetShardIterator", self._staging.get_shard_iterator, StreamName=stream, ShardId=shard_id, **start
        ).get("ShardIterator")
        behind = None
        for _ in range(WAITING_READS):
            if not iterator:
                return Waiting(millis_behind=behind)  # a closed shard read to its end
            page = self._calling("GetRecords", self._staging.get_records, ShardIterator=iterator, Limit=1)
            behind = page.get("MillisBehindLatest")
            records = page.get("Records", [])
            if records:
                return Waiting(_arrival_ms(records[0]), behind)
            if not behind:
                return Waiting(millis_behind=behind)
            iterator = page.get("NextShardIterator")
        return Waiting(millis_behind=behind, more=True)

    def _iterator(self, stream: str, shard_id: str, since_ms: int, after: str | None) -> str | None:
        """An iterator at ``since_ms``, or just after the last record read (when one expired)."""
        kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id}
        if after is None:
            kwargs.update(ShardIteratorType="AT_TIMESTAMP", Timestamp=since_ms / 1000)
        else:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=after)
        iterator: str | None = self._calling("GetShardIterator", self._read.get_shard_iterator, **kwargs).get(
            "ShardIterator"
        )
        return iterator

    def _read_shard(
        self,
        stream: str,
        shard_id: str,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
        found: Found,
        keep_alive: Callable[[], None] | None,
    ) -> None:
        last: str | None = None
        iterator = self._iterator(stream, shard_id, since_ms, last)
        limit = FIRST_PAGE
        while iterator:
            if keep_alive is not None:
                keep_alive()
            try:
                page = self._calling("GetRecords", self._read.get_records, ShardIterator=iterator, Limit=limit)
            except AwsError as exc:
                if exc.code == "ExpiredIteratorException":
                    iterator = self._iterator(stream, shard_id, since_ms, last)
                    continue
                if exc.retryable:
                    self._sleep(0.5)
                    continue
                raise
            records = page.get("Records", [])
            found.records_read += len(records)
            for record in records:
                if until_ms is not None and _arrival_ms(record) > until_ms:
                    return
                found.identities[identity(record["PartitionKey"], bytes(record["Data"]))] += 1
                last = record["SequenceNumber"]
            iterator = page.get("NextShardIterator")
            if not records and page.get("MillisBehindLatest", 0) == 0:
                return
            limit = min(GET_RECORDS_LIMIT, limit * 2)
            self._sleep(0.2)  # 5 GetRecords per second per shard


def _arrival_ms(record: dict[str, Any]) -> int:
    """A record's ApproximateArrivalTimestamp in epoch milliseconds (botocore parses it to a datetime)."""
    stamp = record["ApproximateArrivalTimestamp"]
    return int(stamp.timestamp() * 1000) if hasattr(stamp, "timestamp") else int(float(stamp) * 1000)
