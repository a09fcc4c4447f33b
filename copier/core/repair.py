"""Repairing a range: which of the events the audit finds lost a run puts back now, and what it makes of each.

Pure decisions (``docs/protocol.md``, "Repairing a range"); ``copier repair``
(``copier.commands.repair``) reads the streams, and the engine
(``copier.shard.source``) records, puts and commits each staging shard's lost
records under that shard's own repair item (``repair:<stream>/<shard>``).

An event is *lost* when the audit (``copier.core.audit``, as ``copier
verify`` runs it) finds no copy of it in the target or the dead-letter
stream while one of its staging copies lies at or before its shard's
committed position: the live copier has passed it. A run puts back the
lost events whose earliest staging copy arrived in the range asked for, as
the live copier would have put them (``copier.core.plan.becomes`` under the
current settings: the target, or the dead-letter stream for what the
settings send there), unless one of these holds (then it waits, said with
why, and a later run puts it):

* a staging copy of it is still ahead of the live copier (after its shard's
  committed position): the live copier may forward that copy itself;
* its earliest staging copy arrived before the *kept horizon* (now less the
  shorter of the target's and the dead-letter stream's retentions, plus the
  clock margin): a copy the live copier delivered may have expired there
  since, and the audit cannot tell that from a loss. Such an event is
  *unverifiable*, said, never put (putting it would deliver again an event
  consumers may have had);
* its producer may still retry it within the live dedup window, and the live
  shard's window does not know the repair put it (a running processor loads
  its window only when it takes a shard over): the live copier would forward
  the retry, a second copy. So a keyed event waits until the live shard its
  key goes to now has committed a record that arrived at least the window
  (and the clock margin) after the event's earliest copy: a retry within the
  window has arrived by then, and was forwarded (the event is not lost) or
  dropped (the live window knew it). A retry later than that is a late
  duplicate, forwarded by the live copier as any is (the window's horizon).

Records without an event ID are never deduplicated (each is an event of its
own, delivered at least once), so only the first rule applies to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from copier.core.audittypes import show
from copier.core.identity import EventValue
from copier.core.plan import BatchPlan, PlanSettings, SourceRecord, becomes
from copier.core.positions import Position
from copier.core.state import ShardState
from copier.core.window import DedupWindow

__all__ = ["Copy", "Decision", "LiveShard", "decide", "plan_repair"]


@dataclass(frozen=True)
class Copy:
    """One staging copy of an event: where it is, when it arrived, under which key."""

    shard_id: str
    position: Position
    arrival_ms: int
    partition_key: str


@dataclass(frozen=True)
class LiveShard:
    """What the live copier has done on a staging shard (its state item): its committed position (None: none yet)
    and the newest arrival it has committed (its window's)."""

    committed: Position | None
    newest_ms: int = 0


@dataclass(frozen=True)
class Decision:
    """One lost event in the range: the copy to put now (``put``), or why it waits (``why``, with the arrival the
    live shard must commit first, ``after_ms``, when that is what it waits for)."""

    event_id: EventValue | None
    first: Copy
    put: Copy | None
    why: str = ""
    after_ms: int | None = None
    unverifiable: bool = False  # past the kept horizon: never put, whatever a later run finds

    def what(self) -> str:
        named = f"event {show(self.event_id)}" if self.event_id is not None else "a record without an event ID"
        return f"{named} at staging {self.first.shard_id}@{self.first.position}"


def decide(
    keyed: Mapping[EventValue, Sequence[Copy]],
    unkeyed: Sequence[Copy],
    live: Mapping[str, LiveShard],
    key_shard: Callable[[str], str | None],
    window_ms: int,
    margin_ms: int,
    since_ms: int | None = None,
    until_ms: int | None = None,
    kept_since_ms: int | None = None,
) -> list[Decision]:
    """What becomes of each lost event of the range (``keyed``: each lost event ID's staging copies; ``unkeyed``:
    each lost record without an ID); ``key_shard``: the open staging shard a partition key goes to now;
    ``kept_since_ms``: the kept horizon (see the module docstring; None: none)."""
    out: list[Decision] = []

    def expired(first: Copy) -> Decision | None:
        """An event whose delivered copy may have expired since (it landed no earlier than ``first`` arrived)."""
        if kept_since_ms is None or first.arrival_ms >= kept_since_ms:
            return None
        why = "it arrived before the target's (or dead-letter stream's) retention: a copy delivered may have expired"
        return Decision(None, first, None, why, unverifiable=True)

    def in_range(first: Copy) -> bool:
        return (since_ms is None or first.arrival_ms >= since_ms) and (until_ms is None or first.arrival_ms < until_ms)

    for event_id, copies in keyed.items():
        first = min(copies, key=lambda c: (c.arrival_ms, c.shard_id, c.position))
        if not in_range(first):
            continue
        if (old := expired(first)) is not None:
            out.append(replace(old, event_id=event_id))
            continue
        ahead = next((c for c in copies if _ahead(c, live)), None)
        if ahead is not None:
            why = f"a staging copy at {ahead.shard_id}@{ahead.position} is still ahead of the live copier"
            out.append(Decision(event_id, first, None, why))
            continue
        if window_ms > 0:
            shard = key_shard(first.partition_key)
            after = first.arrival_ms + window_ms + margin_ms
            newest = live[shard].newest_ms if shard is not None and shard in live else 0
            if newest < after:
                why = (
                    f"its producer may still retry it within the live dedup window on {shard or 'its shard'}: put "
                    f"once the live copier has committed a record that arrived after {after} (ms)"
                )
                out.append(Decision(event_id, first, None, why, after))
                continue
        out.append(Decision(event_id, first, first))
    for copy in unkeyed:
        if not in_range(copy):
            continue
        if (old := expired(copy)) is not None:
            out.append(old)
        elif _ahead(copy, live):
            out.append(Decision(None, copy, None, "it is still ahead of the live copier"))
        else:
            out.append(Decision(None, copy, copy))
    return out


def _ahead(copy: Copy, live: Mapping[str, LiveShard]) -> bool:
    shard = live.get(copy.shard_id)
    return shard is None or shard.committed is None or copy.position > shard.committed


def plan_repair(
    records: Sequence[SourceRecord], state: ShardState, window: DedupWindow, settings: PlanSettings
) -> BatchPlan:
    """A repair chunk's plan (``copier.shard.pipeline.PlanRule``): each lost record as the live copier would have
    put it under the current settings. The audit decided what is lost: no replay, window or redo rule applies,
    and a redo set a killed run left is dropped (the run's audit, made after its verification, supersedes it)."""
    plan = BatchPlan()
    if not records:
        return plan
    for record in records:
        out = becomes(settings, record)
        if out.destination == "deadletter":
            plan.dead_lettered += 1
        plan.send.append(out)
    plan.last = max(r.position for r in records)
    plan.arrival_min_ms = min(r.arrival_ms for r in records)
    plan.arrival_max_ms = max(r.arrival_ms for r in records)
    return plan
