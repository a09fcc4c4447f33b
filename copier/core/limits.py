"""Kinesis and DynamoDB service limits that copier plans around, and copier's own bounds.

Partition keys (docs/protocol.md, "Partition keys"): Kinesis takes a key of
1 to 256 *characters*, and a character here is a Unicode code point (a
scalar value), not a UTF-16 code unit. The evidence: the API reference calls
keys "Unicode strings with a maximum length limit of 256 characters" and its
model gives the limit as a length constraint (min 1, max 256), which the
Smithy specification, the language AWS models are written in, defines for a
string as its number of Unicode scalar values; AWS's own Smithy server
framework (smithy-typescript's ``LengthValidator``) counts code points. The
UTF-16 counts found elsewhere are each tool's own string length (the KPL's
Java check ``partitionKey.length()``, kinesis-mock in Scala, kinesalite in
JavaScript), and moto counts code points. Not measured against AWS (no
account where this was written); docs/protocol.md's assumptions table says
what breaks if the service counts UTF-16 units. A key that staging accepted
passed the same rule the target applies, and is forwarded as it is.

A key with a lone surrogate (U+D800 to U+DFFF standing alone) is not a
Unicode string at all: it has no UTF-8 form, which is what Kinesis hashes
(the MD5 of the key's UTF-8 bytes picks the shard) and counts against the
record size. Such a key never comes from Kinesis through the stock daemon
(measured: the MultiLangDaemon writes one to its child as ``?``), only from
a daemon that escapes it (``\\ud800`` in JSON is grammatical) or from bytes
that were not UTF-8; sent on, it would be refused with the whole PutRecords
or routed by a hash copier cannot know. So it is refused like an empty or a
too long key: the record is dead-lettered, or forwarded under a replacement
key (``copier.core.plan``). Nothing here raises on such a key: its bytes
(:func:`key_bytes`) keep the surrogate (``surrogatepass``), so digests and
sizes are defined for every string.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = [
    "CODE_POINTS",
    "KeyCount",
    "MAX_CHUNK_EVENTS",
    "MAX_ITEM_BYTES",
    "MAX_PARTITION_KEY_CHARS",
    "MAX_RECORD_BYTES",
    "MAX_REQUEST_BYTES",
    "MAX_REQUEST_RECORDS",
    "MAX_RETENTION_MS",
    "MAX_STREAM_RECORD_BYTES",
    "BIG_READ_BYTES",
    "BIG_READ_PAUSE_S",
    "READ_BYTES_PER_SHARD_S",
    "READ_CALLS_PER_SHARD_S",
    "UTF16_UNITS",
    "WRITE_BYTES_PER_SHARD_S",
    "WRITE_RECORDS_PER_SHARD_S",
    "key_bytes",
    "key_length",
    "key_problem",
    "read_pause_s",
    "record_size",
]

MAX_REQUEST_RECORDS = 500
MAX_RECORD_BYTES = 1024 * 1024  # a stream's record limit unless UpdateMaxRecordSize raised it
MAX_STREAM_RECORD_BYTES = 10 * 1024 * 1024  # the most UpdateMaxRecordSize allows (10,240 KiB)
MAX_REQUEST_BYTES = 10 * 1024 * 1024  # a PutRecords request, every entry together
MAX_PARTITION_KEY_CHARS = 256
MAX_RETENTION_MS = 8760 * 3_600_000  # the longest retention Kinesis allows a stream (IncreaseStreamRetentionPeriod)

#: How a partition key's characters are counted: "code points" (Kinesis' count, see the module docstring),
#: or "utf-16" code units, which copier used before and which digest batches planned then still name.
KeyCount = Literal["code points", "utf-16"]
CODE_POINTS: KeyCount = "code points"
UTF16_UNITS: KeyCount = "utf-16"

_SURROGATE = re.compile("[\ud800-\udfff]")


def key_bytes(partition_key: str) -> bytes:
    """A key's UTF-8 bytes, a lone surrogate kept as its three bytes (``surrogatepass``): never raises, and a
    valid key's bytes are its UTF-8."""
    return partition_key.encode("utf-8", "surrogatepass")


def key_length(partition_key: str, count: KeyCount = CODE_POINTS) -> int:
    """A partition key's length in ``count``: code points (Kinesis), or UTF-16 code units (copier before)."""
    if count == CODE_POINTS or partition_key.isascii():
        return len(partition_key)
    return len(partition_key.encode("utf-16-le", "surrogatepass")) // 2


def key_problem(partition_key: str, count: KeyCount = CODE_POINTS) -> str | None:
    """Why Kinesis would refuse this partition key (empty, a lone surrogate, over 256 characters), or None.

    The reasons' words are what dead-letter envelopes carry (and audits read): unchanged since copier
    counted UTF-16 code units, so a digest batch planned then gets the same envelopes when redone.
    """
    if not partition_key:
        return "partition key is empty"
    if not partition_key.isascii():
        lone = _SURROGATE.search(partition_key)
        if lone is not None:
            return f"partition key is not Unicode text: a lone surrogate U+{ord(lone.group()):04X} at {lone.start()}"
    length = key_length(partition_key, count)
    if length > MAX_PARTITION_KEY_CHARS:
        return f"partition key has {length} characters, over Kinesis' {MAX_PARTITION_KEY_CHARS}"
    return None

# A provisioned shard's throughput (the Kinesis Data Streams quotas page): what one shard takes and serves a
# second, whoever writes or reads it; a GetRecords that returned 10 MiB throttles the shard's next reads for 5 s.
WRITE_RECORDS_PER_SHARD_S = 1000
WRITE_BYTES_PER_SHARD_S = 1024 * 1024
READ_CALLS_PER_SHARD_S = 5
READ_BYTES_PER_SHARD_S = 2 * 1024 * 1024
BIG_READ_BYTES = 10 * 1024 * 1024
BIG_READ_PAUSE_S = 5.0


def read_pause_s(page_bytes: int) -> float:
    """How long a reader waits after a GetRecords that returned ``page_bytes`` before it reads the shard
    again, to stay within the shard's read limits: a fifth of a second (5 calls a second), longer for a page
    of more than 400 KiB (2 MiB a second), 5 s after a page of 10 MiB (Kinesis refuses the shard's reads
    until then). A reader that waits less is throttled, and each throttle costs it a retry of its budget."""
    if page_bytes >= BIG_READ_BYTES:
        return BIG_READ_PAUSE_S
    return max(1 / READ_CALLS_PER_SHARD_S, page_bytes / READ_BYTES_PER_SHARD_S)


def record_size(partition_key: str, data: bytes) -> int:
    """Bytes a record counts against the limits: payload plus UTF-8 partition key (:func:`key_bytes`)."""
    if partition_key.isascii():
        return len(data) + len(partition_key)
    return len(data) + len(key_bytes(partition_key))


# --- copier's own bounds (docs/protocol.md, "Limits") ---------------------------------------------

#: Records planned, recorded and committed together. A digest batch holds 10 bytes an event, so a
#: chunk's batch stays under 100 KB (DynamoDB's item limit is 400 KB), and so does a redo set.
MAX_CHUNK_EVENTS = 10_000

#: DynamoDB's item size limit, for the tests that check copier's items stay under it.
MAX_ITEM_BYTES = 400 * 1024
