"""``copier repair`` through the real local backend and real processes: events the audit finds lost (a daemon
that started past them; a target that lost records) are put back once each, through a repair killed mid-put and
run again, or run twice at once; events a live copier may still forward, or whose producer retries the live window
may still let through, wait; events in the target that staging never had are reported, never deleted. And which
lost events go now, as a pure rule (``copier.core.repair.decide``)."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pytest

from copier.core.positions import Position
from copier.core.repair import Copy, LiveShard, decide
from tests.conftest import Pipeline
from tests.support.backend import create_stream, read_stream
from tests.support.deadletters import SHARD, Command, second_run_while_frozen, staged_recs

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(300)]

T0 = 1_700_000_000_000


def repair(pipeline: Pipeline, *args: str) -> Command:
    return Command("repair", "--properties", str(pipeline.properties), "--since", "-1h", "--until", "2100-01-01", *args)


def event(event_id: str) -> bytes:
    return json.dumps({"eventId": event_id}).encode()


def put(pipeline: Pipeline, records: list[tuple[str, bytes]]) -> None:
    for start in range(0, len(records), 500):
        entries = [{"PartitionKey": k, "Data": d} for k, d in records[start : start + 500]]
        pipeline.kinesis.put_records(StreamName=pipeline.staging, Records=entries)


def started_past(pipeline: Pipeline, processors: Any, lost: int, window_s: int = 1, **keys: object) -> list[str]:
    """``lost`` events (and two records without an ID) written to staging, then, past the dedup window, three
    more; a live ``copier process`` is delivered only those three, as a daemon that started past the others (a
    lost lease table, initialPositionInStream LATEST): the others are lost. Their event IDs."""
    pipeline.write_properties(dedupWindowSeconds=window_s, **keys)
    ids = [f"lost-{n}" for n in range(lost)]
    put(pipeline, [(i, event(i)) for i in ids] + [("u-0", b"no id 0"), ("u-1", b"no id 1")])
    first = len(staged_recs(pipeline.kinesis, pipeline.staging))
    time.sleep(1.5)  # with a 1-second window, the live copier's newest arrival then lies past every lost event's
    put(pipeline, [(f"ok-{n}", event(f"ok-{n}")) for n in range(3)])
    live = processors(pipeline, "live")
    live.initialize(SHARD)
    live.process(staged_recs(pipeline.kinesis, pipeline.staging)[first:])
    assert live.close() == 0
    return ids


def target(pipeline: Pipeline, stream: str | None = None) -> Counter[bytes]:
    return Counter(bytes(r["Data"]) for r in read_stream(pipeline.kinesis, stream or pipeline.target))


def everything_once(pipeline: Pipeline, ids: list[str]) -> Counter[bytes]:
    return Counter([event(i) for i in ids] + [b"no id 0", b"no id 1"] + [event(f"ok-{n}") for n in range(3)])


@pytest.mark.parametrize("point,count", [("batch_recorded", 1), ("put_request", 1)])
def test_a_repair_killed_mid_put_and_run_again_puts_each_lost_event_once(
    pipeline: Pipeline, processors: Any, point: str, count: int
) -> None:
    """SIGKILL once its chunk is recorded, or once the first of its three requests landed: the next run waits out
    the lease, verifies the chunk in the target, audits, and puts only what is still missing; its audit is OK."""
    ids = started_past(pipeline, processors, lost=1200)
    dry = repair(pipeline, "--dry-run")
    assert dry.finish() == 0 and "lost in the range: 1202; would put 1202; waiting 0" in dry.out, dry.out
    assert len(target(pipeline)) == 3, "a dry run puts nothing"
    first = repair(pipeline)
    first.wait_for(point, count)
    first.kill()
    second = repair(pipeline)
    assert second.finish() == 0, second.out
    verified = second.events("verified_pending")  # the chunk left in flight (unless it committed before the kill)
    assert not verified or verified[0]["landed"] + verified[0]["to_redo"] + verified[0]["unkeyed_resent"] > 0
    assert "verify: OK" in second.out and "lost in the range: 0)" in second.out, second.out
    landed = target(pipeline)
    keyed = Counter({d: n for d, n in landed.items() if d.startswith(b"{")})
    assert keyed == Counter({d: 1 for d in everything_once(pipeline, ids) if d.startswith(b"{")})
    assert landed[b"no id 0"] >= 1 and landed[b"no id 1"] >= 1  # sent again only as reported (verify: OK)


def test_a_second_repair_takes_the_shards_over_and_nothing_goes_twice(pipeline: Pipeline, processors: Any) -> None:
    """A run frozen once its chunk is recorded, a second run meanwhile: the second waits out the lease, verifies
    what the first left in flight, audits after that, and puts the rest; the first is fenced and says so."""
    ids = started_past(pipeline, processors, lost=600, leaseMillis=8000)
    first = repair(pipeline)
    second = second_run_while_frozen(first, pipeline.properties, "repair", lambda: repair(pipeline))
    assert first.finish() == 1 and "taken over by another repair" in first.out, first.out
    assert second.finish() == 0, second.out
    landed = target(pipeline)
    assert all(landed[event(i)] == 1 for i in ids), "each lost event once"
    assert "verify: OK" in second.out


def test_a_target_that_lost_records_gets_them_back_and_what_staging_never_had_is_reported(
    pipeline: Pipeline, processors: Any
) -> None:
    """The copier forwarded everything; the target it is pointed at now lacks some events (a second target built
    from the first one's records, less five) and holds one staging never had: the five are put back; the stranger
    is reported as unexpected and left where it is."""
    pipeline.write_properties(dedupWindowSeconds=1)
    ids = [f"e-{n}" for n in range(20)]
    put(pipeline, [(i, event(i)) for i in ids])
    time.sleep(1.5)
    put(pipeline, [("late", event("late"))])
    live = processors(pipeline, "live")
    live.initialize(SHARD)
    live.process(staged_recs(pipeline.kinesis, pipeline.staging))
    assert live.close() == 0
    second = f"{pipeline.target}-b"
    create_stream(pipeline.kinesis, second, 2)
    kept = [
        r for r in read_stream(pipeline.kinesis, pipeline.target) if json.loads(r["Data"])["eventId"] not in ids[:5]
    ]
    entries = [{"PartitionKey": r["PartitionKey"], "Data": r["Data"]} for r in kept]
    pipeline.kinesis.put_records(
        StreamName=second, Records=[*entries, {"PartitionKey": "x", "Data": event("stranger")}]
    )
    pipeline.write_properties(dedupWindowSeconds=1, targetStreamName=second)
    check = Command("verify", "--properties", str(pipeline.properties))
    assert check.finish() == 1 and "lost: 5" in check.out
    fixed = repair(pipeline)
    assert fixed.finish() == 0, fixed.out
    assert "put 5; waiting 0" in fixed.out and "unexpected: 1" in fixed.out and "stranger" in fixed.out
    landed = target(pipeline, second)
    assert landed == Counter([event(i) for i in ids] + [event("late"), event("stranger")])


def test_events_the_live_copier_may_still_forward_or_let_through_again_wait(
    pipeline: Pipeline, processors: Any
) -> None:
    """With a 10-minute dedup window the lost events' producer retries may still come, and the live window does
    not know of a repair: they wait (listed, exit 1), nothing is put. An event still ahead of the live copier is
    pending, not lost: never put."""
    started_past(pipeline, processors, lost=3, window_s=600)
    put(pipeline, [("ahead", event("ahead"))])  # after the live copier's committed position
    waiting = repair(pipeline)
    assert waiting.finish() == 1, waiting.out
    assert "lost in the range: 5; put 2; waiting 3" in waiting.out  # put: the records without an ID
    assert "its producer may still retry it within the live dedup window" in waiting.out
    assert "lost: 3, pending: 1" in waiting.out, waiting.out
    assert len(target(pipeline)) == 3 + 2, "only the records without an ID (no window holds back) were put"


def test_a_state_table_deleted_stops_a_repair_and_one_created_again_empty_puts_nothing(pipeline: Pipeline) -> None:
    """Without the state table no repair item can be taken over: exit 3, naming the table. Created again empty
    (`copier init`), no shard has a committed position: every missing event is pending (the live copier resumes
    from its KCL checkpoint), none is lost, nothing is put."""
    put(pipeline, [("a", event("a"))])
    pipeline.dynamodb.delete_table(TableName=pipeline.table)
    gone = repair(pipeline)
    assert gone.finish() == 3
    assert any(pipeline.table in line for line in gone.lines), gone.lines
    pipeline.init()
    empty = repair(pipeline)
    assert empty.finish() == 0, empty.out
    assert "lost in the range: 0" in empty.out and "pending: 1" in empty.out
    assert len(target(pipeline)) == 0


# -- the rule -----------------------------------------------------------------------------------------------------


def copy(seq: int, arrival: int, key: str = "k", shard: str = SHARD) -> Copy:
    return Copy(shard, Position(seq), arrival, key)


def test_a_lost_event_goes_once_the_live_shard_has_passed_its_window() -> None:
    live = {SHARD: LiveShard(Position(10), T0 + 60_000)}
    lost = {"a": [copy(1, T0)], "b": [copy(2, T0 + 30_000)]}
    decided = decide(lost, [], live, lambda key: SHARD, 50_000, 1000)
    assert [(d.event_id, d.put is not None) for d in decided] == [("a", True), ("b", False)]
    assert decided[1].after_ms == T0 + 30_000 + 51_000
    assert [d.put is not None for d in decide(lost, [], live, lambda key: SHARD, 0, 1000)] == [True, True]


def test_a_lost_event_with_a_copy_ahead_of_the_live_copier_waits_and_the_range_is_its_first_copys() -> None:
    live = {SHARD: LiveShard(Position(10), T0 + 3_600_000)}
    lost = {"a": [copy(1, T0), copy(11, T0 + 5)], "b": [copy(2, T0 - 5), copy(3, T0 + 10)]}
    decided = decide(lost, [copy(4, T0)], live, lambda key: SHARD, 1000, 100, since_ms=T0)
    assert [(d.event_id, d.put is not None) for d in decided] == [("a", False), (None, True)]
    assert "still ahead of the live copier" in decided[0].why
    nobody = decide(lost, [copy(4, T0)], {}, lambda key: SHARD, 1000, 100)
    assert all(d.put is None for d in nobody), "no committed position read: nothing is known to be passed"
