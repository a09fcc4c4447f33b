"""``copier.core.health``: who owns a shard and whether it is alive, how far behind it is, whether it is stalled."""

from __future__ import annotations

from typing import Any

from copier.adapters.kinesisread import WAITING_READS, KinesisReads
from copier.core.health import KclLease, Thresholds, Waiting, judge, reading_from, worker_expiry_ms
from copier.core.positions import Position
from copier.core.state import ShardState

NOW = 1_800_000_000_000
EXPIRY = worker_expiry_ms(2000, 1000)  # the production sample: reports every 2 s, a 1 s clock margin
LIMITS = Thresholds(max_lag_ms=300_000, max_unowned_ms=60_000)


def health(state: ShardState | None, lease: KclLease | None, waiting: Waiting | None = None, **reports: int) -> Any:
    return judge(True, state, lease, {w: NOW - ago for w, ago in reports.items()}, waiting, NOW, EXPIRY, LIMITS)


def test_a_worker_is_alive_while_its_reports_are_within_the_kcl_leaders_two_intervals() -> None:
    """The KCL's leader counts a worker gone when its last report is more than two reporting intervals old;
    status allows the report's whole second and the clock margin on top."""
    assert EXPIRY == 2 * 2000 + 1000 + 1000
    idle = ShardState(epoch=1, owner="h:1:a", lease_until_ms=NOW - 3_600_000, updated_ms=NOW - 3_600_000)
    alive = health(idle, KclLease("w1"), Waiting(), w1=EXPIRY)
    assert (alive.alive, alive.problems, alive.lag_ms) == (True, (), 0), "an idle shard's expired copier lease"
    dead = health(idle, KclLease("w1"), Waiting(), w1=EXPIRY + 1)
    assert (dead.alive, dead.problems) == (False, ()), "dead for seconds: not yet a problem (the next test)"


def test_a_shard_without_a_live_owner_is_a_problem_only_once_its_owner_is_known_gone_for_the_threshold() -> None:
    """A lease move or a restart takes seconds: counted from the instant the owner is known gone (its worker's
    last report plus the expiry, or copier's lease expiry, whichever is later), said as a bound."""
    written = ShardState(epoch=2, owner="h:1:a", lease_until_ms=NOW - 20_000, updated_ms=NOW - 30_000)
    assert health(written, KclLease("w1"), w1=60_000).problems == (), "known gone 20 s ago"
    assert health(written, KclLease("w1"), w1=90_000).problems == (), "copier's lease ran out only 20 s ago"
    old = ShardState(epoch=2, owner="h:1:a", lease_until_ms=NOW - 3_600_000, updated_ms=NOW - 3_600_000)
    assert health(old, KclLease("w9"), w9=90_000).problems == (
        "no live owner for at least 1m24s: its KCL lease is held by w9, which last reported 1m30s ago (dead)",
    ), "the report 90 s old plus the expiry (6 s): not the idle shard's hour-old write"
    assert health(old, KclLease(None)).problems == ("no live owner: its KCL lease has no owner",)
    assert health(None, None).problems == (
        "no live owner: no KCL lease (the KCL has not listed the shard yet, or its lease table was lost)",
    )
    unknown = judge(True, old, KclLease("w9"), None, None, NOW, EXPIRY, LIMITS)
    assert (unknown.alive, unknown.problems) == (None, ()), "workers' reports unreadable: said once, not per shard"


def test_after_a_graceful_stop_no_duration_is_made_up_and_idle_and_busy_shards_are_judged_alike() -> None:
    """The only worker stopped 4 s ago (its report gone with it; the KCL lease still names it): an idle shard
    whose last write is minutes old is not 'unowned for 3m45s', and a shard that committed just before the
    stop is a problem as soon as copier's lease of it has run out, as the idle one is."""
    idle = ShardState(epoch=1, owner="h:1:a", lease_until_ms=NOW - 220_000, updated_ms=NOW - 225_000)
    problems = health(idle, KclLease("w1")).problems
    assert problems == ("no live owner: its KCL lease is held by w1, which does not report (stopped)",)
    busy = ShardState(epoch=1, owner="h:1:b", lease_until_ms=NOW - 1_000, updated_ms=NOW - 5_000)
    assert health(busy, KclLease("w1")).problems == problems
    leased = ShardState(epoch=1, owner="h:1:b", lease_until_ms=NOW + 5_000, updated_ms=NOW - 5_000)
    assert health(leased, KclLease("w1")).problems == (), "its copier owner may still be writing"


