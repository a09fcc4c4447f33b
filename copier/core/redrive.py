"""Redriving the dead-letter stream: which dead-letter records a run sends on to the target, and which it does not.

Pure decisions (``docs/protocol.md``, "Redriving the dead-letter stream"); the
engine (``copier.shard.source``) records, puts and commits what
:class:`RedriveRule` plans, as it does a staging chunk, one dead-letter shard
at a time, under that shard's own state item (``redrive:<stream>/<shard>``).

What identifies what was redriven. A run may select records by time range,
reason and staging shard, and a later run may select others; so a committed
position per dead-letter shard cannot say what was sent (a record a run did
not select must stay redrivable). Records are remembered by identity
instead, in the shard's window, whose horizon is the dead-letter stream's
retention (a record older than that can no longer be read, nor sent again):

* every record sent is remembered by its own digest, the content digest of
  its partition key and envelope bytes (``letter``: unique, since an
  envelope names its staging position), stored with the dead-lettered IDs
  (``BatchPlan.learned``); two identical envelopes (a frozen processor's late
  copy of a dead-letter put, reported by the live copier) are one record, sent
  once, in one chunk as across chunks;
* a keyed event is also remembered by its event ID (the target entry's
  identity, as any forwarded event): two dead-letter records of one event
  (a producer retry beyond the live window, dead-lettered twice) are sent once.

Positions serve only the chunk in flight: a digest batch recorded and not
committed (a run killed or fenced mid-put) is verified by the next run
(``copier.shard.inflight``), and what it did not find in the target joins the
redo set, in letters: those records are sent whatever the next run selects,
once each, since the run that recorded them had selected them.

What is not sent, and why (each counted and listed in the run's summary,
never dead-lettered again, so nothing loops):

* not selected; not an envelope; sent already (this record, or another
  record of the same event);
* *fails again*: its partition key is still one Kinesis refuses, or it is
  still over the target's record limit (raise it first: ``UpdateMaxRecordSize``);
* *not redrivable*: an envelope that kept only the SHA-256 of its bytes
  (``dataTruncated``) whose record staging no longer holds (or holds with
  other bytes) at the position it names; the command reads such records back
  from staging (``payloads``) before the chunk is planned.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from copier.core.audittypes import show
from copier.core.envelope import Envelope, read_envelope_bytes
from copier.core.identity import EventId, EventValue, content_digest, extract_event_id, id_digest
from copier.core.limits import key_problem, record_size
from copier.core.plan import BatchPlan, Outgoing, PlanSettings, Redo, SourceRecord
from copier.core.positions import Position
from copier.core.state import ShardState
from copier.core.window import DedupWindow

__all__ = ["Missed", "RedriveRule", "RedriveTally", "Selection", "letter_digest", "needs_payload"]

EXAMPLES = 5


@dataclass(frozen=True)
class Selection:
    """Which dead-letter records a run sends: by the original's staging arrival (``since_ms`` included,
    ``until_ms`` not), reason kind (``copier.core.envelope.REASON_KINDS``) and staging shard; empty: any."""

    since_ms: int | None = None
    until_ms: int | None = None
    reasons: frozenset[str] = frozenset()
    shards: frozenset[str] = frozenset()

    def holds(self, envelope: Envelope) -> bool:
        if self.reasons and envelope.kind not in self.reasons:
            return False
        if self.shards and envelope.shard_id not in self.shards:
            return False
        if self.since_ms is not None and envelope.arrival_ms < self.since_ms:
            return False
        return self.until_ms is None or envelope.arrival_ms < self.until_ms


def letter_digest(partition_key: str, data: bytes) -> int:
    """A dead-letter record's own identity: the content digest of its key and envelope bytes (what the audit
    calls its ``content``, ``copier.core.auditinputs.read_envelope``)."""
    return content_digest(partition_key, data)


def needs_payload(envelope: Envelope, selection: Selection, redo_pending: bool) -> bool:
    """Must the command read this record's bytes back from staging before its chunk is planned? (An envelope
    without them, that the run may send: selected, or any while a redo set is pending.)"""
    return envelope.problem is None and envelope.data is None and (redo_pending or selection.holds(envelope))


@dataclass(frozen=True)
class Missed:
    """A selected dead-letter record a run could not send, and why."""

    where: str  # the dead-letter record: <shard>@<sequence number>
    staging: str  # the original: <staging shard>@<sequence number>/<sub-sequence number>
    event_id: EventValue | None
    kind: str | None
    why: str

    def what(self) -> str:
        """The record, as a summary names it."""
        named = f"event {show(self.event_id)}" if self.event_id is not None else "a record without an event ID"
        return f"{named} ({self.kind or 'unknown reason'}) from staging {self.staging}, dead-letter {self.where}"

    def line(self) -> str:
        return f"{self.what()}: {self.why}"


@dataclass
class RedriveTally:
    """What a run (or a dry run) found, beside what it sent: its summary."""

    read: int = 0  # dead-letter records read
    not_envelopes: int = 0
    selected: int = 0
    sent: Counter[str] = field(default_factory=Counter)  # by reason kind
    resumed: int = 0  # of those, records a killed or fenced run had recorded and not landed (the redo set)
    already: int = 0  # selected, and sent already (by an earlier run, or as another record of the same event)
    failed_again: list[Missed] = field(default_factory=list)
    not_redrivable: list[Missed] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)  # by reason kind: what is sent

    @property
    def missed(self) -> list[Missed]:
        return self.failed_again + self.not_redrivable


class RedriveRule:
    """The plan of a redrive chunk (``copier.shard.pipeline.PlanRule``); see the module docstring.

    ``payloads``: the bytes of envelopes that kept only their SHA-256, read back from staging by the command,
    by dead-letter position (None: staging no longer has them). ``tally`` adds up every chunk planned.
    """

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.payloads: dict[Position, bytes | None] = {}
        self.tally = RedriveTally()

    def __call__(
        self, records: Sequence[SourceRecord], state: ShardState, window: DedupWindow, settings: PlanSettings
    ) -> BatchPlan:
        plan = BatchPlan()
        if not records:
            return plan
        tally = self.tally
        left: Counter[int] = Counter(state.redo_digests)  # letters a verified chunk did not find in the target
        seen: set[int] = set()  # event IDs sent in this chunk
        sent: set[int] = set()  # letters sent in this chunk (the window learns them only once it is committed)
        low = high = records[0].arrival_ms
        for record in records:
            low, high = min(low, record.arrival_ms), max(high, record.arrival_ms)
            if record.arrival_ms > window.newest_ms:
                window.advance(record.arrival_ms)
            plan.last = record.position
            tally.read += 1
            envelope = read_envelope_bytes(record.data)
            if envelope.problem is not None:
                tally.not_envelopes += 1
                continue
            letter = letter_digest(record.partition_key, record.data)
            resumed = left[letter] > 0
            if not (resumed or self.selection.holds(envelope)):
                continue
            tally.selected += 1
            if not resumed and (letter in window or letter in sent):  # this very record was sent
                tally.already += 1
                plan.duplicates += 1
                continue
            out = self._outgoing(record, envelope, settings)
            if out is None:
                continue
            if out.event_id is not None:
                if not resumed and (out.identity in seen or out.identity in window):
                    tally.already += 1
                    plan.duplicates += 1
                    continue
                seen.add(out.identity)
            if resumed:
                left[letter] -= 1
                tally.resumed += 1
            plan.send.append(out)
            plan.learned.append(letter)
            sent.add(letter)
            plan.redo_ids[record.position] = letter
            kind = envelope.kind or "unknown"
            tally.sent[kind] += 1
            shown = tally.examples.setdefault(kind, [])
            if len(shown) < EXAMPLES:
                shown.append(_missed(record, envelope, settings, out.event_id, "").what())
        plan.arrival_min_ms, plan.arrival_max_ms = low, high
        if +left:
            plan.redo = Redo(state.redo_last or records[-1].position, +left)
        return plan

    def _outgoing(self, record: SourceRecord, envelope: Envelope, settings: PlanSettings) -> Outgoing | None:
        """What the dead-letter record sends to the target: the original's key and bytes as staging had them;
        None (counted, listed) when it cannot be sent."""
        data = envelope.data
        if data is None:
            data = self.payloads.get(record.position)
            if data is not None and hashlib.sha256(data).hexdigest() != envelope.sha256:
                data = None
            if data is None:
                why = "its envelope kept only the SHA-256 of its bytes, and staging no longer holds them there"
                self.tally.not_redrivable.append(_missed(record, envelope, settings, None, why))
                return None
        found = extract_event_id(settings.dedup_key, envelope.partition_key, data, settings.key_count)
        event_id = found.value if isinstance(found, EventId) else None
        problem = key_problem(envelope.partition_key, settings.key_count)
        size = record_size(envelope.partition_key, data)
        if problem is None and size > settings.max_record_bytes:
            problem = f"a record of {size} bytes, over the target's limit of {settings.max_record_bytes} bytes"
        if problem is not None:
            self.tally.failed_again.append(_missed(record, envelope, settings, event_id, f"fails again: {problem}"))
            return None
        if event_id is not None:
            identity = id_digest(event_id, settings.typed_ids)
        else:
            identity = content_digest(envelope.partition_key, data)
        return Outgoing(record.position, "target", envelope.partition_key, data, identity, event_id)


def _missed(
    record: SourceRecord, envelope: Envelope, settings: PlanSettings, event_id: EventValue | None, why: str
) -> Missed:
    return Missed(
        where=f"{settings.shard_id}@{record.position.seq_str}",
        staging=f"{envelope.shard_id}@{envelope.position}",
        event_id=event_id,
        kind=envelope.kind,
        why=why,
    )
