"""Processors waiting for one shard never fence each other for ever (copier.shard.ownership, ``take_over``).

Found by a chaos seed on the second backend: a worker whose KCL lease of a
shard changed hands several times held several processors waiting in their
takeover for that shard (a processor waiting there cannot hear that its
KCL lease moved on). Each announced itself against whichever of them had
taken the shard over last, so every new owner was fenced before it
committed its verification: 16 epochs in 5 minutes, nothing forwarded. A
waiter now announces itself only against the owner it found at its first
look. One that another processor beat to the shard waits, announcing
nothing, for the end of that owner's lease as it first saw it: released or
run out by then, it takes the shard over; still held (an owner at work), it
is fenced, holds, and takes the shard back once that owner is gone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from structlog.testing import capture_logs

from copier.core.errors import FencedError
from copier.core.positions import Position
from copier.core.repair import plan_repair
from copier.core.state import shard_key
from copier.shard import ShardWorker
from copier.shard.source import SourceShard
from copier.testing import FakeClock
from tests.support.fakes import SHARD, World, rec

KEY = shard_key("staging", SHARD)


@contextmanager
def while_waiting(clock: FakeClock, *acts: Callable[[], object]) -> Iterator[list[object]]:
    """Within the block, the n-th act runs right after the n-th sleep on ``clock`` (other processors acting while
    one waits), never from within an act (an act may sleep too); the yielded list holds their results."""
    sleep = clock.sleep_ms
    done: list[object] = []
    acting: list[bool] = []

    def then_act(ms: int) -> None:
        sleep(ms)
        if not acting and len(done) < len(acts):
            acting.append(True)
            try:
                done.append(acts[len(done)]())
            finally:
                acting.clear()

    clock.sleep_ms = then_act  # type: ignore[method-assign]
    try:
        yield done
    finally:
        clock.sleep_ms = sleep  # type: ignore[method-assign]


def beaten_by_an_owner_at_work(world: World, first: ShardWorker, lose: bool = False) -> tuple[ShardWorker, ShardWorker]:
    """A waiter (returned) and the processor that took the shard over while it waited (``lose``: after ``first``
    was told its lease moved) and then committed ``b`` (at work: its lease renewed) while the waiter still waited."""
    beat: list[ShardWorker] = []

    def another_takes_it() -> None:
        if lose:
            first.lose_lease()  # released under the waiter's announcement
        beat.append(world.worker())

    def it_forwards() -> None:
        assert beat[0].process([rec(2, "b")]) == Position(2)

    with while_waiting(world.clock, another_takes_it, it_forwards) as done:
        waiter = world.worker()
    assert len(done) == 2, "the waiter was still waiting when the new owner committed"
    return waiter, beat[0]


def test_a_waiter_beaten_to_the_shard_does_not_fence_the_new_owner() -> None:
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    with capture_logs() as logs:
        waiter, owner = beaten_by_an_owner_at_work(world, first, lose=True)
    assert waiter.fenced, "the waiter stands back"
    assert [e["epoch"] for e in logs if e["event"] == "superseded"] == [2]
    state = world.store.get(KEY)
    assert state is not None and state.owner == owner.owner and state.epoch == 2
    assert state.successor is None, "the waiter did not announce itself against the new owner"
    assert owner.process([rec(3, "c")]) == Position(3), "the new owner forwards"
    assert waiter.process([rec(2, "b"), rec(3, "c")]) is None, "the waiter holds"
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_of_two_waiters_the_one_that_takes_the_shard_is_not_fenced_by_the_other() -> None:
    """The chaos seed's loop: two processors wait out one owner's lease; the second takes the shard first (the
    first slept on). The first, looking again, must leave it be: before, it announced itself and fenced it."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])  # then first stops: its lease is slept out
    with capture_logs() as logs:
        waiter, winner = beaten_by_an_owner_at_work(world, first)
    assert not winner.fenced and waiter.fenced
    assert [e["event"] for e in logs if e["event"] in ("took_over", "superseded", "fenced")] == [
        "took_over",
        "superseded",
        "fenced",
    ]
    assert winner.process([rec(3, "c")]) == Position(3)
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_a_superseded_waiter_takes_the_shard_back_once_the_owner_gives_it_up() -> None:
    """When the waiter's own KCL lease is the one that stands, the owner that beat it is told its lease moved
    and releases it; the waiter, holding what the daemon delivered, takes the shard back and forwards each
    record once."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    waiter, owner = beaten_by_an_owner_at_work(world, first)
    assert waiter.fenced and waiter.process([rec(1, "a"), rec(2, "b")]) is None, "held"
    owner.lose_lease()
    with capture_logs() as logs:
        assert waiter.process([rec(3, "c")]) == Position(3)
    assert [e["event"] for e in logs if e["event"] == "took_back"] == ["took_back"]
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_a_superseded_waiters_release_leaves_the_owners_lease_alone() -> None:
    """Told its lease moved or asked to shut down before it ever owned the shard, the waiter writes nothing: the
    item is the owner's."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    waiter, owner = beaten_by_an_owner_at_work(world, first)
    before = world.store.get(KEY)
    assert waiter.release() is None
    assert waiter.lose_lease() is False
    assert world.store.get(KEY) == before
    assert owner.process([rec(3, "c")]) == Position(3)


