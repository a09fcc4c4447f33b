"""Kinesis answers checked for the shape copier reads, before anything reads them.

Why: the code that reads an answer (``copier.adapters.kinesisread``,
``copier.core.shardmap``, the forwarder) indexes into it; a field missing
or of another type there would be a plain Python exception far from the
call, and one that escapes a record processor restarts every shard on the
host. Here each answer the lean client receives is checked once, right where
it arrives (and a PutRecords answer on either path): what does not fit raises
ValueError, which the caller turns into the error class of its call
(``copier.adapters.awsjson.reading``: an unreadable read is retried; an
unreadable PutRecords answer is an unknown outcome, verified). Only the
fields copier reads are checked; others pass untouched.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

__all__ = ["put_results", "records_page", "shard_iterator", "shards_page", "stream_summary"]


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _object(value: Any, what: str) -> dict[str, Any]:
    _need(isinstance(value, dict), f"{what} is not an object")
    checked: dict[str, Any] = value
    return checked


def _optional(doc: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> None:
    value = doc.get(name)
    _need(value is None or (isinstance(value, kind) and not isinstance(value, bool)), f"{name} is {value!r}")


def _digits(value: Any, what: str) -> None:
    _need(isinstance(value, str) and value.isascii() and value.isdigit(), f"{what} is {value!r}")


def put_results(answer: Any, count: int) -> list[str | None]:
    """Each entry's ``ErrorCode`` (None where it landed) of a PutRecords answer for ``count`` entries."""
    records = _object(answer, "the answer").get("Records")
    if not isinstance(records, list) or len(records) != count:
        raise ValueError(f"Records is not a list of {count} entries")
    codes: list[str | None] = []
    for entry in records:  # the checks inline, their helpers only to say what failed: this runs per record
        if not isinstance(entry, dict):
            _object(entry, "a Records entry")
        code = entry.get("ErrorCode")
        if code is None:
            if "SequenceNumber" not in entry:
                raise ValueError("an entry without ErrorCode or SequenceNumber")
        elif not isinstance(code, str) or code == "":
            raise ValueError(f"ErrorCode is {code!r}")
        codes.append(code)
    return codes


def records_page(page: dict[str, Any]) -> dict[str, Any]:
    """A GetRecords page; each record's ``Data`` decoded from base64 to bytes, as botocore gives it."""
    records = page.get("Records", [])
    _need(isinstance(records, list), "Records is not a list")
    for record in records:
        record = _object(record, "a record")
        _digits(record.get("SequenceNumber"), "SequenceNumber")
        _need(isinstance(record.get("PartitionKey"), str), "PartitionKey is not a string")
        stamp = record.get("ApproximateArrivalTimestamp")
        _need(isinstance(stamp, (int, float)) and not isinstance(stamp, bool), f"ApproximateArrivalTimestamp {stamp!r}")
        data = record.get("Data")
        if not isinstance(data, str):
            raise ValueError("Data is not a string")
        try:
            record["Data"] = base64.b64decode(data, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"Data is not base64: {exc}") from exc
    _optional(page, "NextShardIterator", str)
    _optional(page, "MillisBehindLatest", int)
    return page


def shards_page(page: dict[str, Any]) -> dict[str, Any]:
    """A ListShards page: shards with an ID, a hash key range of numbers and parents named by string."""
    shards = page.get("Shards", [])
    _need(isinstance(shards, list), "Shards is not a list")
    for shard in shards:
        shard = _object(shard, "a shard")
        _need(isinstance(shard.get("ShardId"), str), "ShardId is not a string")
        keys = _object(shard.get("HashKeyRange"), "HashKeyRange")
        _digits(keys.get("StartingHashKey"), "StartingHashKey")
        _digits(keys.get("EndingHashKey"), "EndingHashKey")
        _optional(shard, "ParentShardId", str)
        _optional(shard, "AdjacentParentShardId", str)
        _optional(shard, "SequenceNumberRange", dict)
    _optional(page, "NextToken", str)
    return page


def stream_summary(answer: dict[str, Any]) -> dict[str, Any]:
    """A DescribeStreamSummary answer: the summary's numbers are numbers and its names strings."""
    summary = _object(answer.get("StreamDescriptionSummary"), "StreamDescriptionSummary")
    for name in ("RetentionPeriodHours", "MaxRecordSizeInKiB", "OpenShardCount"):
        _optional(summary, name, int)
    for name in ("RecordDistributionStrategy", "EncryptionType", "KeyId", "StreamStatus"):
        _optional(summary, name, str)
    _optional(summary, "StreamModeDetails", dict)
    _optional(summary.get("StreamModeDetails") or {}, "StreamMode", str)
    return answer


def shard_iterator(answer: dict[str, Any]) -> dict[str, Any]:
    """A GetShardIterator answer: the iterator a string, or none (a closed shard's end)."""
    _optional(answer, "ShardIterator", str)
    return answer
