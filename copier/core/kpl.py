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

Reading is held to what the KCL delivers, because copier reads a staging
range itself (a fenced processor that dropped its backlog; ``copier verify``)
and must see the records the daemon gave: the protobuf is parsed as the
KCL's generated code and protobuf-java parse it (strings decoded leniently,
unknown fields, fields of an unexpected wire type and groups skipped,
required fields required), indexes are taken as the KCL's ``(int)`` casts
take them and explicit hash keys as ``new BigInteger`` reads them.
``tests/test_kpl.py`` compares :func:`as_daemon_delivers` with the KCL
3.1.3 jars on 2,000 hostile aggregates.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence
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


_GROUP_DEPTH = 100  # protobuf-java's recursion limit, which its parser also applies to unknown groups


def _read_tag(buf: bytes, pos: int) -> tuple[int, int, int]:
    """(field number, wire type, position after the tag); protobuf-java refuses a tag of field number 0."""
    tag, pos = _read_varint(buf, pos)
    if tag >> 3 == 0:
        raise ValueError("a tag of field number 0")
    return tag >> 3, tag & 7, pos


def _read_value(buf: bytes, pos: int, wire: int) -> tuple[int | bytes, int]:
    """The value after a tag and the position after it: a varint, a length-delimited field's bytes, or 0 for a
    fixed32 or fixed64 (skipped); ValueError if it is cut short, or for a wire type with no value of its own."""
    if wire == 0:
        return _read_varint(buf, pos)
    if wire == 2:
        size, pos = _read_varint(buf, pos)
        if pos + size > len(buf):
            raise ValueError("truncated length-delimited field")
        return buf[pos : pos + size], pos + size
    if wire in (1, 5):
        end = pos + (8 if wire == 1 else 4)
        if end > len(buf):
            raise ValueError("truncated fixed-size field")
        return 0, end
    raise ValueError(f"wire type {wire} here")