def test_a_shard_copier_ended_needs_no_owner_and_is_not_read() -> None:
    """SHARD_END (in the state item or the KCL's checkpoint): no owner, no lag, no problem."""
    closed = ShardState(epoch=3, owner="h:1:a", closed=True, updated_ms=NOW - 86_400_000)
    assert health(closed, KclLease(None)).problems == ()
    assert health(None, KclLease(None, "SHARD_END")).ended


def test_a_recorded_stall_is_a_problem_with_how_long_it_has_lasted() -> None:
    state = ShardState(
        epoch=1,
        owner="h:1:a",
        updated_ms=NOW,
        stall_reason="rejected",
        stall_detail="PutRecords: ValidationException: too large",
        stall_since_ms=NOW - 125_000,
    )
    assert health(state, KclLease("w1"), Waiting(), w1=0).problems == (
        "stalled for 2m05s: rejected: PutRecords: ValidationException: too large",
    )


def test_lag_is_how_long_the_oldest_record_not_forwarded_has_waited() -> None:
    """0 when nothing waits; the oldest waiting record's age (a quiet shard whose one record waits an hour has
    MillisBehindLatest 0); Kinesis' MillisBehindLatest when a read found no record although later ones exist;
    a read that failed is a problem of its own."""
    state = ShardState(epoch=1, owner="h:1:a", position=Position(5), updated_ms=NOW)
    fine = health(state, KclLease("w1"), Waiting(NOW - 301_000, 0), w1=0)
    assert fine.lag_ms == 301_000 and fine.problems == (
        "behind by 5m01s (the oldest record not forwarded arrived 5m01s ago), over 5m00s",
    )
    assert health(state, KclLease("w1"), Waiting(NOW - 200, 0), w1=0).problems == ()
    beyond = health(state, KclLease("w1"), Waiting(millis_behind=400_000, more=True), w1=0)
    assert beyond.lag_ms == 400_000 and beyond.problems == ("behind by 6m40s, over 5m00s",)
    broken = health(state, KclLease("w1"), Waiting(error="GetRecords: AccessDeniedException: no"), w1=0)
    assert broken.problems == ("staging cannot be read: GetRecords: AccessDeniedException: no",)


def test_records_not_forwarded_begin_after_the_committed_position_else_where_the_lease_starts() -> None:
    state = ShardState(epoch=1, position=Position(49_600_000_000_000_000_001, 3))
    assert reading_from(state, KclLease("w", "7"), None) == {
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
        "StartingSequenceNumber": "49600000000000000001",
    }
    assert reading_from(None, KclLease("w", "42"), None) == {
        "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
        "StartingSequenceNumber": "42",
    }
    assert reading_from(None, KclLease("w", "TRIM_HORIZON"), None) == {"ShardIteratorType": "TRIM_HORIZON"}
    assert reading_from(None, KclLease("w", "AT_TIMESTAMP"), 1_700_000_000_000) == {
        "ShardIteratorType": "AT_TIMESTAMP",
        "Timestamp": 1_700_000_000.0,
    }
    assert reading_from(None, KclLease("w", "LATEST"), None) is None
    assert reading_from(None, None, None) is None


class _EmptyPages:
    """A staging client whose pages hold no record although Kinesis says later ones exist: AWS documents that
    GetRecords may answer so (the local backend never does)."""

    def __init__(self) -> None:
        self.reads = 0

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        return {"ShardIterator": "it-0"}

    def get_records(self, **kwargs: Any) -> dict[str, Any]:
        assert kwargs["Limit"] == 1
        self.reads += 1
        return {"Records": [], "MillisBehindLatest": 9_000, "NextShardIterator": f"it-{self.reads}"}


def test_a_look_at_what_waits_reads_one_record_and_a_few_empty_pages_at_most() -> None:
    client = _EmptyPages()
    reads = KinesisReads(lambda operation, fn, **kw: fn(**kw), client, None, lambda s: None)
    found = reads.waiting("staging", "shardId-0", {"ShardIteratorType": "TRIM_HORIZON"})
    assert found == Waiting(millis_behind=9_000, more=True) and found.any
    assert client.reads == WAITING_READS
