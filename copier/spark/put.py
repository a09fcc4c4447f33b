"""PutRecords for the staging writer: requests within the limits, retries of failed entries, aggregation."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import botocore.exceptions

from copier.core import kpl
from copier.core.batching import split_requests
from copier.core.errors import FatalAwsError
from copier.core.limits import record_size
from copier.core.retry import backoff_ms
from copier.core.shardmap import ShardMap, hash_key
from copier.spark.rows import Entry
from copier.spark.settings import PutBudgetExhausted, WriterSettings

__all__ = ["RETRYABLE_ENTRY_CODES", "default_client", "make_client", "open_shard_ranges", "put_records", "send"]

log = logging.getLogger(__name__)

RETRYABLE_ENTRY_CODES = frozenset(
    {"ProvisionedThroughputExceededException", "InternalFailure", "KMSThrottlingException"}
)
_RETRYABLE_REQUEST_CODES = RETRYABLE_ENTRY_CODES | {
    "ThrottlingException",
    "LimitExceededException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "InternalServerError",
    "RequestTimeout",
    "RequestTimeoutException",
}


def default_client(settings: WriterSettings) -> Any:
    """A boto3 Kinesis client that makes one attempt per call: the retry budget and backoff are ours."""
    import boto3
    import botocore.config

    return boto3.session.Session().client(
        "kinesis",
        region_name=settings.region,
        endpoint_url=settings.endpoint,
        config=botocore.config.Config(
            retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60
        ),
    )


def make_client(settings: WriterSettings) -> Any:
    """The settings' client_factory's client, else :func:`default_client`."""
    return (settings.client_factory or default_client)(settings)


def _retryable_request_error(exc: Exception) -> str:
    """The error code of a whole-request failure worth retrying; anything else leaves as FatalAwsError."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", "ClientError"))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in _RETRYABLE_REQUEST_CODES or status >= 500:
            return code
        raise FatalAwsError("PutRecords", code, str(exc)) from exc
    if isinstance(exc, botocore.exceptions.ConnectionError | botocore.exceptions.HTTPClientError):
        return type(exc).__name__
    raise FatalAwsError("PutRecords", type(exc).__name__, str(exc)) from exc


def put_records(
    client: Any,
    settings: WriterSettings,
    records: Sequence[kpl.KinesisRecord],
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Put one request's records until all landed, resending only failed ones; returns the attempts made.

    A per-entry code outside :data:`RETRYABLE_ENTRY_CODES` (KMS access
    denied, a disabled key) cannot succeed by waiting: FatalAwsError at once.
    """
    pending = list(records)
    codes: Counter[str] = Counter()
    for attempt in range(1, settings.max_attempts + 1):
        request = [
            {"PartitionKey": r.partition_key, "Data": r.data}
            | ({"ExplicitHashKey": r.explicit_hash_key} if r.explicit_hash_key else {})
            for r in pending
        ]
        try:
            answer = client.put_records(StreamName=settings.stream_name, Records=request)
        except Exception as exc:  # classified: retryable, or re-raised as FatalAwsError
            codes = Counter({_retryable_request_error(exc): len(pending)})
        else:
            results = answer["Records"]
            if len(results) != len(pending):
                raise FatalAwsError("PutRecords", "BadResponse", f"{len(results)} results for {len(pending)} records")
            codes = Counter(r["ErrorCode"] for r in results if r.get("ErrorCode"))
            fatal = sorted(set(codes) - RETRYABLE_ENTRY_CODES)
            if fatal:
                raise FatalAwsError("PutRecords", fatal[0], f"entries failed with {dict(codes)}")
            pending = [rec for rec, res in zip(pending, results, strict=True) if res.get("ErrorCode")]
            if not pending:
                return attempt
        if attempt < settings.max_attempts:
            log.debug("PutRecords attempt %d: %d records to resend (%s)", attempt, len(pending), dict(codes))
            sleep(backoff_ms(attempt - 1, settings.max_backoff_ms) / 1000)
    raise PutBudgetExhausted(settings.stream_name, settings.max_attempts, len(records), len(pending), codes)


def open_shard_ranges(client: Any, stream: str) -> ShardMap:
    """The stream's open shards by hash key range: where new records go."""
    from copier.adapters.kinesis import paged_shards

    return ShardMap.of(paged_shards(client.list_shards, stream))


def _to_records(entries: Sequence[Entry], ranges: ShardMap | None) -> list[kpl.KinesisRecord]:
    """Plain records, or aggregates per open shard (each routed by its first record's hash key, in that shard)."""
    if ranges is None:
        return [kpl.KinesisRecord(e.partition_key, None, e.data) for e in entries]
    groups: dict[int, list[tuple[str, bytes]]] = {}
    for e in entries:
        groups.setdefault(ranges.position_for_hash(hash_key(e.partition_key)), []).append((e.partition_key, e.data))
    out: list[kpl.KinesisRecord] = []
    for shard, group in groups.items():
        if shard < 0:  # in no open shard's range (mid-reshard): plain records, routed by Kinesis
            out.extend(kpl.KinesisRecord(pk, None, data) for pk, data in group)
        else:
            out.extend(kpl.aggregate(group))
    return out


def send(client: Any, settings: WriterSettings, entries: Sequence[Entry], ranges: ShardMap | None) -> None:
    """Put encoded rows: plain or aggregated (``ranges`` given), in requests within the limits."""
    records = _to_records(entries, ranges)
    for request in split_requests(records, lambda r: record_size(r.partition_key, r.data)):
        put_records(client, settings, request)
