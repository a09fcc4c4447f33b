"""Kinesis service limits that copier plans around (see DESIGN section 4)."""

from __future__ import annotations

__all__ = [
    "MAX_PARTITION_KEY_CHARS",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_RECORDS",
    "record_size",
]

MAX_REQUEST_RECORDS = 500
MAX_RECORD_BYTES = 1024 * 1024
MAX_REQUEST_BYTES = 5 * 1024 * 1024
MAX_PARTITION_KEY_CHARS = 256


def record_size(partition_key: str, data: bytes) -> int:
    """Bytes a record counts against the limits: payload plus UTF-8 partition key."""
    return len(data) + len(partition_key.encode("utf-8"))
