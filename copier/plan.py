"""Planning a batch: which records to forward, which to drop, and why.

Pure decision logic: records, committed position, window and redo set in;
a :class:`BatchPlan` out. No I/O, no clock, no randomness, so the same input
always gives the same plan; a successor that re-plans a replayed batch makes
the same choices its predecessor made.

Rules, per record, in shard order:

1. at or below the committed position: a replay, dropped;
2. inside the range of a verified in-flight batch (the *redo* range, see
   ``copier.recovery``): forwarded only if its identity is among those that
   did not land, once per recorded occurrence; otherwise it already landed or
   was dropped the first time;
3. keyed, and its event ID is in the window or earlier in this batch: a
   duplicate, dropped;
4. unkeyed: forwarded as is (``unkeyedPolicy = forward``) or wrapped into a
   dead-letter envelope with the reason (``deadletter``);
5. too large for the target: dead-lettered (a dead-letter stream must be
   configured, else it is forwarded and the put fails loudly, never skipped).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from copier.config import DedupKey
from copier.identity import EventId, content_digest, extract_event_id, id_digest
from copier.limits import MAX_RECORD_BYTES, record_size
from copier.positions import Position
from copier.window import DedupWindow

__all__ = [
    "BatchPlan",
    "Outgoing",
    "PlanSettings",
    "Redo",
    "SourceRecord",
    "chunks",
    "dead_letter_envelope",
    "plan_batch",
]

Destination = Literal["target", "deadletter"]


class SourceRecord(NamedTuple):
    """One (de-aggregated) staging record as the daemon delivers it.

    ``b64``: the data as the daemon sent it, in base64, when at hand: a record
    forwarded unchanged goes out in it, without being encoded again.
    """

    position: Position
    partition_key: str
    data: bytes
    arrival_ms: int = 0
    b64: str | None = None


class Outgoing(NamedTuple):
    """One record to put, with the digest that recognises it in its stream."""

    position: Position
    destination: Destination
    partition_key: str
    data: bytes
    identity: int
    event_id: str | None
    b64: str | None = None


@dataclass(frozen=True)
class Redo:
    """What is left to forward of a verified in-flight batch.

    Records up to and including ``last`` were planned by a previous owner;
    of those, only the ones whose identity is counted in ``digests`` (and as
    many times as counted) did not land and must still be forwarded.
    """

    last: Position
    digests: Counter[int] = field(default_factory=Counter)

    @property
    def empty(self) -> bool:
        return not +self.digests


@dataclass(frozen=True)
class PlanSettings:
    dedup_key: DedupKey
    unkeyed_policy: Literal["forward", "deadletter"]
    dead_letter: bool
    stream_name: str
    shard_id: str


@dataclass
class BatchPlan:
    """The outcome of planning one batch; ``last`` is None when nothing moved the position."""

    send: list[Outgoing] = field(default_factory=list)
    last: Position | None = None
    replays: int = 0
    duplicates: int = 0
    already_landed: int = 0
    unkeyed: list[tuple[Position, str]] = field(default_factory=list)
    dead_lettered: int = 0
    redo: Redo | None = None
    redo_missing: int = 0
    arrival_min_ms: int = 0  # staging arrival range of the records planned (replays included)
    arrival_max_ms: int = 0

    @property
    def keyed_digests(self) -> list[int]:
        """ID digests of the target entries with an event ID: what the window learns once committed."""
        return [o.identity for o in self.send if o.destination == "target" and o.event_id is not None]

    @property
    def unkeyed_digests(self) -> list[int]:
        """Content digests of the target entries without an event ID (only to verify the put)."""
        return [o.identity for o in self.send if o.destination == "target" and o.event_id is None]

    @property
    def deadletter_digests(self) -> list[int]:
        return [o.identity for o in self.send if o.destination == "deadletter"]


def dead_letter_envelope(settings: PlanSettings, record: SourceRecord, reason: str) -> bytes:
    """The JSON a dead-letter record carries: why, where from, and the original bytes.

    An envelope that would exceed the Kinesis record limit keeps the SHA-256
    of the payload instead of the payload; the record stays readable in the
    staging stream at the position given, within its retention.
    """
    body = {
        "reason": reason,
        "stream": settings.stream_name,
        "shardId": settings.shard_id,
        "sequenceNumber": record.position.seq_str,
        "subSequenceNumber": record.position.subseq,
        "partitionKey": record.partition_key,
        "approximateArrivalTimestamp": record.arrival_ms,
        "data": base64.b64encode(record.data).decode("ascii"),
    }
    encoded = json.dumps(body, separators=(",", ":")).encode()
    if record_size(record.partition_key, encoded) > MAX_RECORD_BYTES:
        body["data"] = None
        body["dataTruncated"] = True
        body["dataSha256"] = hashlib.sha256(record.data).hexdigest()
        encoded = json.dumps(body, separators=(",", ":")).encode()
    return encoded


def chunks(records: Sequence[SourceRecord], size: int) -> list[Sequence[SourceRecord]]:
    """Consecutive slices of at most ``size`` records: each is planned, recorded and committed alone.

    A KPL-aggregated GetRecords can deliver tens of thousands of events in
    one batch; bounding the chunk bounds the digest batch (10 bytes an event,
    under DynamoDB's 400 KB item limit), the redo set, and the work a crash
    can leave in flight. Any split is valid: positions are totally ordered
    and a chunk commits everything up to its last record.
    """
    return [records[i : i + size] for i in range(0, len(records), size)] if records else []


def plan_batch(
    records: Sequence[SourceRecord],
    committed: Position | None,
    window: DedupWindow,
    redo: Redo | None,
    settings: PlanSettings,
) -> BatchPlan:
    """Decide every record of a batch; see the module docstring for the rules.

    Written for speed as much as for reading: it runs once per record at
    tens of thousands of records a second, so the common case (a keyed
    record forwarded as is) takes no detour through the dead-letter rules.
    """
    plan = BatchPlan()
    if not records:
        return plan
    seen: set[int] = set()
    left: Counter[int] = Counter(redo.digests) if redo else Counter()
    redo_last = redo.last if redo else None
    dead_letter = settings.dead_letter  # the dead-letter rules apply only with a dead-letter stream
    send = plan.send
    last = committed
    low = high = records[0].arrival_ms
    for record in records:
        arrival = record.arrival_ms
        if arrival < low:
            low = arrival
        elif arrival > high:
            high = arrival
        position = record.position
        if last is not None and position <= last:
            plan.replays += 1  # the daemon repeats nothing within a batch, but a repeat must not go twice
            continue
        last = position
        partition_key, data = record.partition_key, record.data
        found = extract_event_id(settings.dedup_key, partition_key, data)
        in_redo = redo_last is not None and position <= redo_last
        if type(found) is EventId:
            event_id: str | None = found.value
            identity = id_digest(found.value)
            if identity in seen or (not in_redo and identity in window):
                plan.duplicates += 1
                continue
            seen.add(identity)
            reason = None
        else:
            event_id, reason = None, found.reason  # type: ignore[union-attr]
            identity = content_digest(partition_key, data)
        # the size check needs the key's UTF-8 length only when the record is near the limit
        near_limit = len(data) + 4 * len(partition_key) > MAX_RECORD_BYTES
        if dead_letter and (reason is not None or near_limit):
            out = _outgoing(settings, record, identity, event_id, reason)
        else:
            out = Outgoing(position, "target", partition_key, data, identity, event_id, record.b64)
        if in_redo:
            # Planned before by an owner whose in-flight batch was verified.
            if left[out.identity] <= 0:
                plan.already_landed += 1
                continue
            left[out.identity] -= 1
        elif reason is not None:
            plan.unkeyed.append((position, reason))
        if out.destination == "deadletter":
            plan.dead_lettered += 1
        send.append(out)
    plan.last = last if last != committed else None
    plan.arrival_min_ms, plan.arrival_max_ms = low, high
    if redo is not None:
        reached = plan.last is not None and plan.last >= redo.last
        plan.redo = None if reached else Redo(redo.last, +left)
        plan.redo_missing = sum((+left).values()) if reached else 0
    return plan


def _outgoing(
    settings: PlanSettings, record: SourceRecord, identity: int, event_id: str | None, reason: str | None
) -> Outgoing:
    """The record as it goes out when a dead-letter stream is configured: as is to the target, or in an envelope."""
    oversize = record_size(record.partition_key, record.data) > MAX_RECORD_BYTES
    if oversize:
        why = "record exceeds the target's size limit"
    elif reason is not None and settings.unkeyed_policy == "deadletter":
        why = f"no event ID: {reason}"
    else:
        return Outgoing(record.position, "target", record.partition_key, record.data, identity, event_id, record.b64)
    envelope = dead_letter_envelope(settings, record, why)
    identity = content_digest(record.partition_key, envelope)
    return Outgoing(record.position, "deadletter", record.partition_key, envelope, identity, None)
