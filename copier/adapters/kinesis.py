"""Kinesis I/O: puts that never retry on their own, bounded reads for verification, shard lineage.

botocore retries a PutRecords by itself on a connection error or a 5xx,
re-sending a request whose first attempt may already have landed: that
turns an ambiguous put into a silent duplicate. The put client here makes
exactly one attempt; copier retries, knowing which failures are ambiguous:

* failed before the request was sent (cannot connect), or cut off at its
  deadline before its last byte was handed to the kernel: not ambiguous;
* per-entry ``ErrorCode`` in a PutRecords answer: those entries did not land;
* no answer by the deadline once the whole request was handed to the
  kernel (whether or not all of it left), a dropped
  connection, a 5xx answer, an answer that cannot be read: ambiguous, raised
  as :class:`~copier.core.errors.AmbiguousPutError` and verified by reading the stream.

Each put carries a deadline (``time.monotonic()``), taken by the forwarder
at its lease check plus ``copier.putTimeoutMillis``: its whole life, from the
credentials to the answer, fits before it (``copier.adapters.httpwire``; the
botocore path, taken where a proxy applies, as far as botocore allows:
``copier.adapters.botokinesis``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from copier.adapters.awserrors import naming_the_resource, place
from copier.adapters.awsjson import DECODING_ERRORS, CredentialSource, JsonClient, Unanswered, Unreadable
from copier.adapters.kinesisanswers import put_results
from copier.adapters.kinesisread import GET_RECORDS_LIMIT, KinesisReads
from copier.adapters.leankinesis import LeanKinesis
from copier.adapters.putbody import PutEntry, put_records_body
from copier.adapters.shardlistings import ShardListings
from copier.adapters.summaries import StreamSummaries
from copier.adapters.summaryboard import ApplicationAnswers
from copier.adapters.summaryshare import SummaryShare
from copier.core.clockcheck import ClockBounds
from copier.core.config import Config
from copier.core.errors import AmbiguousPutError, AwsError, FatalAwsError, TransientAwsError
from copier.core.health import Waiting
from copier.core.plan import SourceRecord
from copier.core.ports import Found, Identity
from copier.core.positions import Position
from copier.core.shardmap import ShardMap
from copier.core.streamsettings import StreamSettings

__all__ = ["GET_RECORDS_LIMIT", "KinesisStreams", "PutEntry", "paged_shards"]


HOUR_MS = 3_600_000


def _botocore_error(exc: BaseException) -> bool:
    """True for botocore's errors, without importing botocore: a lean process never loaded it, so none arose."""
    module = sys.modules.get("botocore.exceptions")
    return module is not None and isinstance(exc, (module.ClientError, module.BotoCoreError))


def paged_shards(list_shards: Callable[..., Any], stream: str) -> list[dict[str, Any]]:
    """Every shard of a stream, following ListShards' NextToken to the last page.

    ``list_shards`` is the ListShards call, already wrapped in whatever error
    handling the caller wants.
    """
    shards: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"StreamName": stream}
    while True:
        page = list_shards(**kwargs)
        shards.extend(page.get("Shards", []))
        token = page.get("NextToken")
        if not token:
            return shards
        kwargs = {"NextToken": token}  # ListShards rejects StreamName together with NextToken