def test_a_waiter_whose_winner_is_told_its_lease_moved_takes_the_shard_over_before_it_returns() -> None:
    """The waiter's KCL lease is the one that stands; the processor that beat it to the item is the stale one,
    told so once its own takeover returns, and it releases. Returned fenced at once, the waiter would be handed
    its backlog while that owner still held the item, hold it, and take the shard back only at a later delivery:
    on a quiet shard (the daemon calls nobody on an empty poll by default) that delivery may never come."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    beat: list[ShardWorker] = []
    told = (lambda: beat.append(world.worker()), lambda: beat[0].lose_lease())
    with capture_logs() as logs, while_waiting(world.clock, *told):
        waiter = world.worker()
    waiter.process([rec(2, "b")])  # its backlog, the only delivery: nothing new comes to this shard
    if not beat[0].ownership.given_up:
        beat[0].lose_lease()  # told only now
    assert world.target_ids() == Counter({"a": 1, "b": 1}), "the backlog is forwarded, not held for ever"
    assert not waiter.fenced and "superseded" not in [e["event"] for e in logs]
    state = world.store.get(KEY)
    assert state is not None and state.owner == waiter.owner and state.epoch == 3


def test_a_waiter_whose_winner_died_takes_the_shard_over_once_its_lease_runs_out() -> None:
    """The processor that beat the waiter is killed before it renews its lease: the waiter takes the shard over
    when that lease (and the clock margin) is over, rather than return fenced and hold its backlog behind a
    delivery that may never come."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    with while_waiting(world.clock, world.worker):  # then it dies: nothing of it runs again
        waiter = world.worker()
    assert waiter.process([rec(2, "b")]) == Position(2)
    assert world.target_ids() == Counter({"a": 1, "b": 1})
    state = world.store.get(KEY)
    assert state is not None and state.owner == waiter.owner and state.epoch == 3


def test_of_two_runs_of_a_source_one_holds_every_shard() -> None:
    """Two repair runs meet on two shards (``copier.shard.source``): B takes the first over from A (announced, A's
    lease slept out) and, on the second, waits out a killed run's lease beside A, which takes it first. Standing
    back there at once, B stopped as A did (fenced on the first): neither run went on. A, fenced on the first
    shard, stops and releases the second (``redrive``'s and ``repair``'s finish); B, still waiting, takes it."""
    world = World()
    lease = world.config.lease_millis

    def run(owner: str) -> SourceShard:
        config, store, streams = world.config, world.store, world.streams
        return SourceShard(config, store, streams, "repair:", plan_repair, clock=world.clock, owner=owner, window=False)

    a1, a2, b1, b2 = run("a"), run("a"), run("b"), run("b")
    assert a1.take("s1")
    world.clock.sleep_ms(lease // 2)
    assert run("killed").take("s2")  # then killed: its lease stays
    assert b1.take("s1"), "B announces itself on A's first shard and sleeps A's lease out"

    def a_is_fenced_and_releases_the_rest() -> None:
        with pytest.raises(FencedError):
            a1.session.keep_lease()  # A's next renewal there is refused: it stops and releases what it holds
        a2.finish()

    with while_waiting(world.clock, lambda: a2.take("s2"), a_is_fenced_and_releases_the_rest) as done:
        took = b2.take("s2")
    assert took and not b1.fenced and not b2.fenced, "B holds every shard: one of the two runs goes on"
    assert done == [True, None], "A took the second shard while B waited for it, then released it"
