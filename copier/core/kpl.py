"""KPL record aggregation: many small user records in one Kinesis record.

This is the aws-kinesis-agg format, the one the KCL (and so the copier's
MultiLangDaemon) de-aggregates before a record processor sees anything:
user records come out one by one, sharing the Kinesis record's sequence
number, with sub-sequence numbers 0..n-1. An aggregated record is::

    F3 89 9A C2                       4 magic bytes
    AggregatedRecord (protobuf)       repeated string partition_key_table = 1;
                                      repeated string explicit_hash_key_table = 2;
                                      repeated Record records = 3;
                                      Record: uint64 partition_key_index = 1;
                                              uint64 explicit_hash_key_index = 2 (optional);
                                              bytes data = 3;
    MD5 of the protobuf bytes         16 bytes

A record without the magic, too short, or with a wrong MD5 is not an
aggregate: the KCL passes it through unchanged, and so does
:func:`deaggregate`.

Why every user record carries the aggregate's explicit hash key: the KCL
de-aggregates with the hash key range of the shard it reads, and silently
drops an aggregated record (all of its user records) as soon as one user
record's *effective* hash key (its explicit hash key, else the MD5 of its
partition key) falls outside that range (``AggregatorUtil.deaggregate``).
Kinesis routes the aggregate by its ExplicitHashKey, so giving every user
record that same key makes the drop impossible, even when a reshard moved
the range between grouping and putting. The protobuf encoding is written
here (a few varints and length-delimited fields) so no protobuf runtime is
needed on Spark executors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from copier.core.limits import MAX_RECORD_BYTES, record_size
from copier.core.shardmap import hash_key

__all__ = [
    "MAGIC",
    "AggregatedMessage",
    "DaemonView",
    "as_daemon_delivers",
    "KinesisRecord",
    "aggregate",
    "deaggregate",
    "decode",
    "hash_key",
    "is_aggregated",
]

MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST = 16
_FRAME = len(MAGIC) + _DIGEST


class KinesisRecord(NamedTuple):
    """One PutRecords entry: an aggregate, or a user record passed through (explicit_hash_key None)."""

    partition_key: str
    explicit_hash_key: str | None
    data: bytes


@dataclass(frozen=True)
class AggregatedMessage:
    """A decoded AggregatedRecord: the tables and (pk index, ehk index or None, data) per user record."""

    partition_keys: list[str]
    explicit_hash_keys: list[str]
    records: list[tuple[int, int | None, bytes]]


# --- protobuf wire format: only varints (wire type 0) and length-delimited fields (wire type 2) ---


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_len(n: int) -> int:
    return max(1, (n.bit_length() + 6) // 7)


def _delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _delimited_len(n: int) -> int:
    return 1 + _varint_len(n) + n  # fields 1..15 have one-byte tags


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated or oversized varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(buf: bytes) -> Iterable[tuple[int, int | bytes]]:
    """(field number, value) for each field; unknown wire types 1 and 5 are skipped, as protobuf does."""
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
            yield tag >> 3, value
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated length-delimited field")
            yield tag >> 3, buf[pos : pos + size]
            pos += size
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _record_message(pk_index: int, ehk_index: int | None, data: bytes) -> bytes:
    out = b"\x08" + _varint(pk_index)
    if ehk_index is not None:
        out += b"\x10" + _varint(ehk_index)
    return out + _delimited(3, data)


def _record_message_len(pk_index: int, ehk_index: int, data_len: int) -> int:
    return 1 + _varint_len(pk_index) + 1 + _varint_len(ehk_index) + _delimited_len(data_len)


def _frame(message: bytes) -> bytes:
    return MAGIC + message + hashlib.md5(message).digest()


# --- aggregation ----------------------------------------------------------------------------------


class _Builder:
    """One aggregate being filled, with its exact encoded size known at every step."""

    def __init__(self, partition_key: str, explicit_hash_key: str) -> None:
        self.partition_key = partition_key
        self.explicit_hash_key = explicit_hash_key
        self.keys: dict[str, int] = {}
        self.records: list[tuple[int, bytes]] = []
        self.proto_len = _delimited_len(len(explicit_hash_key.encode("ascii")))

    def cost(self, partition_key: str, data: bytes) -> int:
        """Bytes that adding this user record would add to the protobuf."""
        index = self.keys.get(partition_key, len(self.keys))
        new_key = 0 if partition_key in self.keys else _delimited_len(len(partition_key.encode("utf-8")))
        return new_key + _delimited_len(_record_message_len(index, 0, len(data)))

    def size_with(self, extra: int) -> int:
        """The aggregate's size against the limits (framing and outer partition key included)."""
        return _FRAME + self.proto_len + extra + len(self.partition_key.encode("utf-8"))

    def add(self, partition_key: str, data: bytes, cost: int) -> None:
        index = self.keys.setdefault(partition_key, len(self.keys))
        self.records.append((index, data))
        self.proto_len += cost

    def build(self) -> KinesisRecord:
        if len(self.records) == 1 and not self.records[0][1].startswith(MAGIC):
            # One record gains nothing from framing, and Kinesis routes it by its own key to the same shard.
            return KinesisRecord(self.partition_key, None, self.records[0][1])
        parts = [_delimited(1, key.encode("utf-8")) for key in self.keys]
        parts.append(_delimited(2, self.explicit_hash_key.encode("ascii")))
        parts.extend(_delimited(3, _record_message(index, 0, data)) for index, data in self.records)
        message = b"".join(parts)
        assert len(message) == self.proto_len, (len(message), self.proto_len)
        return KinesisRecord(self.partition_key, self.explicit_hash_key, _frame(message))


