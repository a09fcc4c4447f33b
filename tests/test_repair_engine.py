"""``copier repair`` in process, on the fakes of ``copier.testing`` and a fake clock: what it makes of events whose
delivered copy may have expired from the target, and of events before the application's start."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from copier.commands.repair import RepairRun
from copier.core.config import Config
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.repair import Copy, LiveShard, decide
from copier.shard.source import SourceShard
from copier.shard.worker import ShardWorker
from copier.testing import FakeClock, InMemoryStateStore, InMemoryStreams
from tests.support.fakes import config
from tests.support.readers import FakeReader

SHARD = "shardId-000000000000"
HOUR = 3_600_000


def event(n: int, arrival_ms: int, seq: int | None = None) -> SourceRecord:
    return SourceRecord(Position(seq or n), f"k-{n}", json.dumps({"eventId": f"e{n}"}).encode(), arrival_ms)


@dataclass
class Copier:
    """A staging shard, a live copier forwarding part of it, and repairs of a range."""

    config: Config = field(default_factory=config)
    retention_ms: dict[str, int] = field(default_factory=dict)
    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.store = InMemoryStateStore(self.clock)
        self.streams = InMemoryStreams(self.clock, retention_ms=self.retention_ms)
        self.live = ShardWorker(self.config, self.store, self.streams, clock=self.clock, owner="live")
        self.live.initialize(SHARD)

    def staged(self, records: list[SourceRecord], forward: bool = True) -> None:
        """Records that reach staging; the live copier is delivered them (or not: a daemon started past them)."""
        self.streams.add_staging(SHARD, records)
        if forward:
            self.live.process(records)

    def repair(self, since_ms: int, until_ms: int, owner: str = "repair") -> RepairRun:
        def shard(*args: Any, **kwargs: Any) -> SourceShard:
            return SourceShard(*args, clock=self.clock, owner=owner, **kwargs)

        reader = FakeReader(self.streams)
        run = RepairRun(self.config, self.store, self.streams, reader, reader, since_ms, until_ms, make_shard=shard)
        run.clock = self.clock
        self.final = run.run()
        return run

    def target(self) -> Counter[str]:
        """What the target holds now (within its retention)."""
        reader = FakeReader(self.streams)
        shards = [s["ShardId"] for s in reader.shards("target")]
        return Counter(json.loads(r["Data"])["eventId"] for s in shards for r in reader.records("target", s))


def test_an_event_whose_target_copy_expired_is_unverifiable_and_never_put_again() -> None:
    """The target keeps records a day, staging a week. Events forwarded 30 hours ago have left the target; the audit
    cannot tell them from lost ones, and a repair of their range says so and puts nothing (before, it put each
    again, a second delivery consumers may have had, and a third a day later). An event the live copier skipped
    within the target's retention is still put back."""
    world = Copier(retention_ms={"staging": 7 * 24 * HOUR, "target": 24 * HOUR})
    t0 = world.clock.now_ms()
    world.staged([event(n, t0 + n) for n in (1, 2, 3)])
    world.clock.advance(30 * HOUR)
    now = world.clock.now_ms()
    world.staged([event(4, now, seq=4)], forward=False)  # skipped: lost, within the target's retention
    world.clock.advance(2 * HOUR)
    world.staged([event(5, world.clock.now_ms(), seq=5)])  # the live copier goes on past it
    assert world.target() == Counter({"e5": 1}), "the first three expired from the target"
    run = world.repair(t0 - HOUR, world.clock.now_ms())
    assert world.target() == Counter({"e4": 1, "e5": 1})
    assert sorted(str(d.event_id) for d in run.decisions if d.unverifiable) == ["e1", "e2", "e3"]
    summary = "\n".join(run.summary(None))
    assert "unverifiable, not put" in summary and "unverifiable: event e1" in summary
    world.clock.advance(25 * HOUR)
    assert world.target() == Counter(), "a day later every copy expired from the target"
    again = world.repair(t0 - HOUR, world.clock.now_ms(), owner="repair-2")
    assert again.put == 0 and world.target() == Counter()
    assert sorted(str(d.event_id) for d in again.decisions if d.unverifiable) == ["e1", "e2", "e3", "e4", "e5"]


def test_the_kept_horizon_holds_back_keyed_and_unkeyed_events_alike() -> None:
    """``decide``: a lost event whose earliest copy arrived before the kept horizon is unverifiable, never put,
    whatever else holds of it; one at the horizon goes."""
    t0 = 1_700_000_000_000
    live = {SHARD: LiveShard(Position(10), t0 + 3 * HOUR)}
    lost = {"old": [Copy(SHARD, Position(1), t0 - 1, "k")], "new": [Copy(SHARD, Position(2), t0, "k")]}
    unkeyed = [Copy(SHARD, Position(3), t0 - 1, "u"), Copy(SHARD, Position(4), t0, "u")]
    decided = decide(lost, unkeyed, live, lambda key: SHARD, 1000, 100, kept_since_ms=t0)
    assert [(d.event_id, d.unverifiable, d.put is not None) for d in decided] == [
        ("old", True, False),
        ("new", False, True),
        (None, True, False),
        (None, False, True),
    ]


def test_events_before_the_applications_start_are_neither_lost_nor_put() -> None:
    """An application started three hours ago at a point in time: the events whose first staging copy arrived
    before the start are not owed to its target. A repair of the last day audits them as such and puts nothing of
    them (before, the audit counted them lost and the repair put them: events before the start in the target); an
    event after the start that the copier skipped is still put back."""
    clock = FakeClock()
    start_ms = (clock.now_ms() // 1000 - 3 * 3600) * 1000
    world = Copier(config({"initialPositionInStreamExtended": start_ms // 1000}), clock=clock)
    before = [event(1, start_ms - 2 * HOUR), event(2, start_ms - 30 * 60_000)]
    world.staged(before, forward=False)  # the daemon starts AT_TIMESTAMP: never delivered
    world.staged([event(3, start_ms + 10 * 60_000)], forward=False)  # after the start, skipped: lost
    world.staged([event(4, start_ms + 2 * HOUR)])
    run = world.repair(start_ms - 24 * HOUR, clock.now_ms())
    assert world.target() == Counter({"e3": 1, "e4": 1})
    assert [str(d.event_id) for d in run.decisions] == ["e3"]
    assert run.after == [] and world.final is not None and world.final.before_start == 2
    assert "staged events before the application's start (never copied, not counted): 2" in "\n".join(
        run.summary(world.final)
    )
