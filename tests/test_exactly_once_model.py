"""Exactly-once of the whole per-shard protocol, under crashes and put faults, as a property.

A ShardWorker runs on the in-memory store and streams. Hypothesis draws the
events (with producer duplicates), the batches the daemon delivers, whether
each committed position gets checkpointed, and faults: throttled entries,
ambiguous puts with any subset landed, and crashes before or after any
state write or in the middle of a put. After a crash a new worker takes the
shard over and the daemon replays from the last checkpoint, as the KCL does.
Whatever was drawn, the target must hold each event ID exactly once.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from copier.errors import AmbiguousPutError
from tests.support.fakes import SimulatedCrash, World, rec

FAULTS = st.sampled_from(["none", "none", "throttle", "ambiguous", "crash_mid_put", "crash_store"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_event_lands_exactly_once_whatever_fails(data: st.DataObject) -> None:
    """Under any drawn mix of duplicates, batches, checkpoints, faults and crashes: exactly once."""
    ids = data.draw(st.lists(st.sampled_from("abcdefghijklmnop"), min_size=1, max_size=40), label="event ids")
    records = [rec(10 + i, event_id, body=f"copy{i}") for i, event_id in enumerate(ids)]
    world = World()
    worker = world.worker()
    checkpoint = 0  # number of records up to the last checkpoint
    position = 0
    fault_budget = 8
    while position < len(records):
        size = data.draw(st.integers(1, 8), label="batch size")
        batch = records[position : position + size]
        fault = data.draw(FAULTS, label="fault") if fault_budget > 0 else "none"
        if fault != "none":
            fault_budget -= 1
        mask = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)), label="landed mask")
        calls = {"n": 0}

        def put_fault(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
            calls["n"] += 1
            first = calls["n"] == 1
            land = (mask + [True] * len(entries))[: len(entries)]
            if fault == "throttle" and first:
                return land, None
            if fault == "ambiguous" and first:
                return land, AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected")
            if fault == "crash_mid_put" and first:
                return land, SimulatedCrash("mid put")
            return [True] * len(entries), None

        world.streams.fault = put_fault
        phase = data.draw(st.sampled_from(["before", "after"]), label="crash phase")
        with_batch = data.draw(st.booleans(), label="crash at intent (else commit)")
        world.store.crash_hook = lambda p, b: fault == "crash_store" and p == phase and b == with_batch
        try:
            committed = worker.process(batch)
        except SimulatedCrash:
            world.store.crash_hook = lambda p, b: False
            world.streams.fault = lambda s, e: ([True] * len(e), None)
            worker = world.worker()  # a new process takes over after the old lease
            position = checkpoint  # the KCL replays from its checkpoint
            continue
        position += len(batch)
        if committed is not None and data.draw(st.booleans(), label="checkpointed"):
            checkpoint = position
    assert world.target_ids() == Counter({event_id: 1 for event_id in set(ids)})


def test_a_crash_after_a_put_landed_is_verified_not_resent() -> None:
    """The successor reads the target, finds the batch there and forwards none of it again."""
    world = World()
    worker = world.worker()
    world.streams.fault = lambda s, e: ([True] * len(e), SimulatedCrash("after put"))
    try:
        worker.process([rec(1, "a"), rec(2, "b")])
    except SimulatedCrash:
        pass
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    successor = world.worker()
    assert successor.state is not None and successor.state.counters.get("already_landed") == 2
    successor.process([rec(1, "a"), rec(2, "b"), rec(3, "c")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})
    assert world.clock.slept, "the successor slept out the dead owner's lease"