def aggregate(
    records: Iterable[tuple[str, bytes]],
    explicit_hash_key: str | None = None,
    max_bytes: int = MAX_RECORD_BYTES,
) -> list[KinesisRecord]:
    """Pack (partition key, data) user records, in order, into as few Kinesis records as fit.

    Each aggregate is at most ``max_bytes`` counting its partition key (the
    first user record's key, as the KPL does). Its ExplicitHashKey, repeated
    on every user record (see the module docstring), is ``explicit_hash_key``
    or else the hash key of its first user record; callers that group records
    by shard pass nothing or a key inside that shard's range. An aggregate
    that would hold a single record is emitted as that plain record. A user
    record too large to be sent even alone is a ValueError: the caller checks
    sizes first and names the event.
    """
    out: list[KinesisRecord] = []
    builder: _Builder | None = None
    for partition_key, data in records:
        if record_size(partition_key, data) > max_bytes:
            raise ValueError(f"a record of {record_size(partition_key, data)} bytes exceeds {max_bytes} bytes")
        if builder is not None:
            cost = builder.cost(partition_key, data)
            if builder.size_with(cost) <= max_bytes:
                builder.add(partition_key, data, cost)
                continue
            out.append(builder.build())
        builder = _Builder(partition_key, explicit_hash_key or str(hash_key(partition_key)))
        cost = builder.cost(partition_key, data)
        if builder.size_with(cost) > max_bytes:  # fits alone but not framed: send it as is
            out.append(KinesisRecord(partition_key, None, data))
            builder = None
        else:
            builder.add(partition_key, data, cost)
    if builder is not None:
        out.append(builder.build())
    return out


# --- de-aggregation -------------------------------------------------------------------------------


def is_aggregated(data: bytes) -> bool:
    """The KCL's test: magic bytes, something after them, and a matching MD5 tail."""
    return (
        len(data) > _FRAME
        and data.startswith(MAGIC)
        and hashlib.md5(data[len(MAGIC) : -_DIGEST]).digest() == data[-_DIGEST:]
    )