def _fields(buf: bytes) -> Iterable[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field, as protobuf-java reads them (:func:`_read_value`; a
    group is skipped whole, its value 0). Whatever protobuf-java refuses (a tag of field 0, wire type 6 or 7, an
    end-group tag outside its group, anything cut short) is a ValueError."""
    pos = 0
    while pos < len(buf):
        field, wire, pos = _read_tag(buf, pos)
        if wire == 3:
            value: int | bytes = 0
            pos = _skip_group(buf, pos, field)
        else:
            value, pos = _read_value(buf, pos, wire)
        yield field, wire, value


def _skip_group(buf: bytes, pos: int, field: int) -> int:
    """The position after the group of ``field`` that starts at ``pos`` (its fields skipped, nested groups too)."""
    open_groups = [field]
    while open_groups:
        if len(open_groups) > _GROUP_DEPTH:
            raise ValueError("groups nested too deep")
        number, wire, pos = _read_tag(buf, pos)
        if wire == 3:
            open_groups.append(number)
        elif wire == 4:
            if number != open_groups[-1]:
                raise ValueError(f"group {open_groups[-1]} ended by the end tag of {number}")
            open_groups.pop()
        else:
            _, pos = _read_value(buf, pos, wire)
    return pos


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


_ENCODED_SURROGATE = re.compile(rb"\xed[\xa0-\xbf][\x80-\xbf]?")


def java_string(raw: bytes) -> str:
    """UTF-8 bytes as protobuf-java reads a proto2 ``string`` (the KCL's ``Messages``): never refused, each
    malformed sequence one U+FFFD. Python's decoder replaces the same sequences, except a surrogate encoded in
    UTF-8 (ED A0-BF and one more byte, or cut short), which protobuf-java replaces whole and Python byte by
    byte (compared with protobuf-java 4.27.5, the KCL 3.1.3's, on 40,000 byte strings: no difference)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd".join(part.decode("utf-8", "replace") for part in _ENCODED_SURROGATE.split(raw))


def _record(buf: bytes) -> tuple[int, int | None, bytes]:
    """A Record: (partition key index, explicit hash key index or None, data). A field of another wire type
    than its own is an unknown field to protobuf-java; a Record without its required index or data, or with a
    Tag without its required key, is refused (ValueError)."""
    pk_index: int | None = None
    ehk_index: int | None = None
    payload: bytes | None = None
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            pk_index = int(value)
        elif number == 2 and wire == 0:
            ehk_index = int(value)
        elif number == 3 and wire == 2:
            payload = bytes(value)  # type: ignore[arg-type]
        elif number == 4 and wire == 2 and not any(n == 1 and w == 2 for n, w, _ in _fields(value)):  # type: ignore[arg-type]
            raise ValueError("a Tag has no key")
    if pk_index is None or payload is None:
        raise ValueError("a Record lacks its partition_key_index or its data")
    return pk_index, ehk_index, payload


def decode(data: bytes) -> AggregatedMessage:
    """Decode an aggregated record's protobuf (the caller checked :func:`is_aggregated`) as protobuf-java parses
    it: strings decoded leniently (:func:`java_string`), unknown fields and fields of an unexpected wire type
    skipped; ValueError for what it refuses."""
    keys: list[str] = []
    hash_keys: list[str] = []
    records: list[tuple[int, int | None, bytes]] = []
    for number, wire, value in _fields(data[len(MAGIC) : -_DIGEST]):
        if wire != 2 or not isinstance(value, bytes):
            continue
        if number == 1:
            keys.append(java_string(value))
        elif number == 2:
            hash_keys.append(java_string(value))
        elif number == 3:
            records.append(_record(value))
    return AggregatedMessage(keys, hash_keys, records)


def deaggregate(data: bytes, partition_key: str = "") -> list[tuple[str, bytes]]:
    """The user records in a Kinesis record, as (partition key, data), in order.

    A record that is not an aggregate comes back as the single record
    ``(partition_key, data)``, as the KCL passes it through.
    """
    if not is_aggregated(data):
        return [(partition_key, data)]
    message = decode(data)
    keys = message.partition_keys
    return [(keys[_java_index(pk, keys)], payload) for pk, _, payload in message.records]


def _java_index(value: int, table: Sequence[str]) -> int:
    """``table.get((int) index)`` as the KCL looks an index up: its low 32 bits, signed; IndexError outside."""
    index = value & 0xFFFFFFFF
    if index >= 1 << 31 or index >= len(table):
        raise IndexError(f"index {value} of a table of {len(table)}")
    return index


def _java_big_integer(text: str) -> int:
    """``new BigInteger(text)``, as the KCL reads an explicit hash key: an optional sign and one or more
    decimal digits (of any script: ``Character.digit``), nothing else (no space, no ``_``, unlike ``int``);
    ValueError for its NumberFormatException. A number of over 40 digits, outside every shard's range, comes
    back as 10**40 with its sign (``int`` refuses strings of thousands of digits)."""
    digits = text[1:] if text[:1] in "+-" else text
    if not digits or not digits.isdecimal():
        raise ValueError(f"not a BigInteger: {text!r}")
    plain = (digits if digits.isascii() else "".join(str(unicodedata.decimal(c)) for c in digits)).lstrip("0")
    value = 10**40 if len(plain) > 40 else int(plain or "0")
    return -value if text[:1] == "-" else value


@dataclass(frozen=True)
class DaemonView:
    """What the KCL's de-aggregation delivers of one Kinesis record, and what went wrong, if anything.

    ``problem``: None for a plain record or a clean aggregate; ``"undecodable"``
    for a record that starts like an aggregate (the magic bytes) but whose MD5
    or protobuf is broken: the KCL passes it through as one opaque record, and
    whatever events it held cannot be seen; ``"out_of_range"`` when a user
    record's hash key lies outside the shard's range: the KCL drops the whole
    aggregate (``records`` is empty); ``"bad_index"`` when a user record names
    a partition key or explicit hash key the tables lack, or an explicit hash
    key that is no number: the KCL's code keeps the user records before it and
    drops the rest. (KCL 3.1.3 on Java 11 or later throws instead: its error
    path needs ``javax.xml.bind``, and ``NoClassDefFoundError`` leaves its
    ``ProcessTask``, which catches only ``RuntimeException``; the daemon
    delivers nothing of that record. Measured with its jars, ``tests/test_kpl.py``.)
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
    except ValueError:
        return DaemonView([(partition_key, data)], False, "undecodable")
    keys = message.partition_keys
    produced = [(keys[pk & 0xFFFFFFFF] if pk & 0xFFFFFFFF < len(keys) else "", data) for pk, _, data in message.records]
    out: list[tuple[str, bytes]] = []
    for pk_index, ehk_index, payload in message.records:
        try:
            key = keys[_java_index(pk_index, keys)]
            hash_keys = message.explicit_hash_keys
            effective = (
                hash_key(key) if ehk_index is None else _java_big_integer(hash_keys[_java_index(ehk_index, hash_keys)])
            )
        except (IndexError, ValueError):
            return DaemonView(out, True, "bad_index", produced)
        if shard_range is not None and not shard_range[0] <= effective <= shard_range[1]:
            return DaemonView([], True, "out_of_range", produced)
        out.append((key, payload))
    return DaemonView(out, True)
