"""The per-shard protocol in process, on the fakes: fencing, leases, retries, bad input."""

from __future__ import annotations

from collections import Counter

import pytest
from structlog.testing import capture_logs

from copier.errors import FatalAwsError, TransientAwsError
from copier.state import shard_key
from tests.support.fakes import SHARD, World, config, rec


def test_a_successor_announces_itself_and_the_owner_stops_forwarding() -> None:
    """Once a successor is announced, the owner's next batch is acknowledged but not forwarded."""
    world = World()
    owner = world.worker()
    owner.process([rec(1, "a")])
    successor = world.worker()  # announces, sleeps out the lease on the fake clock, takes over
    assert world.clock.slept and world.clock.slept[0] >= 5000
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
    """A batch whose puts outlast the lease renews it (one conditional write) before the next put."""
    world = World()
    owner = world.worker()

    def slow(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        world.clock.advance(2000)
        return [True] * len(entries), None

    world.streams.fault = slow
    writes = world.store.write_requests
    owner.process([rec(i, f"e{i}") for i in range(1, 1201)])  # three requests, 2 s each, lease 5 s
    assert world.store.write_requests == writes + 3  # intent, one renewal, commit
    assert len(world.target_ids()) == 1200


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


def test_a_large_batch_is_split_into_requests_of_500() -> None:
    """1,200 events go out in three PutRecords requests."""
    world = World()
    world.worker().process([rec(i, f"e{i}") for i in range(1, 1201)])
    assert world.streams.put_calls == 3
    assert len(world.target_ids()) == 1200


def test_transient_state_errors_are_retried_and_fatal_put_errors_go_up() -> None:
    """A throttled state write is retried; a missing target stream is not retryable."""
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
    state = world.store.get(shard_key("staging", SHARD))
    assert state is not None
    assert state.counters == {
        "forwarded": 3,
        "dead_lettered": 0,
        "duplicates": 1,
        "replays": 1,
        "unkeyed": 1,
        "already_landed": 0,
    }