def decode(data: bytes) -> AggregatedMessage:
    """Decode an aggregated record's protobuf (the caller checked :func:`is_aggregated`)."""
    keys: list[str] = []
    hash_keys: list[str] = []
    records: list[tuple[int, int | None, bytes]] = []
    for field, value in _fields(data[len(MAGIC) : -_DIGEST]):
        if not isinstance(value, bytes):
            raise ValueError(f"AggregatedRecord field {field} is not length-delimited")
        if field == 1:
            keys.append(value.decode("utf-8"))
        elif field == 2:
            hash_keys.append(value.decode("ascii"))
        elif field == 3:
            pk_index: int | None = None
            ehk_index: int | None = None
            payload = b""
            for sub, sub_value in _fields(value):
                if sub == 1 and isinstance(sub_value, int):
                    pk_index = sub_value
                elif sub == 2 and isinstance(sub_value, int):
                    ehk_index = sub_value
                elif sub == 3 and isinstance(sub_value, bytes):
                    payload = sub_value
            if pk_index is None:
                raise ValueError("a Record has no partition_key_index")
            records.append((pk_index, ehk_index, payload))
    return AggregatedMessage(keys, hash_keys, records)


def deaggregate(data: bytes, partition_key: str = "") -> list[tuple[str, bytes]]:
    """The user records in a Kinesis record, as (partition key, data), in order.

    A record that is not an aggregate comes back as the single record
    ``(partition_key, data)``, as the KCL passes it through.
    """
    if not is_aggregated(data):
        return [(partition_key, data)]
    message = decode(data)
    return [(message.partition_keys[pk], payload) for pk, _, payload in message.records]


@dataclass(frozen=True)
class DaemonView:
    """What the KCL's de-aggregation delivers of one Kinesis record, and what went wrong, if anything.

    ``problem``: None for a plain record or a clean aggregate; ``"undecodable"``
    for a record that starts like an aggregate (the magic bytes) but whose MD5
    or protobuf is broken: the KCL passes it through as one opaque record, and
    whatever events it held cannot be seen; ``"out_of_range"`` when a user
    record's hash key lies outside the shard's range: the KCL drops the whole
    aggregate (``records`` is empty); ``"bad_index"`` when a user record names
    a partition key the table lacks: the KCL keeps the user records before it
    and drops the rest.
    """

    records: list[tuple[str, bytes]]
    aggregated: bool
    problem: str | None = None
    produced: list[tuple[str, bytes]] | None = None  # every user record, when the daemon delivers fewer

    @property
    def written(self) -> list[tuple[str, bytes]]:
        """What the producer wrote into the record: every user record, delivered or not."""
        return self.records if self.produced is None else self.produced


def as_daemon_delivers(data: bytes, partition_key: str, shard_range: tuple[int, int] | None = None) -> DaemonView:
    """The user records the KCL MultiLangDaemon (3.x ``AggregatorUtil.deaggregate``) hands a processor.

    ``shard_range``: the (starting, ending) hash keys of the shard the record
    was read from; None skips the range check.
    """
    if not is_aggregated(data):
        problem = "undecodable" if data.startswith(MAGIC) else None
        return DaemonView([(partition_key, data)], False, problem)
    try:
        message = decode(data)
    except (ValueError, UnicodeDecodeError):
        return DaemonView([(partition_key, data)], False, "undecodable")
    keys = message.partition_keys
    produced = [(keys[pk] if pk < len(keys) else "", payload) for pk, _, payload in message.records]
    out: list[tuple[str, bytes]] = []
    for pk_index, ehk_index, payload in message.records:
        try:
            key = keys[pk_index]
            effective = int(message.explicit_hash_keys[ehk_index]) if ehk_index is not None else hash_key(key)
        except (IndexError, ValueError):
            return DaemonView(out, True, "bad_index", produced)
        if shard_range is not None and not shard_range[0] <= effective <= shard_range[1]:
            return DaemonView([], True, "out_of_range", produced)
        out.append((key, payload))
    return DaemonView(out, True)
