"""Event identity: the event ID a record carries, and the digests copier stores.

Deduplication works on the event ID named by ``copier.dedupKey``. A record
whose ID cannot be extracted (not JSON, field missing, wrong type) is
*unkeyed*: it is never deduplicated against the window, and the reason is
reported so the caller can log it with the record's position.

Copier stores 80-bit (10-byte) BLAKE2b digests instead of IDs: fixed size,
so items and memory are bounded, and small, because every forwarded event
costs its digest in DynamoDB writes and in the dedup window's memory. In
code a digest is a Python ``int`` below ``2**80``; ``copier.core.packing`` stores
it. Two domains are kept apart by BLAKE2b's ``person`` parameter:

* ``id`` digests, of an event ID: the dedup window and the identity of a
  keyed event;
* ``content`` digests, of partition key plus payload: the identity of an
  unkeyed event or a dead-letter envelope, used only to recognise a record in
  the target stream when an in-flight batch is verified.

The dedup window compares the top 72 bits of an ``id`` digest (it stores
the other 8 nowhere, to keep an ID under 12 bytes in memory; see
``copier.core.window``), so the chance that one new event collides with a
full window of 3.6 million IDs (an hour at a shard's write limit) is
3.6e6 / 2**72, about 8e-16: at ten billion events a day, all against full
windows, one false duplicate (a lost event) is expected once in about 360
years. Everything else (a verification, the redo set) compares all 80 bits.
"""

from __future__ import annotations

import hashlib
import json
import json.scanner
from dataclasses import dataclass

from copier.core.config import DedupKey
from copier.core.limits import CODE_POINTS, KeyCount, key_bytes, key_problem

__all__ = [
    "DIGEST_BITS",
    "DIGEST_SIZE",
    "EventId",
    "EventValue",
    "Unkeyed",
    "content_digest",
    "extract_event_id",
    "id_digest",
    "identity_of",
    "parse_json",
]

DIGEST_SIZE = 10
DIGEST_BITS = 8 * DIGEST_SIZE


EventValue = str | int  # an event ID as its JSON value: 1 and "1" are two IDs


@dataclass(frozen=True)
class EventId:
    """The event ID of a keyed record: a JSON string, or a JSON integer (never the same ID as its digits
    written as a string: they are different values, and a producer that writes both means two events)."""

    value: EventValue


@dataclass(frozen=True)
class Unkeyed:
    """Why a record has no usable event ID."""

    reason: str


_JSON_SPACE = " \t\n\r"  # JSON's whitespace, not str.isspace()'s (which counts U+0085 and others)
_SCAN = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # what json.loads ends in


def parse_json(data: bytes) -> object:
    """Strict JSON from UTF-8 bytes, as ``json.loads`` parses it, at a third of its cost.

    Never orjson, though it reads faster: its key cache can hand back another
    key than the one a payload holds (``copier.core.fastjson``), and a
    producer writes a payload's keys.

    ``json.loads`` on bytes first sniffs the encoding and then runs a
    whitespace regex around the C scanner; this runs the scanner directly,
    which matters at tens of thousands of records a second. Whitespace
    around the value is allowed, anything else after it is not. Only UTF-8
    is read (RFC 8259 requires it of JSON exchanged between systems).
    Raises ValueError, UnicodeDecodeError or RecursionError.
    """
    text = data.decode("utf-8")
    start = len(text) - len(text.lstrip(_JSON_SPACE)) if text[:1] in _JSON_SPACE else 0
    try:
        value, end = _SCAN(text, start)
    except StopIteration:
        raise ValueError("not a JSON value") from None
    if end != len(text) and text[end:].strip(_JSON_SPACE):
        raise ValueError("extra data after the JSON value")
    return value


def extract_event_id(
    key: DedupKey, partition_key: str, data: bytes, count: KeyCount = CODE_POINTS
) -> EventId | Unkeyed:
    """Find the event ID where ``key`` says; never raises on bad input.

    With the partition key as the ID, a key Kinesis would refuse (empty, a
    lone surrogate, or over 256 characters counted in ``count``: an
    aggregate's user record can carry one; ``copier.core.limits``) is no ID:
    such a record goes out under a replacement key, and the target could not
    give its ID back.
    """
    if key.kind == "partitionKey":
        problem = key_problem(partition_key, count)
        return EventId(partition_key) if problem is None else Unkeyed(problem)
    try:
        node: object = parse_json(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return Unkeyed("payload is not JSON")
    for i, part in enumerate(key.path):
        if not isinstance(node, dict):
            where = ".".join(key.path[:i]) or "payload"
            return Unkeyed(f"{where} is not a JSON object")
        if part not in node:
            return Unkeyed(f"field {'.'.join(key.path[: i + 1])} is missing")
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (str, int)):
        return Unkeyed(f"field {'.'.join(key.path)} is {type(node).__name__}, not a string or integer")
    if node == "":
        return Unkeyed(f"field {'.'.join(key.path)} is empty")
    return EventId(node)


def id_digest(event_id: EventValue, typed: bool = True) -> int:
    """The window's digest of an event ID; an integer ID's digest is of another domain than its digits'.

    ``typed=False``: the digest copier wrote before IDs were typed, where the integer 7 was the string "7":
    read only to recognise what such a version recorded (a chunk in flight, a window across an upgrade).
    """
    if isinstance(event_id, int) and typed:
        raw, person = str(event_id).encode("ascii"), b"copier-idnum"
    else:
        raw, person = str(event_id).encode("utf-8", "surrogatepass"), b"copier-id"
    return int.from_bytes(hashlib.blake2b(raw, digest_size=DIGEST_SIZE, person=person).digest(), "little")


def content_digest(partition_key: str, data: bytes) -> int:
    """The identity of a record with no event ID: its partition key and bytes. Defined for every key, one
    with a lone surrogate too (its bytes keep it: ``copier.core.limits.key_bytes``), so a record read back
    from any stream has one."""
    h = hashlib.blake2b(digest_size=DIGEST_SIZE, person=b"copier-content")
    h.update(len(partition_key).to_bytes(4, "big"))
    h.update(key_bytes(partition_key))
    h.update(data)
    return int.from_bytes(h.digest(), "little")


def identity_of(
    key: DedupKey, partition_key: str, data: bytes, typed: bool = True, count: KeyCount = CODE_POINTS
) -> int:
    """How a record is recognised in the target stream: ID digest, else content digest.

    The target holds the very bytes copier forwarded, so applying this to a
    target record gives the digest that was recorded for it in the intent.
    """
    found = extract_event_id(key, partition_key, data, count)
    if isinstance(found, EventId):
        return id_digest(found.value, typed)
    return content_digest(partition_key, data)