class KinesisStreams:
    """The copier's Kinesis calls; every botocore or lean-client error leaves here as a CopierError.

    Every answer any of its clients receives feeds ``clock_bounds``, when
    given: this host's clock measured against AWS (``copier.core.clockcheck``).
    """

    def __init__(
        self,
        config: Config,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        clock_bounds: ClockBounds | None = None,
        lean: CredentialSource | None = None,
        share: SummaryShare | None = None,
        board: ApplicationAnswers | None = None,
    ) -> None:
        """``lean``: the lean path's credentials (``copier.adapters.awsauth``): every call through
        ``copier.adapters.awsjson``, botocore never imported; None: botocore's clients, and the lean client
        for the puts wherever no proxy is configured. ``share``: the host's DescribeStreamSummary answers
        (``copier.adapters.summaryshare``; None: this process asks alone). ``board``: the application's, in
        the state table (``copier.adapters.summaryboard``; None: the host asks for itself)."""
        self.config = config
        put_timeout = config.put_timeout_millis / 1000
        clock = clock_bounds
        on_answer = None if clock is None else clock.observe
        self._put: Any = None
        self._fast: JsonClient | None = None
        if lean is not None:
            from copier.adapters.awsauth import endpoint_for

            def lean_client(region: str, endpoint: str | None, read_timeout: float) -> JsonClient:
                url = endpoint or endpoint_for("kinesis", region)
                assert url is not None, "the lean path is taken only where an endpoint is known (awsauth.lean_reason)"
                return JsonClient("kinesis", region, url, lean, 5.0, read_timeout, on_answer)

            self._fast = lean_client(config.target_region, config.target_endpoint, put_timeout)
            self._read: Any = LeanKinesis(lean_client(config.target_region, config.target_endpoint, 30), sleep)
            self._staging: Any = LeanKinesis(lean_client(config.region, config.kinesis_endpoint, 30), sleep)
        else:
            from copier.adapters.awsjson import usable
            from copier.adapters.botokinesis import botocore_client
            from copier.adapters.sessions import host_session
            from copier.adapters.target import target_session

            # The target and dead-letter streams may be in another region or account (copier.adapters.target),
            # behind another endpoint than the staging stream.
            target, where = target_session(config), (config.target_region, config.target_endpoint)
            self._put = botocore_client(
                target, *where, attempts=1, read_timeout=put_timeout, clock_bounds=clock, put_deadlines=True
            )
            self._read = botocore_client(target, *where, attempts=None, read_timeout=30, clock_bounds=clock)
            staging = (config.region, config.kinesis_endpoint)
            self._staging = botocore_client(
                host_session(), *staging, attempts=None, read_timeout=30, clock_bounds=clock
            )
            credentials = target.get_credentials()
            if credentials is not None and usable(self._put.meta.endpoint_url):
                self._fast = JsonClient.for_botocore(self._put, credentials, 5.0, put_timeout, on_answer)
        self._monotonic = monotonic
        self._share = share
        self.summaries = StreamSummaries(config, self._summary, monotonic, share, board)
        self._listings = ShardListings(self.shards, monotonic, share)
        self._reads = KinesisReads(self._call, self._staging, self._read, sleep)

    def put_records(self, stream: str, entries: Sequence[PutEntry], deadline: float | None = None) -> list[str | None]:
        """One PutRecords attempt, all of it by ``deadline`` (``time.monotonic()``; None: the put timeout from
        now); returns each entry's error code, None where it landed."""
        if deadline is None:
            deadline = time.monotonic() + self.config.put_timeout_millis / 1000
        try:
            return self._put_records(stream, entries, deadline)
        except FatalAwsError as exc:
            raise self._naming_the_key(stream, exc, "kms:GenerateDataKey") from exc

    def _naming_the_key(self, stream: str, exc: FatalAwsError, permission: str) -> FatalAwsError:
        """A KMS error, with the stream's key (AWS's own message may not name it) and what the role needs."""
        if not exc.code.startswith("KMS"):
            return exc
        try:
            summary = self._call("DescribeStreamSummary", self._read.describe_stream_summary, StreamName=stream)
            key = summary["StreamDescriptionSummary"].get("KeyId") or "its KMS key"
        except AwsError:
            key = "its KMS key (DescribeStreamSummary failed too)"
        return FatalAwsError(
            exc.operation,
            exc.code,
            f"stream {stream} is encrypted with {key}, which this role cannot use: it needs {permission} "
            f"on that key (key policy and IAM policy). AWS said: {exc}",
        )

    def _put_records(self, stream: str, entries: Sequence[PutEntry], deadline: float) -> list[str | None]:
        if self._fast is None:
            from copier.adapters.botokinesis import put_records

            return put_records(self._put, stream, entries, deadline)
        body = put_records_body(stream, entries)
        try:
            return put_results(self._fast.call("PutRecords", body, deadline), len(entries))
        except Unanswered as exc:
            raise AmbiguousPutError("PutRecords", exc.code, str(exc)) from exc
        except ValueError as exc:  # an answer that does not say what landed: its outcome is unknown
            raise AmbiguousPutError("PutRecords", "UnreadableAnswer", str(exc)) from exc

    def _call(self, operation: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """``fn(**kwargs)``; a botocore error as copier's, and a missing stream named (``_named``).

        botocore's parser raises plain Python errors on some malformed answers (JSON that is not an object,
        a body that is not UTF-8): those are :class:`~copier.adapters.awsjson.Unreadable`, as the lean
        client's are, never an exception that ends the process."""
        try:
            return fn(**kwargs)
        except Exception as exc:
            if isinstance(exc, AwsError):  # the lean client's, already copier's
                error: AwsError = exc
            elif _botocore_error(exc):
                from copier.adapters.aws import convert_aws_error

                error = convert_aws_error(operation, exc)
            elif isinstance(exc, DECODING_ERRORS):
                error = Unreadable(operation, "UnreadableAnswer", repr(exc)[:300])
            else:
                raise
            stream = kwargs.get("StreamName")
            raise (self._named(error, stream) if stream else error) from exc

    def _named(self, error: AwsError, stream: str) -> AwsError:
        """A missing stream named, with the region and endpoint it was looked for in and the key that names it."""
        c = self.config
        if stream == c.stream_name:
            where, key = place(c.region, c.kinesis_endpoint), "streamName"
        else:
            key = "copier.targetStreamName" if stream == c.target_stream_name else "copier.deadLetterStreamName"
            where = place(c.target_region or c.region, c.target_endpoint)
        return naming_the_resource(error, f"the stream {stream}", where, f"create it, or correct {key} in {c.path}")

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """All shards of a stream (open and closed within retention)."""
        client = self._staging if stream == self.config.stream_name else self._read
        return paged_shards(lambda **kw: self._call("ListShards", client.list_shards, **kw), stream)

    def shard_map(self, stream: str) -> ShardMap:
        """The stream's open shards by hash key range, from a listing at most ``SHARD_MAP_MAX_AGE_S`` old, the
        host's (``copier.adapters.shardlistings``)."""
        return self._listings.shard_map(stream)

    def describe(self, stream: str, keep: bool = False) -> StreamSettings:
        """The stream's settings from DescribeStreamSummary now (``StreamSummaries.describe``)."""
        return self.summaries.describe(stream, keep)

    def _summary(self, stream: str) -> StreamSettings:
        client = self._staging if stream == self.config.stream_name else self._read
        answer = self._call("DescribeStreamSummary", client.describe_stream_summary, StreamName=stream)
        return StreamSettings.from_summary(stream, answer["StreamDescriptionSummary"])

    def settings(self, stream: str, refresh: bool = False) -> StreamSettings | None:
        """The stream's settings, as old as ``copier.core.summaryage`` allows (``StreamSummaries.settings``)."""
        return self.summaries.settings(stream, refresh)

    def retention(self, stream: str) -> int | None:
        """The stream's retention period (ms) (see :meth:`settings`); None when it cannot be read."""
        settings = self.settings(stream)
        return settings.retention_ms if settings is not None else None

    def read_source(self, stream: str, shard_id: str, first: Position, last: Position) -> Iterator[list[SourceRecord]]:
        """A staging shard's records from ``first`` to ``last`` (both included), as the daemon delivers them
        (``KinesisReads.read_source``)."""
        return self._reads.read_source(stream, self.shards(stream), shard_id, first, last)

    def read_arrivals(
        self, stream: str, shard_id: str, since_ms: int, until_ms: int, keep_alive: Callable[[], None] | None = None
    ) -> Iterator[list[SourceRecord]]:
        """A staging shard's records from ``since_ms`` up to the first that arrived at or after ``until_ms``, as the
        daemon delivers them (``KinesisReads.read_arrivals``)."""
        return self._reads.read_arrivals(stream, self.shards(stream), shard_id, since_ms, until_ms, keep_alive)

    def waiting(self, shard_id: str, start: dict[str, Any]) -> Waiting:
        """What the staging shard holds from ``start`` on (``KinesisReads.waiting``); a failed read is said in
        the answer, not raised (``copier status`` reads every shard and judges each)."""
        try:
            return self._reads.waiting(self.config.stream_name, shard_id, start)
        except AwsError as exc:
            return Waiting(error=f"{exc.operation}: {exc.code}: {exc.message}")

    def shard_entry(self, stream: str, shard_id: str) -> dict[str, Any] | None:
        """A shard's ListShards entry, None when not listed (``ShardListings.entry``: a listing kept a few
        seconds, the host's up to ``SHARD_MAP_MAX_AGE_S`` old, a shard it does not name listed fresh)."""
        return self._listings.entry(stream, shard_id)

    def parents(self, stream: str, shard_id: str, ancestor: bool = False) -> list[str]:
        """The parent shard IDs of a shard (one after a split, two after a merge), from :meth:`shard_entry`.

        A shard the daemon handed out exists, so one not listed yet is a
        transient error; an ``ancestor`` not listed has expired with the
        stream's retention (ListShards lists closed shards only within it),
        and so have its parents: none.
        """
        shard = self.shard_entry(stream, shard_id)
        if shard is not None:
            return [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p]
        if ancestor:
            return []
        # The KCL handed this shard out, so it exists: ListShards has not caught up yet.
        raise TransientAwsError("ListShards", "ShardNotListed", f"{shard_id} is not listed in {stream} yet")

    def read_identities(
        self,
        stream: str,
        shards: Collection[int] | None,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
        keep_alive: Callable[[], None] | None = None,
    ) -> Found:
        """Count record identities in the given shards (and their descendants) over a time range
        (``KinesisReads.read_identities``); a KMS error names the stream's key."""
        try:
            return self._reads.read_identities(
                stream, self.shards(stream), shards, since_ms, until_ms, identity, keep_alive
            )
        except FatalAwsError as exc:
            raise self._naming_the_key(stream, exc, "kms:Decrypt") from exc
