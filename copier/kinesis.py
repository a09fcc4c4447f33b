"""Kinesis I/O: puts that never retry on their own, reads for verification, shard lineage.

botocore retries a PutRecords by itself on a connection error or a 5xx,
re-sending a request whose first attempt may already have landed: that
turns an ambiguous put into a silent duplicate. The put client here makes
exactly one attempt; copier retries, knowing which failures are ambiguous:

* failed before the request was sent (cannot connect): not ambiguous;
* per-entry ``ErrorCode`` in a PutRecords answer: those entries did not land;
* read timeout, dropped connection, a 5xx answer: ambiguous, raised as
  :class:`~copier.errors.AmbiguousPutError` and verified by reading the stream.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from copier.config import Config
from copier.dynamo import convert_aws_error
from copier.errors import AmbiguousPutError, AwsError, FatalAwsError, TransientAwsError

__all__ = ["KinesisStreams", "PutEntry", "paged_shards"]

PutEntry = tuple[str, bytes]  # (partition key, data)

_NOT_SENT = (botocore.exceptions.EndpointConnectionError, botocore.exceptions.ConnectTimeoutError)
_AMBIGUOUS = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ResponseStreamingError,
)


def _client(config: Config, *, attempts: int | None, read_timeout: float) -> Any:
    retries: dict[str, Any] = {"mode": "standard"}
    if attempts is not None:
        retries["total_max_attempts"] = attempts
    return boto3.session.Session().client(
        "kinesis",
        region_name=config.region,
        endpoint_url=config.kinesis_endpoint,
        config=botocore.config.Config(retries=retries, connect_timeout=5, read_timeout=read_timeout),  # type: ignore[arg-type]
    )


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
    """The copier's Kinesis calls; every botocore error leaves here as a CopierError."""

    def __init__(self, config: Config, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self._put = _client(config, attempts=1, read_timeout=config.put_timeout_millis / 1000)
        self._read = _client(config, attempts=None, read_timeout=30)
        self._sleep = sleep

    def put_records(self, stream: str, entries: Sequence[PutEntry]) -> list[str | None]:
        """One PutRecords attempt; returns each entry's error code, None where it landed."""
        request = [{"PartitionKey": pk, "Data": data} for pk, data in entries]
        try:
            answer = self._put.put_records(StreamName=stream, Records=request)
        except _NOT_SENT as exc:
            raise TransientAwsError("PutRecords", type(exc).__name__, str(exc)) from exc
        except _AMBIGUOUS as exc:
            raise AmbiguousPutError("PutRecords", type(exc).__name__, str(exc)) from exc
        except botocore.exceptions.ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            err = convert_aws_error("PutRecords", exc)
            if status >= 500:
                raise AmbiguousPutError("PutRecords", err.code, str(exc)) from exc
            raise err from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise AmbiguousPutError("PutRecords", type(exc).__name__, str(exc)) from exc
        return [r.get("ErrorCode") for r in answer["Records"]]

    def _call(self, operation: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return fn(**kwargs)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise convert_aws_error(operation, exc) from exc

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """All shards of a stream (open and closed within retention)."""
        return paged_shards(lambda **kw: self._call("ListShards", self._read.list_shards, **kw), stream)

    def parents(self, stream: str, shard_id: str) -> list[str]:
        """The parent shard IDs of a shard (one after a split, two after a merge)."""
        for shard in self.shards(stream):
            if shard["ShardId"] == shard_id:
                return [p for p in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")) if p]
        raise FatalAwsError("ListShards", "ShardNotFound", f"{shard_id} is not a shard of {stream}")

    def identities_since(self, stream: str, since_ms: int, identity: Callable[[str, bytes], bytes]) -> Counter[bytes]:
        """Read every shard of ``stream`` from ``since_ms`` to its end; count record identities.

        Used to verify a batch whose put may or may not have landed: what is
        in the stream now is all that ever will be of it, because the put
        that wrote it has finished or timed out (see the lease rules).
        """
        seen: Counter[bytes] = Counter()
        timestamp = since_ms / 1000
        for shard in self.shards(stream):
            iterator = self._call(
                "GetShardIterator",
                self._read.get_shard_iterator,
                StreamName=stream,
                ShardId=shard["ShardId"],
                ShardIteratorType="AT_TIMESTAMP",
                Timestamp=timestamp,
            ).get("ShardIterator")
            while iterator:
                try:
                    page = self._call("GetRecords", self._read.get_records, ShardIterator=iterator, Limit=10000)
                except AwsError as exc:
                    if exc.retryable:
                        self._sleep(0.5)
                        continue
                    raise
                for record in page.get("Records", []):
                    seen[identity(record["PartitionKey"], bytes(record["Data"]))] += 1
                iterator = page.get("NextShardIterator")
                if not page.get("Records") and page.get("MillisBehindLatest", 0) == 0:
                    break
                self._sleep(0.2)  # 5 GetRecords per second per shard
        return seen
