"""Processors waiting for one shard never fence each other for ever (copier.shard.ownership, ``take_over``).

Found by a chaos seed on the second backend: a worker whose KCL lease of a
shard changed hands several times held several processors waiting in their
takeover for that shard (a processor waiting there cannot hear that its
KCL lease moved on). Each announced itself against whichever of them had
taken the shard over last, so every new owner was fenced before it
committed its verification: 16 epochs in 5 minutes, nothing forwarded. A
waiter now announces itself only against the owner it found at its first
look; one that another processor beat to the shard is fenced, holds, and
takes the shard back once that owner is gone.
"""

from __future__ import annotations

from collections import Counter

from structlog.testing import capture_logs

from copier.core.positions import Position
from copier.core.state import shard_key
from copier.shard.worker import ShardWorker
from tests.support.fakes import SHARD, World, once_asleep, rec

KEY = shard_key("staging", SHARD)


def beaten() -> tuple[World, ShardWorker, ShardWorker]:
    """An owner forwarded "a" and stopped; a processor waits out its lease, and while it sleeps another takes
    the shard over: (the world, that new owner, the waiter it superseded)."""
    world = World()
    world.worker().process([rec(1, "a")])
    beat: list[ShardWorker] = []
    with once_asleep(world.clock, lambda: beat.append(world.worker())):
        waiter = world.worker()
    return world, beat[0], waiter


def test_a_waiter_beaten_to_the_shard_does_not_fence_the_new_owner() -> None:
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])
    beat: list[ShardWorker] = []

    def another_takes_it() -> None:
        first.lose_lease()  # the KCL moved first's lease: released under the waiter's announcement
        beat.append(world.worker())  # and another processor took the shard before the waiter looked again

    with capture_logs() as logs, once_asleep(world.clock, another_takes_it):
        waiter = world.worker()
    assert len(beat) == 1
    owner = beat[0]
    assert waiter.fenced, "the waiter stands back"
    assert [e["epoch"] for e in logs if e["event"] == "superseded"] == [2]
    state = world.store.get(KEY)
    assert state is not None and state.owner == owner.owner and state.epoch == 2
    assert state.successor is None, "the waiter did not announce itself against the new owner"
    assert owner.process([rec(2, "b")]) == Position(2), "the new owner forwards"
    assert waiter.process([rec(2, "b")]) is None, "the waiter holds"
    assert world.target_ids() == Counter({"a": 1, "b": 1})


def test_of_two_waiters_the_one_that_takes_the_shard_is_not_fenced_by_the_other() -> None:
    """The chaos seed's loop: two processors wait out one owner's lease; the second takes the shard first (the
    first slept on). The first, looking again, must leave it be: before, it announced itself and fenced it."""
    world = World()
    first = world.worker()
    first.process([rec(1, "a")])  # then first stops: its lease is slept out
    second: list[ShardWorker] = []
    with capture_logs() as logs, once_asleep(world.clock, lambda: second.append(world.worker())):
        waiter = world.worker()
    winner = second[0]
    assert not winner.fenced and waiter.fenced
    assert [e["event"] for e in logs if e["event"] in ("took_over", "superseded", "fenced")] == [
        "took_over",
        "superseded",
        "fenced",
    ]
    assert winner.process([rec(2, "b")]) == Position(2)
    assert world.target_ids() == Counter({"a": 1, "b": 1})


def test_a_superseded_waiter_takes_the_shard_back_once_the_owner_gives_it_up() -> None:
    """When the waiter's own KCL lease is the one that stands, the owner that beat it is told its lease moved
    and releases it; the waiter, holding what the daemon delivered, takes the shard back and forwards each
    record once."""
    world, owner, waiter = beaten()
    assert waiter.fenced and waiter.process([rec(1, "a"), rec(2, "b")]) is None, "held"
    owner.process([rec(2, "b")])
    owner.lose_lease()
    with capture_logs() as logs:
        assert waiter.process([rec(3, "c")]) == Position(3)
    assert [e["event"] for e in logs if e["event"] == "took_back"] == ["took_back"]
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})


def test_a_superseded_waiters_release_leaves_the_owners_lease_alone() -> None:
    """Told its lease moved or asked to shut down before it ever owned the shard, the waiter writes nothing: the
    item is the owner's."""
    world, owner, waiter = beaten()
    before = world.store.get(KEY)
    assert waiter.release() is None
    assert waiter.lose_lease() is False
    assert world.store.get(KEY) == before
    assert owner.process([rec(2, "b")]) == Position(2)
