"""The per-shard protocol in process, on the fakes: fencing, leases, chunks, leftovers, bounded reads, stalls."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

import copier.shard.holding
from copier.core.errors import AmbiguousPutError, FatalAwsError, FencedError, TransientAwsError
from copier.core.identity import id_digest
from copier.core.packing import pack_digests
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.state import DigestBatch, ShardState, shard_key
from copier.shard.ownership import RELEASE_POLL_MS
from copier.testing import InMemoryStateStore
from tests.support.fakes import SHARD, OffsetClock, SimulatedCrash, World, config, measured, once_asleep, rec

KEY = shard_key("staging", SHARD)
MINUTE = 60_000


def test_a_successor_announces_itself_and_the_owner_stops_forwarding() -> None:
    """Once a successor is announced, the owner's next batch is acknowledged but not forwarded."""
    world = World()
    owner = world.worker()
    owner.process([rec(1, "a")])
    successor = world.worker()  # announces, sleeps out the lease on the fake clock, takes over
    assert sum(world.clock.slept) >= 5000, "the lease slept out, a look at a time"
    assert owner.process([rec(2, "b")]) is None
    assert owner.fenced
    assert world.target_ids() == Counter({"a": 1})
    successor.process([rec(2, "b")])
    assert world.target_ids() == Counter({"a": 1, "b": 1})


def test_an_expired_lease_is_taken_over_without_sleeping() -> None:
    """A dead owner whose lease ran out costs its successor no wait."""
    world = World()
    world.worker().process([rec(1, "a")])
    world.clock.advance(60_000)
    world.worker()
    assert world.clock.slept == []


def test_a_released_lease_is_taken_over_without_sleeping() -> None:
    """A processor shut down gracefully gives its lease up."""
    world = World()
    owner = world.worker()
    owner.process([rec(1, "a")])
    assert owner.release() is not None
    world.worker()
    assert world.clock.slept == []


