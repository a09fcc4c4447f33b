"""Exactly-once of the whole per-shard protocol, under crashes, zombies and put faults, as a property.

A ShardWorker runs on the in-memory store and streams. Hypothesis draws the
events (with producer duplicates), the batches the daemon delivers, the
chunk size, whether each committed position gets checkpointed, and faults:
throttled entries, ambiguous puts with any subset landed, crashes before or
after any state write or digest batch write or in the middle of a put, and
a writer frozen just before its digest batch write while a successor takes
over, whose write then lands at a drawn later moment (a zombie's leftover),
and a lease race: a rival takes copier's lease (and may forward a few
batches from the checkpoint) and then loses the daemon's lease, while the
first worker keeps receiving batches, fenced, until it can take the shard
back, and at the shard's end waits until it can.
After a crash a new worker takes the shard over and the daemon replays from
the last checkpoint, as the KCL does. Whatever was drawn, the target must
hold each event ID exactly once.
"""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from copier.errors import AmbiguousPutError
from copier.plan import SourceRecord
from copier.positions import Position
from tests.support.fakes import SimulatedCrash, SimulatedPause, World, config, rec

FAULTS = st.sampled_from(["none", "none", "throttle", "ambiguous", "crash_mid_put", "crash_store", "pause", "race"])


def run(data: st.DataObject, records: list[SourceRecord]) -> World:
    """Drive successive workers over ``records`` with drawn batches, checkpoints and faults."""
    coalescing = data.draw(st.booleans(), label="small deliveries wait")
    daemon = {"callProcessRecordsEvenForEmptyRecordList": "true"} if coalescing else {}
    cfg = config(daemon, coalesceEvents=data.draw(st.integers(2, 6), label="coalesce events"), coalesceMillis=300)
    world = World(cfg, chunk_events=data.draw(st.integers(1, 4), label="chunk size"))
    worker = world.worker()
    checkpoint = 0  # number of records up to the last checkpoint
    position = 0
    fault_budget = 8
    wake_in = -1  # rounds until a frozen writer's held write lands
    while position < len(records) or world.store.held:
        if wake_in == 0 or (world.store.held and position >= len(records)):
            world.store.release_held()
            if data.draw(st.booleans(), label="lease moves after the zombie's write"):
                worker.release()
                worker = world.worker()  # reloads the window from what the table now says
                position = checkpoint
        wake_in -= 1
        if position >= len(records):
            break
        idle = data.draw(st.booleans(), label="an empty call of an idle shard")
        size = 0 if idle else data.draw(st.integers(1, 8), label="batch size")
        batch = records[position : position + size]
        world.clock.advance(data.draw(st.sampled_from([0, 0, 100, 400]), label="ms since the last call"))
        fault = data.draw(FAULTS, label="fault") if fault_budget > 0 else "none"
        if fault != "none":
            fault_budget -= 1
        if fault == "race":
            checkpoint = _race(data, world, records, checkpoint)
            fault = "none"
        mask = data.draw(st.lists(st.booleans(), min_size=len(batch), max_size=len(batch)), label="landed mask")
        latency = data.draw(st.sampled_from([0, 0, 700, 2600]), label="put latency ms")
        calls = {"n": 0}

        def put_fault(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
            calls["n"] += 1
            first = calls["n"] == 1
            world.clock.advance(latency)  # records land this long after the chunk started
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
        call = data.draw(st.sampled_from(["put_batch", "write"]), label="crash at")
        world.store.crash_hook = lambda p, c: fault == "crash_store" and p == phase and c == call
        world.store.hold_next = fault == "pause" and not world.store.held
        try:
            committed = worker.process(batch)
        except (SimulatedCrash, SimulatedPause) as stopped:
            if isinstance(stopped, SimulatedPause):  # frozen past its lease: a successor takes over
                world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis + 1)
                wake_in = data.draw(st.integers(0, 3), label="frozen for rounds")
            _reset(world)
            worker = world.worker()
            position = checkpoint  # the KCL replays from its checkpoint
            continue
        finally:
            _reset(world)
        position += len(batch)
        if committed is not None and data.draw(st.booleans(), label="checkpointed"):
            checkpoint = position
    # The shard ends: the daemon asks its last processor once. A fenced one waits out the rival's lease (on the
    # fake clock), takes the shard back and forwards what it holds before it answers; what waits goes out.
    assert worker.end_shard(), "the last processor closes the shard"
    return world


