"""Kinesis and DynamoDB service limits that copier plans around, and copier's own bounds."""

from __future__ import annotations

__all__ = [
    "MAX_CHUNK_EVENTS",
    "MAX_ITEM_BYTES",
    "MAX_PARTITION_KEY_CHARS",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_RECORDS",
    "MAX_RETENTION_MS",
    "MAX_STREAM_RECORD_BYTES",
    "record_size",
]

MAX_REQUEST_RECORDS = 500
MAX_RECORD_BYTES = 1024 * 1024  # a stream's record limit unless UpdateMaxRecordSize raised it
MAX_STREAM_RECORD_BYTES = 10 * 1024 * 1024  # the most UpdateMaxRecordSize allows (10,240 KiB)
MAX_REQUEST_BYTES = 10 * 1024 * 1024  # a PutRecords request, every entry together
MAX_PARTITION_KEY_CHARS = 256
MAX_RETENTION_MS = 8760 * 3_600_000  # the longest retention Kinesis allows a stream (IncreaseStreamRetentionPeriod)


def record_size(partition_key: str, data: bytes) -> int:
    """Bytes a record counts against the limits: payload plus UTF-8 partition key."""
    return len(data) + len(partition_key.encode("utf-8"))


# --- copier's own bounds (docs/protocol.md, "Limits") ---------------------------------------------

#: Records planned, recorded and committed together. A digest batch holds 10 bytes an event, so a
#: chunk's batch stays under 100 KB (DynamoDB's item limit is 400 KB), and so does a redo set.
MAX_CHUNK_EVENTS = 10_000

#: DynamoDB's item size limit, for the tests that check copier's items stay under it.
MAX_ITEM_BYTES = 400 * 1024
