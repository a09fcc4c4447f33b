"""Planning a batch: which records to forward, which to drop, and why.

Pure decision logic: records, committed position, window and redo set in;
a :class:`BatchPlan` out. No I/O, no clock, no randomness, so the same input
always gives the same plan; a successor that re-plans a replayed batch makes
the same choices its predecessor made.

Rules, per record, in shard order:

1. at or below the committed position: a replay, dropped; arrived in staging
   before the application's start (``copier.core.startpoint``): dropped, its
   event ID learned by the window (``before_ids``) but never put;
2. inside the range of a verified in-flight batch (the *redo* range, see
   ``copier.core.recovery``): forwarded only if its identity, as the settings
   that recorded the batch saw it, is among those that did not land, once
   per recorded occurrence; otherwise it already landed or was dropped the
   first time. What it becomes now follows the current settings (a new
   dead-letter stream takes the record the old settings could not put);
3. keyed, and its event ID is in the window or earlier in this batch (or,
   while the window still holds IDs read under an earlier dedup key, its
   ID under that key is in the window): a duplicate, dropped; the second
   kind is listed apart (``BatchPlan.earlier_key_duplicates``): when the
   key was changed because the old one did not name one event, such a drop
   is a distinct event lost, and the caller says so;
4. unkeyed: forwarded as is (``unkeyedPolicy = forward``) or wrapped into a
   dead-letter envelope with the reason (``deadletter``);
5. a partition key Kinesis refuses (empty, a lone surrogate, or over 256
   code points: an aggregate's user record, which Kinesis never checked,
   can carry one; ``copier.core.limits``) or a record too large for the target:
   dead-lettered when a dead-letter stream is configured; otherwise an
   invalid key is replaced by a stable one derived from it
   (:func:`replacement_key`, so a key's records stay together and in order)
   and a record too large is forwarded and the put fails loudly, never
   skipped.

What a record *becomes* (destination, partition key, bytes, identity) is
:func:`becomes`, a function of the record and the :class:`PlanSettings`
alone; the settings travel with every digest batch (:meth:`PlanSettings.encode`)
so that a new owner with another configuration can verify and redo a chunk
in flight exactly as it was recorded.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from copier.core.config import DedupKey, parse_dedup_key
from copier.core.envelope import write_envelope
from copier.core.identity import EventId, EventValue, Unkeyed, content_digest, extract_event_id, id_digest
from copier.core.limits import (
    CODE_POINTS,
    MAX_PARTITION_KEY_CHARS,
    MAX_RECORD_BYTES,
    UTF16_UNITS,
    KeyCount,
    key_bytes,
    key_problem,
    record_size,
)
from copier.core.positions import Position
from copier.core.startpoint import NO_ARRIVAL
from copier.core.window import DedupWindow

__all__ = [
    "BatchPlan",
    "Outgoing",
    "PlanSettings",
    "Redo",
    "SourceRecord",
    "chunks",
    "dead_letter_envelope",
    "becomes",
    "plan_batch",
    "replacement_key",
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
    event_id: EventValue | None
    b64: str | None = None
    arrival_ms: int = 0  # the staging record's arrival: its age when it lands (copier.core.recordage)


@dataclass(frozen=True)
class PlanSettings:
    """The settings that decide what a record becomes; see :func:`becomes`.

    ``encode`` keeps what a digest batch must remember of them (the
    staging stream and shard are the item's own key).
    """

    dedup_key: DedupKey
    unkeyed_policy: Literal["forward", "deadletter"]
    dead_letter_stream: str | None
    stream_name: str
    shard_id: str
    target_stream: str = ""
    max_record_bytes: int = MAX_RECORD_BYTES  # the target's record limit
    dead_letter_max_bytes: int = MAX_RECORD_BYTES
    typed_ids: bool = True  # False: recorded by a version that read the integer 7 as the string "7"
    key_count: KeyCount = CODE_POINTS  # "utf-16": recorded by a version that counted keys in UTF-16 code units

    @property
    def dead_letter(self) -> bool:
        return self.dead_letter_stream is not None

    def encode(self) -> str:
        """The settings as a digest batch stores them (compact JSON). Cached (:func:`_encoded`): every chunk's
        batch stores them, and they change only with a stream's record limit."""
        return _encoded(self)

    @classmethod
    def decode(cls, text: str, stream_name: str, shard_id: str) -> PlanSettings:
        """What :meth:`encode` wrote; ValueError if it is not that."""
        try:
            raw = json.loads(text)
            policy = raw["u"]
            if policy not in ("forward", "deadletter"):
                raise ValueError(f"unkeyed policy {policy!r}")
            return cls(
                dedup_key=parse_dedup_key(raw["k"]),
                unkeyed_policy="deadletter" if policy == "deadletter" else "forward",
                dead_letter_stream=raw.get("d"),
                stream_name=stream_name,
                shard_id=shard_id,
                target_stream=str(raw.get("t", "")),
                max_record_bytes=int(raw.get("m", MAX_RECORD_BYTES)),
                dead_letter_max_bytes=int(raw.get("dm", MAX_RECORD_BYTES)),
                typed_ids=raw.get("i") == 1,  # absent: written before IDs were typed
                key_count=CODE_POINTS if raw.get("kc") == "cp" else UTF16_UNITS,  # absent: counted in UTF-16
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not stored plan settings: {text!r}") from exc


@functools.lru_cache(maxsize=16)
def _encoded(settings: PlanSettings) -> str:
    """:meth:`PlanSettings.encode`, once for each distinct settings."""
    return json.dumps(
        {
            "k": str(settings.dedup_key),
            "u": settings.unkeyed_policy,
            "d": settings.dead_letter_stream,
            "t": settings.target_stream,
            "m": settings.max_record_bytes,
            "dm": settings.dead_letter_max_bytes,
            "i": 1 if settings.typed_ids else 0,
            "kc": "cp" if settings.key_count == CODE_POINTS else "u16",
        },
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class Redo:
    """What is left to forward of a verified in-flight batch.

    Records up to and including ``last`` were planned by a previous owner;
    of those, only the ones whose identity is counted in ``digests`` (and as
    many times as counted) did not land and must still be forwarded.
    ``settings``: the settings those identities were computed under, when
    they differ from the current ones (a configuration change between
    owners); None when they are the current ones. ``suspect``: the
    verification could not see everything that may have landed (the
    target's retention had passed part of its range), so what is redone may
    be a copy: the caller reports it.
    """

    last: Position
    digests: Counter[int] = field(default_factory=Counter)
    settings: PlanSettings | None = None
    suspect: bool = False

    @property
    def empty(self) -> bool:
        return not +self.digests


@dataclass
class BatchPlan:
    """The outcome of planning one batch; ``last`` is None when nothing moved the position."""

    send: list[Outgoing] = field(default_factory=list)
    last: Position | None = None
    replays: int = 0
    duplicates: int = 0
    # of those, dropped only for an ID under an earlier dedup key (or ID typing) the window holds: a producer
    # retry of an event forwarded before the change, or, when the old key did not name one event, a loss
    earlier_key_duplicates: list[Position] = field(default_factory=list)
    already_landed: int = 0
    unkeyed: list[tuple[Position, str]] = field(default_factory=list)
    rerouted: list[tuple[Position, str]] = field(default_factory=list)  # dead-lettered or key replaced, and why
    dead_lettered: int = 0
    redo: Redo | None = None
    redo_missing: int = 0
    redo_sent: list[Outgoing] = field(default_factory=list)  # sent from the redo set
    redo_ids: dict[Position, int] = field(default_factory=dict)  # the redo settings' identity of each send
    arrival_min_ms: int = 0  # staging arrival range of the records planned (replays included)
    arrival_max_ms: int = 0
    before_start: int = 0  # records that arrived before the application's start: dropped
    before_ids: list[int] = field(default_factory=list)  # their event IDs' digests: the window learns them
    # identities the window learns besides the keyed sends' (stored with the dead-lettered IDs): a source other
    # than the live one names what it sent by them (a redrive: the digests of the dead-letter records it sent)
    learned: list[int] = field(default_factory=list)

    @property
    def keyed_digests(self) -> list[int]:
        """ID digests of the target entries with an event ID: what the window learns once committed."""
        return [o.identity for o in self.send if o.destination == "target" and o.event_id is not None]

    @property
    def unkeyed_digests(self) -> list[int]:
        """Content digests of the target entries without an event ID."""
        return [o.identity for o in self.send if o.destination == "target" and o.event_id is None]

    @property
    def deadletter_digests(self) -> list[int]:
        return [o.identity for o in self.send if o.destination == "deadletter"]

    @property
    def dead_ids(self) -> list[int]:
        """ID digests of the keyed events dead-lettered: the window learns them too (exactly once across both);
        and what else the plan says the window learns (``learned``)."""
        dead = [id_digest(o.event_id) for o in self.send if o.destination == "deadletter" and o.event_id is not None]
        return dead + self.learned if self.learned else dead

    def reroute(self, changes: Mapping[Position, Outgoing]) -> None:
        """Apply a re-plan (``copier.core.replan``): each changed entry takes its send's place."""
        for i, entry in enumerate(self.send):
            new = changes.get(entry.position)
            if new is not None:
                if new.destination == "deadletter" and entry.destination != "deadletter":
                    self.dead_lettered += 1
                self.send[i] = new
        self.redo_sent = [changes.get(o.position, o) for o in self.redo_sent]

    def in_batch_order(self) -> list[Outgoing]:
        """The sends in the order a digest batch stores their digests: keyed, unkeyed, dead-lettered."""
        keyed = [o for o in self.send if o.destination == "target" and o.event_id is not None]
        unkeyed = [o for o in self.send if o.destination == "target" and o.event_id is None]
        return keyed + unkeyed + [o for o in self.send if o.destination == "deadletter"]


def replacement_key(partition_key: str) -> str:
    """A valid partition key standing in for one Kinesis refuses: stable, so a key's records stay together."""
    raw = key_bytes(partition_key)
    return "copier-" + hashlib.blake2b(raw, digest_size=16, person=b"copier-pkey").hexdigest()


def dead_letter_envelope(settings: PlanSettings, record: SourceRecord, reason: str) -> bytes:
    """The JSON a dead-letter record carries (``copier.core.envelope.write_envelope``): why, where from, and the
    original bytes, or their SHA-256 when the dead-letter stream's limit cannot hold them (counted with the key
    the envelope goes under: the replacement key for a key Kinesis refuses)."""
    problem = key_problem(record.partition_key, settings.key_count)
    key = record.partition_key if problem is None else replacement_key(record.partition_key)
    where = (settings.stream_name, settings.shard_id, record.position)
    return write_envelope(
        reason, where, record.partition_key, record.arrival_ms, record.data, key, settings.dead_letter_max_bytes
    )


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
    older_keys: Sequence[tuple[DedupKey, bool]] = (),
    start_ms: int | None = None,
) -> BatchPlan:
    """Decide every record of a batch; see the module docstring for the rules.

    ``older_keys``: dedup keys other than the current one whose IDs the
    window still holds (a configuration changed within the window), each
    with whether its IDs were typed (False: recorded by a version that
    read the integer 7 as the string "7"). ``start_ms``: the application's start; what arrived
    before it is not forwarded (None: no start); a record without an arrival time is never before it.

    Written for speed as much as for reading: it runs once per record at
    tens of thousands of records a second, so the common case (a keyed
    record with a valid key forwarded as is) takes no detour.
    """
    plan = BatchPlan()
    if not records:
        return plan
    seen: set[int] = set()
    left: Counter[int] = Counter(redo.digests) if redo else Counter()
    redo_last = redo.last if redo else None
    redo_settings = redo.settings if redo else None
    limit = settings.max_record_bytes
    count = settings.key_count
    send = plan.send
    last = committed
    low = high = records[0].arrival_ms
    for record in records:
        arrival = record.arrival_ms
        if arrival < low:
            low = arrival
        elif arrival > high:
            high = arrival
        if arrival > window.newest_ms:
            window.advance(arrival)  # as of this record: a later one in the chunk must not expire what it needs
        position = record.position
        if last is not None and position <= last:
            plan.replays += 1  # the daemon repeats nothing within a batch, but a repeat must not go twice
            continue
        last = position
        partition_key, data = record.partition_key, record.data
        found = extract_event_id(settings.dedup_key, partition_key, data, count)
        if start_ms is not None and arrival < start_ms and arrival != NO_ARRIVAL:  # none: never before the start
            plan.before_start += 1
            if type(found) is EventId:  # a retry of it later in this chunk is a duplicate too
                before = id_digest(found.value, settings.typed_ids)
                plan.before_ids.append(before)
                seen.add(before)
            continue
        in_redo = redo_last is not None and position <= redo_last
        keyed = type(found) is EventId
        identity = id_digest(found.value, settings.typed_ids) if keyed else 0  # type: ignore[union-attr]
        if not in_redo:
            if keyed and (identity in seen or identity in window):
                plan.duplicates += 1
                continue
            if older_keys and _seen_under(older_keys, partition_key, data, window):
                plan.duplicates += 1
                plan.earlier_key_duplicates.append(position)
                continue
        # The common case inline; the rest (dead letters, odd keys, size) in becomes().
        valid_key = (partition_key.isascii() and 0 < len(partition_key) <= MAX_PARTITION_KEY_CHARS) or (
            key_problem(partition_key, count) is None
        )
        if keyed and valid_key and len(data) + 4 * len(partition_key) <= limit:  # 4: the most UTF-8 a character
            event_id = found.value  # type: ignore[union-attr]
            out = Outgoing(position, "target", partition_key, data, identity, event_id, record.b64, arrival)
        else:
            out = becomes(settings, record, found)
        if in_redo:
            # Planned before by an owner whose in-flight batch was verified.
            if redo_settings is None:
                redo_id = out.identity
            else:
                redo_id = becomes(redo_settings, record).identity
            if left[redo_id] <= 0:
                plan.already_landed += 1
                continue
            left[redo_id] -= 1
            if keyed and identity in seen:
                plan.duplicates += 1  # the same event twice under the current dedup key: sent once
                continue
            plan.redo_sent.append(out)
        elif not keyed:
            plan.unkeyed.append((position, found.reason))  # type: ignore[union-attr]
        if redo_settings is not None:
            plan.redo_ids[position] = becomes(redo_settings, record).identity
        if keyed:
            seen.add(identity)
        if out.destination == "deadletter":
            plan.dead_lettered += 1
        if out.destination == "deadletter" or out.partition_key != partition_key:
            plan.rerouted.append((position, _why(settings, record, found)))
        send.append(out)
    plan.last = last if last != committed else None
    plan.arrival_min_ms, plan.arrival_max_ms = low, high
    if redo is not None:
        reached = plan.last is not None and plan.last >= redo.last
        plan.redo = None if reached else Redo(redo.last, +left, redo.settings, redo.suspect)
        plan.redo_missing = sum((+left).values()) if reached else 0
    return plan


def _seen_under(keys: Sequence[tuple[DedupKey, bool]], partition_key: str, data: bytes, window: DedupWindow) -> bool:
    """Is the record's ID under one of ``keys`` in the window (forwarded while that key was configured)?"""
    for key, typed in keys:
        found = extract_event_id(key, partition_key, data)
        if type(found) is EventId and id_digest(found.value, typed) in window:
            return True
    return False


def _why(settings: PlanSettings, record: SourceRecord, found: EventId | Unkeyed) -> str:
    """Why a record goes out otherwise than as it came: the first reason that applies (see :func:`becomes`)."""
    problem = key_problem(record.partition_key, settings.key_count)
    if problem is not None:
        return problem
    size = record_size(record.partition_key, record.data)
    if size > settings.max_record_bytes:
        return f"record of {size} bytes exceeds the target's limit of {settings.max_record_bytes} bytes"
    if isinstance(found, Unkeyed):
        return f"no event ID: {found.reason}"
    return "forwarded as is"


def becomes(settings: PlanSettings, record: SourceRecord, found: EventId | Unkeyed | None = None) -> Outgoing:
    """What a record becomes under ``settings``: to the target as is (or under a replacement key), or to the
    dead-letter stream in an envelope; with the digest that recognises it there.

    A function of the record and the settings alone, so that a later owner
    can recompute, under the settings a digest batch recorded, the identity
    an earlier owner gave a record.
    """
    if found is None:
        found = extract_event_id(settings.dedup_key, record.partition_key, record.data, settings.key_count)
    event_id = found.value if isinstance(found, EventId) else None
    problem = key_problem(record.partition_key, settings.key_count)
    oversize = record_size(record.partition_key, record.data) > settings.max_record_bytes
    unwanted = event_id is None and settings.unkeyed_policy == "deadletter"
    if settings.dead_letter and (problem is not None or oversize or unwanted):
        envelope = dead_letter_envelope(settings, record, _why(settings, record, found))
        key = replacement_key(record.partition_key) if problem is not None else record.partition_key
        digest = content_digest(key, envelope)
        return Outgoing(record.position, "deadletter", key, envelope, digest, event_id, None, record.arrival_ms)
    key = replacement_key(record.partition_key) if problem is not None else record.partition_key
    identity = id_digest(event_id, settings.typed_ids) if event_id is not None else content_digest(key, record.data)
    b64 = record.b64 if problem is None else None
    return Outgoing(record.position, "target", key, record.data, identity, event_id, b64, record.arrival_ms)