def _race(data: st.DataObject, world: World, records: list[SourceRecord], checkpoint: int) -> int:
    """A rival takes copier's lease, forwards a few batches from the checkpoint, then loses the daemon's lease.

    Returns the KCL checkpoint afterwards (the rival may have moved it).
    """
    rival = world.worker()
    for _ in range(data.draw(st.integers(0, 2), label="batches the rival forwards")):
        size = data.draw(st.integers(1, 6), label="rival batch size")
        batch = records[checkpoint : checkpoint + size]
        if batch and rival.process(batch) is not None and data.draw(st.booleans(), label="rival checkpointed"):
            checkpoint += len(batch)
    rival.lose_lease()
    if data.draw(st.booleans(), label="time passes before the next batch"):
        world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis)
    return checkpoint


def _reset(world: World) -> None:
    world.store.crash_hook = lambda p, c: False
    world.store.hold_next = False
    world.streams.fault = lambda s, e: ([True] * len(e), None)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_event_lands_exactly_once_whatever_fails(data: st.DataObject) -> None:
    """Under any drawn mix of duplicates, chunks, checkpoints, faults, crashes and zombies: exactly once."""
    ids = data.draw(st.lists(st.sampled_from("abcdefghijklmnop"), min_size=1, max_size=40), label="event ids")
    records = [rec(10 + i, event_id, body=f"copy{i}", arrival_ms=i * 1000) for i, event_id in enumerate(ids)]
    world = run(data, records)
    assert world.target_ids() == Counter({event_id: 1 for event_id in set(ids)})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_identical_events_without_an_id_are_never_lost(data: st.DataObject) -> None:
    """Records without an event ID, some identical, mixed with keyed ones: keyed exactly once, unkeyed at least once.

    Identical unkeyed records cannot be told apart in the target, so a
    verification errs towards sending one again, never towards losing one.
    """
    kinds = st.one_of(st.sampled_from("abcdef"), st.sampled_from(["u1", "u2"]))
    drawn = data.draw(st.lists(kinds, min_size=1, max_size=30), label="events")
    records = [
        rec(10 + i, k, arrival_ms=i * 1000) if len(k) == 1 else SourceRecord(Position(10 + i), "same", k.encode(), 0)
        for i, k in enumerate(drawn)
    ]
    world = run(data, records)
    found: Counter[str] = Counter()
    for payload in world.streams.data("target"):
        found[payload.decode() if payload in (b"u1", b"u2") else json.loads(payload)["eventId"]] += 1
    for kind, produced in Counter(drawn).items():
        if len(kind) == 1:
            assert found[kind] == 1, (kind, found)
        else:
            assert found[kind] >= produced, (kind, produced, found)


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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_partition_key_keeps_its_staging_order_whatever_fails(data: st.DataObject) -> None:
    """copier.ordering = partitionKey: events of a key land in staging order through throttling, ambiguous
    puts, crashes and takeovers (hot keys: few keys, many events each)."""
    keys = data.draw(st.lists(st.sampled_from("KLM"), min_size=1, max_size=40), label="partition keys")
    records = [
        SourceRecord(Position(10 + i), key, json.dumps({"eventId": f"e{i}"}).encode(), i * 1000)
        for i, key in enumerate(keys)
    ]
    world = run(data, records)
    landed = [(pk, json.loads(payload)["eventId"]) for pk, payload, _, _ in world.streams.records["target"]]
    assert Counter(event_id for _, event_id in landed) == Counter(f"e{i}" for i in range(len(keys)))
    for key in set(keys):
        order = [int(event_id[1:]) for pk, event_id in landed if pk == key]
        assert order == sorted(order), (key, order)
