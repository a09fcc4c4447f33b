"""A dead-letter record: the envelope copier writes (:func:`write_envelope`), and one read back, or why it is not one.

One reader for everything that reads the dead-letter stream: the audit
(``copier.core.auditinputs.read_envelope``) and the redrive
(``copier.core.redrive``). An envelope says why the record was dead-lettered
(``reason``, whose kind :func:`reason_kind` names), where it was in staging
(``stream``, ``shardId``, ``sequenceNumber``, ``subSequenceNumber``), its
partition key and staging arrival, and its bytes: in base64 (``data``), or,
when they did not fit the dead-letter stream's record limit, only their
SHA-256 (``dataTruncated``, ``dataSha256``): the record stays readable in
staging at that position while staging retains it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, replace

from copier.core.limits import record_size
from copier.core.positions import Position

__all__ = ["REASON_KINDS", "Envelope", "read_envelope_bytes", "reason_kind", "write_envelope"]

#: Reason kind -> what an envelope's reason says (``copier.core.plan``): no event ID under
#: ``unkeyedPolicy = deadletter``, a record over the target's limit, a partition key Kinesis refuses.
REASON_KINDS = {"no_id": "no event ID", "oversize": "exceeds", "key": "partition key"}
_FIELDS = ("reason", "stream", "shardId", "sequenceNumber", "subSequenceNumber", "partitionKey")


def write_envelope(
    reason: str,
    where: tuple[str, str, Position],
    partition_key: str,
    arrival_ms: int,
    data: bytes,
    key: str,
    max_bytes: int,
) -> bytes:
    """The JSON a dead-letter record carries: why, where from (staging stream, shard, position), and the
    original bytes.

    An envelope that would exceed the dead-letter stream's record limit (``max_bytes``, counted with ``key``,
    the partition key it goes under) keeps the SHA-256 of the payload instead of the payload; the record stays
    readable in the staging stream at the position given, within its retention.
    """
    stream, shard_id, position = where
    body: dict[str, object] = {
        "reason": reason,
        "stream": stream,
        "shardId": shard_id,
        "sequenceNumber": position.seq_str,
        "subSequenceNumber": position.subseq,
        "partitionKey": partition_key,
        "approximateArrivalTimestamp": arrival_ms,
        "data": base64.b64encode(data).decode("ascii"),
    }
    encoded = json.dumps(body, separators=(",", ":")).encode()  # ASCII: a lone surrogate is written \ud800
    if record_size(key, encoded) > max_bytes:
        body["data"] = None
        body["dataTruncated"] = True
        body["dataSha256"] = hashlib.sha256(data).hexdigest()
        encoded = json.dumps(body, separators=(",", ":")).encode()
    return encoded


def reason_kind(reason: str) -> str | None:
    """The kind of an envelope's reason (``no_id``, ``oversize``, ``key``), None for a reason copier never writes."""
    for kind, text in REASON_KINDS.items():
        if text in reason:
            return kind
    return None


@dataclass(frozen=True)
class Envelope:
    """A dead-letter record's envelope; ``problem`` says why it is not one (then nothing else is set)."""

    problem: str | None = None
    reason: str = ""
    stream: str = ""
    shard_id: str = ""
    position: Position = Position(0)
    partition_key: str = ""
    arrival_ms: int = 0  # the original's staging arrival (0: the envelope does not say)
    data: bytes | None = None  # the original bytes; None when only their SHA-256 was kept
    sha256: str | None = None  # dataSha256, when the bytes were not kept

    @property
    def kind(self) -> str | None:
        return reason_kind(self.reason)


def read_envelope_bytes(data: bytes) -> Envelope:
    """A dead-letter record's bytes as an envelope, or why they are not one (never raises)."""
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return Envelope("not a dead-letter envelope (not JSON)")
    if not isinstance(body, dict):
        return Envelope("not a dead-letter envelope (not a JSON object)")
    missing = [f for f in _FIELDS if f not in body]
    if missing:
        return Envelope(f"not a dead-letter envelope (no {', '.join(missing)})")
    try:
        position = Position(int(body["sequenceNumber"]), int(body["subSequenceNumber"]))
    except (TypeError, ValueError):
        return Envelope("its source position is not a position")
    arrival = body.get("approximateArrivalTimestamp")
    found = Envelope(
        reason=str(body["reason"]),
        stream=str(body["stream"]),
        shard_id=str(body["shardId"]),
        position=position,
        partition_key=str(body["partitionKey"]),
        arrival_ms=arrival if isinstance(arrival, int) and not isinstance(arrival, bool) else 0,
    )
    encoded = body.get("data")
    if isinstance(encoded, str):
        try:
            return replace(found, data=base64.b64decode(encoded, validate=True))
        except binascii.Error:
            return Envelope("its data is not base64")
    if body.get("dataTruncated") and isinstance(body.get("dataSha256"), str):
        return replace(found, sha256=body["dataSha256"])
    return Envelope("neither data nor dataSha256")