def test_the_lease_is_renewed_before_a_put_it_would_not_outlive() -> None:
    """A chunk whose puts outlast the lease renews it (one conditional write) before the next put."""
    world = World()
    owner = world.worker()

    def slow(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        world.clock.advance(2000)
        return [True] * len(entries), None

    world.streams.fault = slow
    writes = world.store.write_requests
    owner.process([rec(i, f"e{i}") for i in range(1, 1201)])  # three requests, 2 s each, lease 5 s
    assert world.store.write_requests == writes + 3  # digest batch, one renewal, commit
    assert len(world.target_ids()) == 1200


def test_a_chunk_costs_one_digest_batch_and_one_commit() -> None:
    """Steady state: two single-item writes per chunk, whatever its size; no transaction."""
    world = World()
    owner = world.worker()
    writes = world.store.write_requests
    owner.process([rec(i, f"e{i}") for i in range(1, 3001)])
    assert world.store.write_requests == writes + 2
    state = world.store.get(KEY)
    assert state is not None and state.batches == 1 and state.position == Position(3000)


def test_a_large_batch_is_cut_into_chunks_each_recorded_and_committed() -> None:
    """25 records with chunks of 10: three digest batches of 10, 10 and 5, and the position of the last."""
    world = World(chunk_events=10)
    owner = world.worker()
    assert owner.process([rec(i, f"e{i}") for i in range(1, 26)]) == Position(25)
    stored = [world.store.get_batch(KEY, i) for i in (1, 2, 3)]
    assert [b.keyed_count for b in stored if b] == [10, 10, 5]
    assert [b.last for b in stored if b] == [Position(10), Position(20), Position(25)]
    assert world.target_ids() == Counter({f"e{i}": 1 for i in range(1, 26)})


def test_a_crash_between_chunks_loses_and_repeats_nothing() -> None:
    """Killed after the first chunk's commit, the successor replays the batch and forwards only the rest."""
    world = World(chunk_events=10)
    owner = world.worker()
    commits = {"n": 0}

    def crash_on_second_commit(phase: str, call: str) -> bool:
        if phase == "after" and call == "write":
            commits["n"] += 1
            return commits["n"] == 2
        return False

    world.store.crash_hook = crash_on_second_commit
    records = [rec(i, f"e{i}") for i in range(1, 26)]
    with pytest.raises(SimulatedCrash):
        owner.process(records)
    world.store.crash_hook = lambda phase, call: False
    successor = world.worker()
    successor.process(records)  # the KCL replays from its checkpoint (none was taken)
    assert world.target_ids() == Counter({f"e{i}": 1 for i in range(1, 26)})


def test_a_lease_that_ran_out_during_the_put_is_reported_as_possible_duplicates() -> None:
    """The honest limit: frozen past the lease mid-put, the owner logs the batch's event IDs."""
    world = World()
    owner = world.worker()

    def slow_put(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        world.clock.advance(30_000)  # a GC pause, between the lease check and the put's answer
        world.worker()  # meanwhile a successor took over
        return [True] * len(entries), None

    world.streams.fault = slow_put
    with capture_logs() as logs:
        assert owner.process([rec(1, "a"), rec(2, "b")]) is None
    reported = [e for e in logs if e["event"] == "possible_duplicates"]
    assert reported and reported[0]["event_ids"] == ["a", "b"]


def test_only_failed_entries_are_retried() -> None:
    """Entries throttled in a PutRecords answer are resent; the ones that landed are not."""
    world = World()
    owner = world.worker()
    sent: list[int] = []

    def throttle_half(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        sent.append(len(entries))
        return [i % 2 == 0 or len(sent) > 1 for i in range(len(entries))], None

    world.streams.fault = throttle_half
    owner.process([rec(i, f"e{i}") for i in range(1, 11)])
    assert sent == [10, 5]
    assert world.target_ids() == Counter({f"e{i}": 1 for i in range(1, 11)})


def test_a_large_chunk_is_split_into_requests_of_500() -> None:
    """1,200 events go out in three PutRecords requests."""
    world = World()
    world.worker().process([rec(i, f"e{i}") for i in range(1, 1201)])
    assert world.streams.put_calls == 3
    assert len(world.target_ids()) == 1200


def test_transient_state_errors_are_retried_and_host_wide_errors_go_up() -> None:
    """A throttled state write is retried; a missing target stream fails every shard alike and goes up."""
    world = World()
    owner = world.worker()
    real_write = world.store.write
    failures = iter([TransientAwsError("PutItem", "ProvisionedThroughputExceededException", "slow down")])

    def flaky_write(*args: object, **kwargs: object) -> None:
        for exc in failures:
            raise exc
        real_write(*args, **kwargs)  # type: ignore[arg-type]

    world.store.write = flaky_write  # type: ignore[method-assign]
    owner.process([rec(1, "a")])
    assert world.target_ids() == Counter({"a": 1})

    world.streams.fault = lambda s, e: (
        [False] * len(e),
        FatalAwsError("PutRecords", "ResourceNotFoundException", "no stream"),
    )
    with pytest.raises(FatalAwsError):
        owner.process([rec(2, "b")])


def test_a_request_aws_rejects_for_this_shard_stalls_it_without_raising() -> None:
    """A ValidationException is retried at the longest backoff and logged; once it clears, all lands once."""
    world = World()
    owner = world.worker()
    rejected = {"n": 0}

    def reject_twice(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        if rejected["n"] < 2:
            rejected["n"] += 1
            return [False] * len(entries), FatalAwsError("PutRecords", "ValidationException", "rejected")
        return [True] * len(entries), None

    world.streams.fault = reject_twice
    with capture_logs() as logs:
        assert owner.process([rec(1, "a"), rec(2, "b")]) == Position(2)
    stalls = [e for e in logs if e["event"] == "shard_stalled"]
    assert len(stalls) == 2 and stalls[0]["code"] == "ValidationException"
    assert world.target_ids() == Counter({"a": 1, "b": 1})

    real_put_batch = world.store.put_batch
    state_rejections = iter([FatalAwsError("PutItem", "ValidationException", "item too large")])

    def rejecting_put_batch(*args: object) -> None:
        for exc in state_rejections:
            raise exc
        real_put_batch(*args)  # type: ignore[arg-type]

    world.store.put_batch = rejecting_put_batch  # type: ignore[method-assign]
    with capture_logs() as logs:
        assert owner.process([rec(3, "c")]) == Position(3)
    assert [e["call"] for e in logs if e["event"] == "shard_stalled"] == ["put_batch"]


def test_a_stalled_shard_says_so_in_its_state_item_until_it_moves_again() -> None:
    """copier status reads the state item, not the journal: a put AWS rejects as final is written there at
    once (why, the call and its code, since when), kept through the retries with the time it began, and
    cleared by the commit once the put goes through; a stall of the state table's own call is not written."""
    world = World()
    owner = world.worker()
    owner.process([rec(1, "a")])
    seen: list[ShardState | None] = []

    def reject_three_times(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        seen.append(world.store.get(KEY))  # the item as copier status reads it, at each attempt
        if len(seen) <= 3:
            world.clock.advance(1000)
            return [False] * len(entries), FatalAwsError("PutRecords", "ValidationException", "record too large")
        return [True] * len(entries), None

    world.streams.fault = reject_three_times
    began = world.clock.now_ms() + 1000
    assert owner.process([rec(2, "b")]) == Position(2)
    assert seen[0] is not None and seen[0].stall_reason is None
    for during in seen[1:]:
        assert during is not None
        assert (during.stall_reason, during.stall_since_ms) == ("rejected", began)
        assert during.stall_detail == "PutRecords: ValidationException: record too large"
    after = world.store.get(KEY)
    assert after is not None and (after.stall_reason, after.stall_detail, after.stall_since_ms) == (None, "", None)
    assert world.target_ids() == Counter({"a": 1, "b": 1})

    real_put_batch = world.store.put_batch
    rejections = iter([FatalAwsError("PutItem", "ValidationException", "item too large")])
    writes: list[int] = []

    def rejecting_put_batch(*args: object) -> None:
        writes.append(world.store.write_requests)
        for exc in rejections:
            raise exc
        real_put_batch(*args)  # type: ignore[arg-type]

    world.store.put_batch = rejecting_put_batch  # type: ignore[method-assign]
    assert owner.process([rec(3, "c")]) == Position(3)
    assert writes[1] == writes[0], "no write between the refused digest batch and its retry: no stall write"


def test_a_child_shard_inherits_the_windows_of_both_parents_after_a_merge() -> None:
    """Duplicates of events forwarded on either parent are dropped on the merged child."""
    world = World()
    world.worker("shardId-1").process([rec(1, "a")])
    world.worker("shardId-2").process([rec(1, "b")])
    world.streams.shard_parents["shardId-3"] = ["shardId-1", "shardId-2"]
    child = world.worker("shardId-3")
    child.process([rec(5, "a"), rec(6, "b"), rec(7, "c")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_counters_are_kept_in_the_state_item() -> None:
    """Forwarded, duplicates, replays and unkeyed counts add up across batches."""
    world = World(config(unkeyedPolicy="forward"))
    owner = world.worker()
    owner.process([rec(1, "a"), rec(2, "a"), rec(3, None)])
    owner.process([rec(3, None), rec(4, "b")])
    state = world.store.get(KEY)
    assert state is not None
    assert state.counters == {
        "forwarded": 3,
        "dead_lettered": 0,
        "duplicates": 1,
        "replays": 1,
        "unkeyed": 1,
        "already_landed": 0,
    }


# -- the time window ------------------------------------------------------------------------------


def test_a_retry_within_the_hour_is_dropped_and_one_after_it_is_forwarded() -> None:
    """The window is measured in staging arrival time: 59 minutes later is a duplicate, 62 minutes is not."""
    world = World()
    owner = world.worker()
    t0 = 1_700_000_000_000
    owner.process([rec(1, "early", arrival_ms=t0)])
    owner.process([rec(2, "late", arrival_ms=t0 + 10 * MINUTE)])
    owner.process([rec(3, "late", arrival_ms=t0 + 59 * MINUTE), rec(4, "early", arrival_ms=t0 + 62 * MINUTE)])
    assert world.target_ids() == Counter({"early": 2, "late": 1})
    state = world.store.get(KEY)
    assert state is not None and state.window_newest_ms == t0 + 62 * MINUTE
    assert state.window_oldest_ms == t0 + 2 * MINUTE and state.window_ids == 2


def test_a_successor_loads_the_hour_before_the_newest_arrival() -> None:
    """A new owner remembers what the old one forwarded within the hour, and forgets what is older."""
    world = World(chunk_events=2)
    owner = world.worker()
    t0 = 1_700_000_000_000
    old = [rec(1, "two-hours", arrival_ms=t0), rec(2, "ninety", arrival_ms=t0 + 30 * MINUTE)]
    recent = [rec(3, "forty", arrival_ms=t0 + 80 * MINUTE), rec(4, "now", arrival_ms=t0 + 120 * MINUTE)]
    owner.process(old + recent)
    owner.release()
    with capture_logs() as logs:
        successor = world.worker()
    loaded = [e for e in logs if e["event"] == "window_loaded"][0]
    assert loaded["ids"] == 2 and loaded["batches"] == 1, "the older chunk is not even read"
    names = ("two-hours", "ninety", "forty", "now")
    retries = [rec(5 + i, name, arrival_ms=t0 + 121 * MINUTE) for i, name in enumerate(names)]
    successor.process(retries)
    assert world.target_ids() == Counter({"two-hours": 2, "ninety": 2, "forty": 1, "now": 1})


def test_the_count_cap_cuts_the_window_short_and_says_so() -> None:
    """With dedupWindowMaxEvents below an hour's events, the window shrinks, a warning says so, status shows it."""
    world = World(config(dedupWindowMaxEvents=3))
    owner = world.worker()
    t0 = 1_700_000_000_000
    with capture_logs() as logs:
        for i in range(6):
            owner.process([rec(i + 1, f"e{i}", arrival_ms=t0 + i * MINUTE)])
    assert [e["event"] for e in logs].count("window_cut_short") == 1
    state = world.store.get(KEY)
    assert state is not None and state.window_cut and state.window_ids <= 3
    assert state.window_oldest_ms > state.window_newest_ms - 3_600_000


def test_a_raised_window_is_said_with_the_time_from_which_it_holds() -> None:
    """copier.dedupWindowSeconds raised from an hour to 72 h: each digest batch's lifetime was fixed when it was
    written, so an event forwarded before the change is deduplicated within the hour it was written under only
    (here its retry 60 h later is forwarded again, its batch expired at 48 h); the processor that finds the
    larger window says so once, naming the arrival from which it holds, and records the window it writes
    under; an event forwarded after the change is deduplicated for the whole 72 h. Before, nothing said that
    the raised window did not reach back."""
    hour = 60 * MINUTE
    world = World(config(dedupWindowSeconds=3600, digestTtlHours=48))
    t0 = world.clock.now_ms()
    owner = world.worker()
    owner.process([rec(1, "before", arrival_ms=t0)])
    owner.release()
    state = world.store.get(KEY)
    assert state is not None and state.window_ms == hour
    world.clock.advance(60 * hour)
    raised = config(dedupWindowSeconds=72 * 3600, digestTtlHours=96)
    with capture_logs() as logs:
        successor = world.worker(cfg=raised)
        successor.process([rec(2, "before", arrival_ms=t0 + 60 * hour), rec(3, "after", arrival_ms=t0 + 60 * hour)])
        successor.release()
        world.worker(cfg=raised).process([rec(4, "after", arrival_ms=t0 + 110 * hour)])
    said = [e for e in logs if e["event"] == "window_raised"]
    assert [(e["log_level"], e["window_seconds"], e["written_under_seconds"], e["holds_from_ms"]) for e in said] == [
        ("warning", 72 * 3600, 3600, t0)
    ]
    state = world.store.get(KEY)
    assert state is not None and state.window_ms == 72 * hour
    assert world.target_ids() == Counter({"before": 2, "after": 1})


# -- what a dead or fenced writer leaves behind --------------------------------------------------------


def leftover(index: int, epoch: int, *event_ids: str, last: int = 99) -> DigestBatch:
    """A digest batch as a writer leaves it when it dies or is fenced before its commit."""
    digests = pack_digests(id_digest(i) for i in event_ids)
    return DigestBatch(index=index, epoch=epoch, last=Position(last), started_ms=0, keyed=digests)


def test_a_leftover_found_on_takeover_is_verified_and_its_events_still_forwarded() -> None:
    """A batch recorded but never put: the successor finds none of it in the target and forwards it all."""
    world = World()
    owner = world.worker()
    owner.process([rec(1, "a")])
    world.store.put_batch(KEY, leftover(2, 1, "b", "c", last=3))  # recorded, then the writer died
    world.clock.advance(60_000)
    with capture_logs() as logs:
        successor = world.worker()
    verified = [e for e in logs if e["event"] == "verified_pending"][0]
    assert (verified["landed"], verified["to_redo"]) == (0, 2)
    successor.process([rec(2, "b"), rec(3, "c"), rec(4, "b", body="retry")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_a_zombie_leftover_written_after_a_takeover_never_drops_an_event() -> None:
    """A fenced writer's late digest batches count for nothing: overwritten, refused, or verified."""
    world = World()
    zombie = world.worker()
    zombie.process([rec(1, "a")])
    world.clock.advance(60_000)
    successor = world.worker()
    old = zombie.state.epoch  # type: ignore[union-attr]
    world.store.put_batch(KEY, leftover(2, old, "b", "c"))  # before the successor's batch 2: overwritten
    successor.process([rec(2, "b"), rec(3, "c")])
    with pytest.raises(FencedError):  # after it: refused, so the committed batch keeps what was forwarded
        world.store.put_batch(KEY, leftover(2, old, "x", "y"))
    world.store.put_batch(KEY, leftover(3, old, "d", last=4))  # above the committed index: verified, redone
    successor.release()
    third = world.worker()
    third.process([rec(4, "d"), rec(5, "x"), rec(6, "y"), rec(7, "b", body="retry")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1, "d": 1, "x": 1, "y": 1})


def unkeyed(seq: int, payload: bytes = b"heartbeat") -> SourceRecord:
    return SourceRecord(Position(seq), "same-key", payload, 0)


def test_an_unkeyed_copy_put_by_the_chunk_before_is_not_taken_for_this_ones() -> None:
    """Identical records without an ID in consecutive chunks: a lost answer on the second resends it, never drops it."""
    world = World(chunk_events=1)
    owner = world.worker()
    calls = {"n": 0}

    def lose_second(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        calls["n"] += 1
        if calls["n"] == 2:  # the second chunk's put: nothing landed, and the answer is lost
            return [False] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeout", "lost")
        return [True] * len(entries), None

    world.streams.fault = lose_second
    owner.process([unkeyed(1), unkeyed(2)])
    assert world.streams.data("target").count(b"heartbeat") == 2


def test_an_unkeyed_copy_of_the_batch_before_is_not_taken_for_the_one_in_flight() -> None:
    """On takeover, a batch in flight whose identical unkeyed copy was put just before is redone, not dropped."""
    world = World(chunk_events=1)
    owner = world.worker()
    world.streams.fault = lambda s, e: (
        ([True] * len(e), None) if world.streams.put_calls == 1 else ([False] * len(e), SimulatedCrash("died"))
    )
    with pytest.raises(SimulatedCrash):
        owner.process([unkeyed(1), unkeyed(2)])
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    successor = world.worker()
    successor.process([unkeyed(1), unkeyed(2)])
    assert world.streams.data("target").count(b"heartbeat") == 2


# -- bounded verification ------------------------------------------------------------------------------


def test_verification_reads_only_the_batchs_shards_and_time() -> None:
    """After a crash mid-put, the successor reads one of four target shards, and stops at the lease's end."""
    world = World(target_shards=4)
    owner = world.worker()
    hot = [rec(i, f"e{i}") for i in range(1, 6)]
    keys = {f"e{i}": f"e{i}" for i in range(1, 6)}
    shard_of = world.streams.shard_map("target").shard_for
    same_shard = [r for r in hot if shard_of(keys[json.loads(r.data)["eventId"]]) == shard_of("e1")]
    world.streams.fault = lambda s, e: ([True] * len(e), SimulatedCrash("after the put"))
    with pytest.raises(SimulatedCrash):
        owner.process(same_shard)
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    # Unrelated writers fill the target: on every shard now, and on the batch's shard long after the lease.
    world.streams.put_records("target", [(f"other-{i}", b"{}") for i in range(400)])
    world.clock.advance(60_000)
    world.streams.put_records("target", [("e1", b"{}") for _ in range(300)])
    with capture_logs() as logs:
        world.worker()
    verified = [e for e in logs if e["event"] == "verified_pending"][0]
    assert verified["shards_read"] == 1 and verified["landed"] == len(same_shard)
    on_shard = sum(1 for i in range(400) if shard_of(f"other-{i}") == shard_of("e1"))
    assert verified["records_read"] <= len(same_shard) + on_shard + 1, verified


@pytest.mark.parametrize("half_landed", [True, False])
def test_an_ambiguous_put_is_verified_in_its_own_shards_first_then_in_every_shard(half_landed: bool) -> None:
    """A put whose answer was lost is checked by reading the shards its entries hash to; what is missing there is
    looked for in every shard (the target may ignore keys: RecordDistributionStrategy AUTO), then resent.
    When everything is where its keys hash to, no other shard is read."""
    world = World(target_shards=4)
    owner = world.worker()
    calls = {"n": 0}

    def lose_first_answer(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        calls["n"] += 1
        if calls["n"] == 1:
            landed = [i % 2 == 0 or not half_landed for i in range(len(entries))]
            return landed, AmbiguousPutError("PutRecords", "ReadTimeout", "lost")
        return [True] * len(entries), None

    world.streams.fault = lose_first_answer
    owner.process([rec(1, "k1"), rec(2, "k1x")])
    shards = {world.streams.shard_map("target").shard_for(k) for k in ("k1", "k1x")}
    expected = [len(shards), 4] if half_landed else [len(shards)]
    assert [r.shards_read for r in world.streams.reads] == expected
    assert world.target_ids() == Counter({"k1": 1, "k1x": 1})


# -- an owner's own write, sent twice ----------------------------------------------------------------


def _lose_answer_of_commit(world: World, batches: int, applied: bool) -> list[tuple[str, ShardState, ShardState]]:
    """The owner's commit of digest batch ``batches`` gets no answer (the client times out and retries); its
    first attempt went through (``applied``) or is still on its way: the returned list holds it, for the test
    to apply late."""
    held: list[tuple[str, ShardState, ShardState]] = []
    inner = world.store.write

    def write(key: str, owner: ShardState, new: ShardState) -> None:
        if new.batches == batches and not held:
            held.append((key, owner, new))
            if applied:
                inner(key, owner, new)
            raise TransientAwsError("PutItem", "RequestTimeout", "no answer")
        inner(key, owner, new)

    world.store.write = write  # type: ignore[method-assign]
    return held


def test_a_late_copy_of_an_owners_commit_cannot_roll_the_state_back() -> None:
    """Adversarial review: a commit's first attempt, given up on by the client, reaches the table after its
    retry and two later commits. Applied, it would set the item back to batch 2; the next owner would treat
    committed batch 3 as in flight and forget batch 4's IDs, and forward d again with nothing said. The
    version in the write's condition refuses it."""
    world = World(config(), chunk_events=1)
    owner = world.worker()
    held = _lose_answer_of_commit(world, 2, applied=False)
    for i, name in enumerate("abcd", start=1):
        owner.process([rec(i, name)])
    stored = world.store.get(KEY)
    assert held and stored is not None and stored.batches == 4
    with pytest.raises(FencedError):
        InMemoryStateStore.write(world.store, *held[0])  # the late first attempt
    assert world.store.get(KEY) == stored
    assert owner.release() is not None
    successor = world.worker()
    successor.process([rec(3, "c"), rec(4, "d"), rec(5, "e")])  # the KCL checkpoint was at 2
    assert world.target_ids() == Counter({k: 1 for k in "abcde"})


def test_a_retried_commit_whose_first_attempt_went_through_is_not_a_fence() -> None:
    """The retry of a write that went through is refused by the same version condition: the owner reads the
    item back, finds its own write there, and carries on as owner."""
    world = World(config(), chunk_events=1)
    owner = world.worker()
    held = _lose_answer_of_commit(world, 2, applied=True)
    assert owner.process([rec(1, "a"), rec(2, "b")]) == Position(2)
    assert held and not owner.fenced
    assert owner.process([rec(3, "c")]) == Position(3)
    stored = world.store.get(KEY)
    assert stored is not None and stored.batches == 3 and stored.owner == owner.owner
    assert world.target_ids() == Counter({k: 1 for k in "abc"})


# -- a lease move: the old processor gives copier's lease up when the daemon says the KCL's moved ------------


def test_a_processor_told_its_lease_moved_releases_it_and_the_new_owner_starts_at_once() -> None:
    """lease_lost comes between the daemon's calls: everything put is committed and nothing more will be, so
    the processor releases copier's lease and the next owner takes over without sleeping it out."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    with capture_logs() as logs:
        assert first.lose_lease() is True
    assert [(e["event"], e.get("why")) for e in logs if e["event"] == "released"] == [("released", "lease_lost")]
    slept = len(world.clock.slept)
    second = world.worker()
    assert world.clock.slept[slept:] == [], "a released lease is not slept out"
    assert second.process([rec(1, "a"), rec(2, "b")]) == Position(2)
    assert first.fenced and first.process([rec(3, "c")]) is None, "the old processor forwards nothing more"
    assert world.target_ids() == Counter({"a": 1, "b": 1})


def test_a_successor_waiting_out_a_lease_takes_over_once_the_owner_releases_it() -> None:
    """The new owner's processor often starts before the old one hears that the lease moved: it announces
    itself and waits. The old processor's release goes through under the announcement, and the waiting one
    sees it at its next look instead of sleeping out the whole lease."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])

    def first_is_told() -> bool:
        stored = world.store.get(KEY)
        assert stored is not None and stored.successor is not None, "the successor announced itself first"
        return first.lose_lease()

    with capture_logs() as logs, once_asleep(world.clock, first_is_told) as told:
        second = world.worker()
    assert told == [True], "released under the announcement"
    waited = sum(world.clock.slept)
    assert 0 < waited <= RELEASE_POLL_MS * 2 < world.config.lease_millis, waited
    assert [e["event"] for e in logs if e["event"] in ("waiting_for_lease", "took_over")] == [
        "waiting_for_lease",
        "took_over",
    ]
    state = world.store.get(KEY)
    assert state is not None and state.owner == second.owner and state.epoch == 2 and state.successor is None
    assert second.process([rec(2, "b")]) == Position(2)
    assert world.target_ids() == Counter({"a": 1, "b": 1})


def test_a_processor_told_late_that_its_lease_moved_leaves_the_new_owners_lease_alone() -> None:
    """lease_lost can reach the old processor after the new one took over: its release must not touch the new
    owner's lease (a third processor would take over at once while the new owner puts)."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    second = world.worker()  # sleeps out the first's lease: first was never told
    second.process([rec(2, "b")])
    assert second.state is not None
    held = second.state.lease_until_ms
    assert first.lose_lease() is False
    state = world.store.get(KEY)
    assert state is not None and (state.owner, state.epoch, state.lease_until_ms) == (second.owner, 2, held)
    slept = len(world.clock.slept)
    third = world.worker()
    assert sum(world.clock.slept[slept:]) > 0, "the new owner's lease is slept out"
    assert third.state is not None and third.state.epoch == 3


def test_a_fenced_processor_told_its_lease_moved_cuts_its_lease_short() -> None:
    """A processor whose write failed (a successor announced itself) may have a chunk in flight, put and not
    committed. Told that its lease moved, it cuts copier's lease to now plus the put timeout (not to 0):
    everything it put is readable by then, and the successor, after that and the clock margin instead of the
    rest of the lease, verifies the chunk and forwards nothing of it again. (A rolling deploy's longest
    pause was this wait, a whole lease, once or twice in a row.)"""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])

    def first_writes() -> None:
        first.process([rec(2, "b")])  # its digest batch is written and "b" put; its commit is refused
        assert first.fenced
        assert first.lose_lease() is True

    with capture_logs() as logs, once_asleep(world.clock, first_writes) as wrote:
        second = world.worker()
    assert wrote, "first wrote while the successor waited"
    cfg = world.config
    assert sum(world.clock.slept) >= cfg.put_timeout_millis, "the successor left the put timeout to what was put"
    assert sum(world.clock.slept) < cfg.lease_millis, "the successor did not sleep out the lease"
    assert [e["fenced"] for e in logs if e["event"] == "released"] == [True]
    verified = [e for e in logs if e["event"] == "verified_pending"]
    assert [(e["landed"], e["to_redo"]) for e in verified] == [(1, 0)], "the chunk in flight was found landed"
    assert second.state is not None and second.state.epoch == 2
    second.process([rec(2, "b"), rec(3, "c")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_a_fenced_processor_that_keeps_the_daemons_lease_takes_the_shard_back() -> None:
    """Two workers both believed they had the shard; the one that took copier's lease then lost the KCL's.

    The first, fenced at its next write, keeps receiving batches: it holds them, and once the other's lease
    has run out it takes the shard back and forwards everything exactly once. (Chaos seed 2 found the
    shard stalled forever: the fenced processor acknowledged and dropped every batch.)
    """
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    rival = world.worker()  # announces, sleeps out the first's lease, takes over
    del rival  # its daemon did not have the shard after all, and its host died before it could release
    assert first.process([rec(2, "b")]) is None and first.fenced
    assert first.process([rec(3, "c")]) is None, "the rival's lease is still valid: held, not forwarded"
    assert world.target_ids() == Counter({"a": 1})
    world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis)
    with capture_logs() as logs:
        assert first.process([rec(4, "d")]) == Position(4)
    assert [e["held"] for e in logs if e["event"] == "took_back"] == [3]  # b and c held, and d
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1, "d": 1})
    assert not first.fenced


def test_a_fenced_processor_at_the_shards_end_waits_to_take_the_shard_back_and_closes_it() -> None:
    """The daemon asks for a shard's end once; a fenced processor must not answer before the shard is done.

    Chaos seed 36: a processor fenced by a rival that then lost the daemon's lease got ``shard_ended`` while
    the rival's lease was valid; it answered without a checkpoint and exited, and the daemon, still holding
    the lease, retried its end-of-shard check once a second with no processor behind it: the shard and its
    merge child never moved again. Now it sleeps out the rival's lease, takes the shard back, forwards what
    it holds and closes the shard, so the checkpoint goes out.
    """
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    rival = world.worker()
    del rival  # its daemon did not have the shard after all, and its host died before it could release
    assert first.process([rec(2, "b")]) is None and first.fenced
    slept = len(world.clock.slept)
    with capture_logs() as logs:
        assert first.end_shard(), "the shard ends with a checkpoint"
    assert sum(world.clock.slept[slept:]) >= world.config.clock_skew_millis, "it slept out the rival's lease"
    assert [e["held"] for e in logs if e["event"] == "took_back"] == [1]
    assert [e["event"] for e in logs if e["event"] in ("waiting_to_end_shard", "shard_ended")] == [
        "waiting_to_end_shard",
        "shard_ended",
    ]
    assert world.target_ids() == Counter({"a": 1, "b": 1})
    state = world.store.get(KEY)
    assert state is not None and state.closed and state.owner == first.owner


def test_a_fenced_processor_at_the_shards_end_checkpoints_once_the_rival_has_closed_the_shard() -> None:
    """A rival at work keeps its lease and reaches the end itself: the fenced processor waits for the shard
    to be closed, forwards nothing, and answers so that the checkpoint goes out."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    rival = world.worker()
    assert first.process([rec(2, "b")]) is None and first.fenced
    sleep = world.clock.sleep_ms

    def rival_finishes_meanwhile(ms: int) -> None:
        if not rival.state or not rival.state.closed:
            rival.process([rec(2, "b"), rec(3, "c")])
            assert rival.end_shard()
        sleep(ms)

    world.clock.sleep_ms = rival_finishes_meanwhile  # type: ignore[method-assign]
    with capture_logs() as logs:
        assert first.end_shard()
    assert [e["event"] for e in logs if e["event"] == "shard_ended_by_other_owner"] == ["shard_ended_by_other_owner"]
    assert not [e for e in logs if e["event"] == "took_back"], "the rival's lease was never over"
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_a_fenced_processor_past_its_cap_reads_what_it_dropped_again_from_staging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held records are bounded, and no delivery size ends the process: past the cap a fenced processor keeps
    only the range, and reads it again from the staging stream once it takes the shard back."""
    monkeypatch.setattr(copier.shard.holding, "MAX_HELD_RECORDS", 5)
    world = World()
    now = world.clock.now_ms()
    records = [rec(1, "a", arrival_ms=now)] + [rec(2 + i, f"e{i}", arrival_ms=now) for i in range(12)]
    world.streams.add_staging(SHARD, records)
    first = world.worker()
    first.process(records[:1])
    rival = world.worker()  # takes copier's lease, then loses the daemon's, and its host dies unreleased
    del rival
    with capture_logs() as logs:
        assert first.process(records[1:7]) is None  # 6 held: over the cap, dropped, its range kept
        assert first.process(records[7:]) is None  # held after the range
        world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis + 1)
        assert first.process([]) == Position(13)
    assert [e["event"] for e in logs if e["event"] in ("fenced_backlog_dropped", "reading_again", "took_back")] == [
        "fenced_backlog_dropped",
        "fenced_backlog_dropped",
        "took_back",
        "reading_again",
    ]
    assert world.target_ids() == Counter({"a": 1, **{f"e{i}": 1 for i in range(12)}})


# -- small deliveries forwarded together -----------------------------------------------------------

COALESCING = {"callProcessRecordsEvenForEmptyRecordList": "true"}


def test_small_deliveries_wait_and_go_out_together() -> None:
    """Deliveries of 2 wait until 5 events are waiting: then one digest batch and one commit for all 6."""
    world = World(config(COALESCING, coalesceEvents=5, coalesceMillis=200))
    owner = world.worker()
    writes = world.store.write_requests
    assert owner.process([rec(1, "a"), rec(2, "b")]) is None
    assert owner.process([rec(3, "c"), rec(4, "d")]) is None, "acknowledged, not committed: no checkpoint"
    assert world.target_ids() == Counter()
    assert owner.process([rec(5, "e"), rec(6, "f")]) == Position(6)
    assert world.store.write_requests == writes + 2
    assert world.target_ids() == Counter({k: 1 for k in "abcdef"})


def test_a_waiting_delivery_goes_out_on_an_empty_call_after_the_delay() -> None:
    """An idle shard's daemon calls with no records: what waited longer than coalesceMillis is forwarded."""
    world = World(config(COALESCING, coalesceEvents=500, coalesceMillis=200))
    owner = world.worker()
    assert owner.process([rec(1, "a")]) is None
    world.clock.advance(150)
    assert owner.process([]) is None
    world.clock.advance(60)
    assert owner.process([]) == Position(1)
    assert world.target_ids() == Counter({"a": 1})


def test_without_empty_calls_from_the_daemon_nothing_waits() -> None:
    """callProcessRecordsEvenForEmptyRecordList off: a record could wait behind an idle shard, so none does."""
    world = World(config(coalesceEvents=500, coalesceMillis=200))
    owner = world.worker()
    assert owner.process([rec(1, "a")]) == Position(1)


def test_a_shutdown_forwards_what_waits_and_a_lost_lease_drops_it() -> None:
    """flush() before a checkpoint on shutdown; after lease_lost the next owner replays what waited."""
    world = World(config(COALESCING, coalesceEvents=500, coalesceMillis=200))
    owner = world.worker()
    owner.process([rec(1, "a")])
    assert owner.flush() == Position(1)
    owner.process([rec(2, "b")])
    owner.lose_lease()
    assert owner.flush() is None
    assert world.target_ids() == Counter({"a": 1})


def test_a_grandchild_after_a_split_and_a_merge_inherits_its_grandparents_window() -> None:
    """Shard 1 splits into 2 and 3, then 3 merges with 4 into 5: a duplicate of shard 1's event on 5 is dropped.

    (Chaos seed 6 found 21 late duplicates forwarded: only direct parents' windows were loaded, and a
    child's digest batches hold only what the child itself forwarded.)
    """
    world = World()
    world.worker("shardId-1").process([rec(1, "forwarded-on-the-grandparent")])
    world.streams.shard_parents.update({"shardId-2": ["shardId-1"], "shardId-3": ["shardId-1"]})
    world.worker("shardId-3").process([rec(5, "on-the-child")])
    world.worker("shardId-4").process([rec(7, "on-the-other-parent")])
    world.streams.shard_parents["shardId-5"] = ["shardId-3", "shardId-4"]
    with capture_logs() as logs:
        grandchild = world.worker("shardId-5")
    loaded = [e for e in logs if e["event"] == "window_loaded"][0]
    assert set(loaded["parents"]) == {"shardId-3", "shardId-4", "shardId-1"}
    names = ["forwarded-on-the-grandparent", "on-the-child", "on-the-other-parent", "new"]
    grandchild.process([rec(9 + i, name) for i, name in enumerate(names)])
    assert world.target_ids() == Counter(
        {"forwarded-on-the-grandparent": 1, "on-the-child": 1, "on-the-other-parent": 1, "new": 1}
    )


def _keyed(seq: int, key: str, event_id: str) -> SourceRecord:
    return SourceRecord(Position(seq), key, json.dumps({"eventId": event_id}).encode(), 0)


@pytest.mark.parametrize(("ordering", "kept"), [("partitionKey", True), ("none", False)])
def test_a_failed_entry_holds_back_the_later_entries_of_its_key(ordering: str, kept: bool) -> None:
    """With partitionKey, K2 is not sent until K1 has landed; with none, a throttled K1 lands after K2."""
    world = World(config(ordering=ordering))
    requests: list[list[str]] = []

    def first_entry_throttled(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], None]:
        requests.append([json.loads(data)["eventId"] for _, data in entries])
        return [len(requests) > 1 or i > 0 for i in range(len(entries))], None

    world.streams.fault = first_entry_throttled
    world.worker().process([_keyed(1, "K", "k1"), _keyed(2, "K", "k2"), _keyed(3, "J", "j1"), _keyed(4, "K", "k3")])
    landed = [json.loads(data)["eventId"] for pk, data, _, _ in world.streams.records["target"] if pk == "K"]
    assert sorted(landed) == ["k1", "k2", "k3"]
    assert (landed == ["k1", "k2", "k3"]) is kept, (landed, requests)
    if kept:
        assert requests == [["k1", "j1"], ["k1"], ["k2"], ["k3"]], "one entry of a key in flight at a time"


def test_ordering_keeps_a_key_behind_an_ambiguous_put_until_it_is_verified() -> None:
    """An ambiguous put of K1: K2 waits for the verification (K1 found landed) and is then sent once."""
    world = World()
    calls = {"n": 0}

    def first_ambiguous(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        calls["n"] += 1
        if calls["n"] == 1:
            return [True] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected")
        return [True] * len(entries), None

    world.streams.fault = first_ambiguous
    world.worker().process([_keyed(1, "K", "k1"), _keyed(2, "K", "k2")])
    landed = [json.loads(data)["eventId"] for _, data, _, _ in world.streams.records["target"]]
    assert landed == ["k1", "k2"]


def test_a_processor_that_released_and_then_wrote_again_releases_again() -> None:
    """Released on shutdown_requested, the processor is given one more delivery (it renews its lease to commit
    it): told later that its lease moved, it releases again, so its successor need not sleep that lease out."""
    world = World()
    worker = world.worker()
    worker.process([rec(1, "a")])
    assert worker.release() == Position(1)
    assert worker.process([rec(2, "b")]) == Position(2)
    assert worker.state is not None and worker.state.lease_until_ms > 0
    assert worker.lose_lease() is True
    assert worker.state is not None and worker.state.lease_until_ms == 0


def _announce(world: World, successor: str = "rival", bound: int | None = None) -> ShardState:
    """A successor announces itself on the state item (as ``Ownership._announced`` writes it)."""
    key = shard_key(world.config.stream_name, SHARD)
    seen = world.store.get(key)
    assert seen is not None
    announced = replace(seen, successor=successor, successor_bound_ms=bound, version=seen.version + 1)
    world.store.replace_if_unchanged(key, seen, announced)
    return announced


def test_a_release_whose_answer_was_lost_is_not_undone_by_a_second_release_fenced() -> None:
    """Told lease_lost, the processor released (lease 0) but lost the answer; it is then fenced (lose_lease
    says so) and, its input closed, releases again: that must not raise the lease from 0 to a cut, which
    would make a successor wait the put timeout again (found by the review)."""
    world = World()
    worker = world.worker()
    worker.process([rec(1, "a")])
    _announce(world)
    store_write = world.store.replace_if_unchanged

    def lands_then_times_out(key: str, seen: ShardState | None, new: ShardState) -> None:
        store_write(key, seen, new)
        raise TransientAwsError("UpdateItem", "RequestTimeout", "the answer was lost")

    world.store.replace_if_unchanged = lands_then_times_out  # type: ignore[method-assign]
    assert worker.lose_lease() is False  # one attempt; its answer lost
    world.store.replace_if_unchanged = store_write  # type: ignore[method-assign]
    key = shard_key(world.config.stream_name, SHARD)
    assert world.store.get(key).lease_until_ms == 0  # type: ignore[union-attr]
    worker.release(retry=False)  # input closed
    assert world.store.get(key).lease_until_ms == 0, "the released lease stays released"  # type: ignore[union-attr]


def test_a_fenced_release_that_meets_the_successor_raising_its_bound_tries_again() -> None:
    """The successor raises its recorded bound between the release's read and its write: the release reads
    again and cuts the lease all the same, instead of leaving the successor the whole lease."""
    world = World()
    worker = world.worker()
    worker.process([rec(1, "a")])
    _announce(world)
    worker.process([rec(2, "b")])  # its commit refused: fenced
    assert worker.fenced
    store_get = world.store.get
    raised = {"done": False}

    def bound_raised_after_the_read(key: str) -> ShardState | None:
        seen = store_get(key)
        if not raised["done"] and seen is not None and seen.successor:
            raised["done"] = True
            world.store.replace_if_unchanged(
                key, seen, replace(seen, successor_bound_ms=9_000, version=seen.version + 1)
            )
        return seen

    world.store.get = bound_raised_after_the_read  # type: ignore[method-assign]
    assert worker.lose_lease() is True
    world.store.get = store_get  # type: ignore[method-assign]
    state = store_get(shard_key(world.config.stream_name, SHARD))
    assert raised["done"] and state is not None and state.successor_bound_ms == 9_000
    assert state.lease_until_ms == world.clock.now_ms() + world.config.put_timeout_millis


def test_a_fenced_release_that_would_not_end_the_wait_sooner_writes_nothing() -> None:
    """A cut is worth writing only if the successor's wait, the lease's end plus the bound it counts, ends
    sooner. Here the host's clock stepped back 3 s after its last write: the cut to the put timeout reads
    1 s before the lease's end on this clock, but with the bound the step adds it ends later, so the fenced
    processor writes nothing (found by the review: it compared the lease's ends alone)."""
    world = World()
    host = OffsetClock(world.clock, 0)
    worker = world.worker(clock=host, clock_bounds=measured(host))
    worker.process([rec(1, "a")])
    announced = _announce(world)
    worker.process([rec(2, "b")])
    assert worker.fenced
    host.offset_ms = -3_000
    world.clock.now = announced.lease_until_ms - world.config.put_timeout_millis - 1_000 + 3_000
    assert host.now_ms() + world.config.put_timeout_millis < announced.lease_until_ms
    assert worker.lose_lease() is False
    assert world.store.get(shard_key(world.config.stream_name, SHARD)) == announced
