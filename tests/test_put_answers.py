"""What a PutRecords answer proves, and what copier makes of it: per-entry error codes, and records a stream's
record limit, lowered while their chunk is in flight, refuses.

In process, on the package's fakes (``copier.testing``). Kinesis answers a
record over the stream's limit by refusing the whole request
(``ValidationException``, "Value at 'records.N.member.data' failed to satisfy
constraint: Member must have length less than or equal to <limit>", as moto
answers too); AWS documents two per-entry codes only
(``ProvisionedThroughputExceededException``, ``InternalFailure``), so a
per-entry refusal of such a record is handled as well, as an answer AWS does
not document. See docs/protocol.md, "Assumptions".
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Callable

import pytest
from structlog.testing import capture_logs

from copier.core.limits import MAX_RECORD_BYTES, record_size
from copier.core.packing import unpack_digests
from copier.core.plan import SourceRecord
from copier.core.state import shard_key
from copier.core.streamsettings import refused_limit
from copier.testing.streams import EntryOutcome
from tests.support.fakes import SHARD, SimulatedCrash, SimulatedStall, World, config
from tests.support.model import keyed_event
from tests.test_adversarial import ids_in

KEY = shard_key("staging", SHARD)
MINUTE = 60_000
RAISED = 2 * MAX_RECORD_BYTES  # the target's limit when the chunk is planned (UpdateMaxRecordSize)
LARGE = MAX_RECORD_BYTES + 10  # a record the raised limit takes and the default one refuses


class StalledForever(BaseException):
    """The forwarder kept sleeping on one chunk: the shard would stall for good."""


def give_up_after(world: World, sleeps: int = 60) -> None:
    """A shard that sleeps ``sleeps`` times in one test is stalled: stop it instead of looping forever."""
    real = world.clock.sleep_ms
    count = [0]

    def sleep(ms: int) -> None:
        count[0] += 1
        if count[0] > sleeps:
            raise StalledForever(f"{sleeps} sleeps")
        real(ms)

    world.clock.sleep_ms = sleep  # type: ignore[method-assign]


def at(world: World, seq: int, event_id: str, size: int = 0, pk: str | None = None) -> SourceRecord:
    return keyed_event(seq, event_id, world.clock.now_ms(), size=size, pk=pk)


def answering(first: list[EntryOutcome]) -> Callable[[str, list[tuple[str, bytes]]], tuple[list[EntryOutcome], None]]:
    """The first request's entries meet ``first``; every later one lands."""
    calls = [0]

    def fault(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[EntryOutcome], None]:
        calls[0] += 1
        return (first if calls[0] == 1 else [True] * len(entries)), None

    return fault


# -- item 4: what a per-entry ErrorCode proves ----------------------------------------------------------


@pytest.mark.parametrize("written", [True, False], ids=["written", "not written"])
def test_an_entry_answered_internal_failure_is_verified_before_it_is_sent_again(written: bool) -> None:
    """InternalFailure ("Internal Service Failure") does not say the entry was not written: the entry is looked
    for in the target, alone, and sent again only if it is not there. (It was taken as not written and resent:
    a duplicate when it had been written.)"""
    world = World()
    world.streams.fault = answering([True, (written, "InternalFailure"), True])
    owner = world.worker()
    with capture_logs() as logs:
        owner.process([at(world, 1, "a"), at(world, 2, "b"), at(world, 3, "c")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})
    assert len(world.streams.reads) == 1, "one verification read, for the one entry whose outcome is unknown"
    retried = [(e["code"], e["entries"]) for e in logs if e["event"] == "put_retry"]
    assert retried == ([] if written else [("InternalFailure", 1)])


def test_a_throttled_entry_is_proven_unwritten_and_sent_again_without_a_read() -> None:
    """ProvisionedThroughputExceededException refuses an entry before it is written: retried, nothing read."""
    world = World()
    world.streams.fault = answering([True, False])
    owner = world.worker()
    owner.process([at(world, 1, "a"), at(world, 2, "b")])
    assert world.target_ids() == Counter({"a": 1, "b": 1})
    assert world.streams.reads == []


def test_an_entry_answered_a_code_aws_does_not_document_is_verified_and_the_shard_stalls_meanwhile() -> None:
    """A per-entry code outside AWS's two may mean anything: verified like InternalFailure, and said as a stall
    (retried at the longest backoff) rather than retried blindly."""
    world = World()
    world.streams.fault = answering([(True, "SomethingNewException"), True])
    owner = world.worker()
    with capture_logs() as logs:
        owner.process([at(world, 1, "a"), at(world, 2, "b")])
    assert world.target_ids() == Counter({"a": 1, "b": 1})
    assert [e["code"] for e in logs if e["event"] == "shard_stalled"] == []  # written: found, nothing to retry
    world.streams.fault = answering([(False, "SomethingNewException")])
    with capture_logs() as logs:
        owner.process([at(world, 3, "c")])
    assert world.target_ids() == Counter({"a": 1, "b": 1, "c": 1})
    assert [e["code"] for e in logs if e["event"] == "shard_stalled"] == ["SomethingNewException"]


# -- item 2: a record limit lowered while a chunk is in flight -------------------------------------------


def lowered_after_the_intent(world: World, limit: int = MAX_RECORD_BYTES) -> None:
    """The target's limit is lowered right after the next chunk's digest batch is written (before its put)."""
    done = [False]

    def hook(phase: str, call: str) -> bool:
        if phase == "after" and call == "put_batch" and not done[0]:
            done[0] = True
            world.streams.max_record_bytes["target"] = limit
        return False

    world.store.crash_hook = hook


def dlq_world(**cfg: object) -> World:
    world = World(cfg=config(deadLetterStreamName="dlq", **cfg), stall_after=2)
    world.streams.max_record_bytes.update({"target": RAISED, "dlq": RAISED})  # the envelope keeps the payload
    return world


@pytest.mark.parametrize("answer", ["request refused", "entry refused"])
def test_a_limit_lowered_while_a_chunk_is_in_flight_dead_letters_what_it_refuses(answer: str) -> None:
    """With a dead-letter stream, a record the lowered limit refuses is re-planned to it, recorded in the
    chunk's digest batch (one revision up) before it is put; the chunk's other records reach the target; the
    shard never stalls. (The plan was fixed: the put was retried forever, the shard stalled.)"""
    world = dlq_world()
    if answer == "entry refused":
        world.streams.oversize_entry_code = "ValidationException"
    give_up_after(world)
    owner = world.worker()
    big = at(world, 2, "big", size=LARGE)
    lowered_after_the_intent(world)
    with capture_logs() as logs:
        owner.process([at(world, 1, "a"), big, at(world, 3, "c")])
    assert ids_in(world.streams) == Counter({"a": 1, "big": 1, "c": 1})
    assert [json.loads(e)["eventId"] for e in world.streams.data("target")] == ["a", "c"]
    assert "replanned" in [e["event"] for e in logs]
    batch = world.store.get_batch(KEY, 1)
    assert batch is not None and batch.revision == 1
    assert len(unpack_digests(batch.keyed)) == 2 and len(unpack_digests(batch.deadletter)) == 1
    assert len(unpack_digests(batch.dead_ids)) == 1, "the window learns the dead-lettered event's ID"
    state = owner.state
    assert state is not None and (state.counters["forwarded"], state.counters["dead_lettered"]) == (2, 1)
    with capture_logs():
        owner.process([at(world, 4, "big", size=LARGE)])  # a producer retry of it: a duplicate, dropped
    assert ids_in(world.streams)["big"] == 1


def test_a_refusal_reads_the_limits_at_once_whatever_the_cache_says() -> None:
    """The limits are cached as the adapter caches DescribeStreamSummary (minutes): the first refusal of a chunk
    reads them at once, so a limit lowered just after the last read re-plans at once instead of stalling the
    shard until the cache may be refreshed (30 s)."""
    world = dlq_world()
    world.streams.cache_settings = True
    owner = world.worker()
    owner.process([at(world, 1, "a")])  # the limits are read, and cached
    lowered_after_the_intent(world)
    with capture_logs() as logs:
        owner.process([at(world, 2, "big", size=LARGE), at(world, 3, "c")])
    assert ids_in(world.streams) == Counter({"a": 1, "big": 1, "c": 1})
    assert "shard_stalled" not in [e["event"] for e in logs]


CRASHES = ["before the re-plan's write", "after the re-plan's write", "mid dead-letter put", "before the commit"]


@pytest.mark.parametrize("limit_then", [MAX_RECORD_BYTES, RAISED], ids=["limit still lowered", "raised again"])
@pytest.mark.parametrize("crash", CRASHES)
def test_a_crash_around_a_re_plan_leaves_what_a_successor_verifies_and_redoes_exactly_once(
    crash: str, limit_then: int
) -> None:
    """The writer dies at any point of the re-plan: its successor verifies the chunk as its digest batch says
    (the first one, or the re-planned one), redoes what neither stream holds under its own limits, and every
    event is in the target or the dead-letter stream once, whatever the limit is by then."""
    world = dlq_world(ordering="none")
    owner = world.worker()
    records = [at(world, 1, "a"), at(world, 2, "big", size=LARGE), at(world, 3, "c")]
    batch_writes = [0]

    def hook(phase: str, call: str) -> bool:
        if call == "put_batch" and phase == "after":
            batch_writes[0] += 1
            if batch_writes[0] == 1:
                world.streams.max_record_bytes["target"] = MAX_RECORD_BYTES  # lowered before the put
        if call == "put_batch" and batch_writes[0] >= 1 and phase == "before" and crash.startswith("before the re"):
            return True
        if call == "put_batch" and phase == "after" and batch_writes[0] == 2 and crash.startswith("after the re"):
            return True
        return call == "write" and phase == "before" and crash == "before the commit"

    world.store.crash_hook = hook
    if crash == "mid dead-letter put":
        world.streams.fault = lambda s, e: ([True] * len(e), SimulatedCrash("mid put") if s == "dlq" else None)
    with pytest.raises(SimulatedCrash):
        owner.process(records)
    world.store.crash_hook = lambda p, c: False
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    world.streams.max_record_bytes["target"] = limit_then
    world.clock.advance(MINUTE)
    successor = world.worker()
    successor.process(records)
    assert ids_in(world.streams) == Counter({"a": 1, "big": 1, "c": 1})


def test_an_entry_landed_before_the_limit_was_lowered_is_not_re_planned_nor_sent_again() -> None:
    """copier.ordering = partitionKey: two large events of one key go in two rounds. The first lands, then the
    limit is lowered and the second is refused: only the second is re-planned. A crash before the commit: the
    successor finds the first in the target and the second in the dead-letter stream, and sends neither."""
    world = dlq_world()
    owner = world.worker()
    records = [at(world, 1, "x", size=LARGE, pk="K"), at(world, 2, "y", size=LARGE, pk="K")]
    calls = [0]

    def first_lands_then_lowered(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], None]:
        calls[0] += 1
        if calls[0] == 1:
            world.streams.max_record_bytes["target"] = MAX_RECORD_BYTES  # after this request was accepted
        return [True] * len(entries), None

    world.streams.fault = first_lands_then_lowered
    world.store.crash_hook = lambda phase, call: call == "write" and phase == "before"
    with capture_logs() as logs, pytest.raises(SimulatedCrash):
        owner.process(records)
    assert [e["entries"] for e in logs if e["event"] == "replanned"] == [1]
    world.store.crash_hook = lambda p, c: False
    world.clock.advance(MINUTE)
    with capture_logs() as logs:
        world.worker().process(records)
    verified = [e for e in logs if e["event"] == "verified_pending"]
    assert [(e["landed"], e["to_redo"]) for e in verified] == [(2, 0)]
    assert ids_in(world.streams) == Counter({"x": 1, "y": 1})
    assert [json.loads(e)["eventId"] for e in world.streams.data("target")] == ["x"]


def test_a_late_first_write_of_the_intent_cannot_undo_a_re_plan() -> None:
    """The chunk's first digest batch write gets no answer and is retried; the re-plan writes the batch again;
    then the first attempt reaches the table. It is refused (a lower revision): had it put back the batch that
    names the dead-lettered record as a target entry, the successor, not finding it in the target, would have
    put it to the dead-letter stream a second time."""
    world = dlq_world(ordering="none")
    owner = world.worker()
    records = [at(world, 1, "a"), at(world, 2, "big", size=LARGE), at(world, 3, "c")]
    world.store.lose_next_batch_answer = True
    lowered_after_the_intent(world)
    crash_before_commit = world.store.crash_hook

    def hook(phase: str, call: str) -> bool:
        crash_before_commit(phase, call)
        return call == "write" and phase == "before" and world.streams.data("dlq") != []

    world.store.crash_hook = hook
    with capture_logs() as logs, pytest.raises(SimulatedCrash):
        owner.process(records)
    assert "replanned" in [e["event"] for e in logs]
    world.store.crash_hook = lambda p, c: False
    world.store.land_late()  # the first attempt of the intent's write lands now
    world.clock.advance(MINUTE)
    world.worker().process(records)
    assert ids_in(world.streams) == Counter({"a": 1, "big": 1, "c": 1})


def test_a_limit_raised_again_before_the_re_plan_reads_it_sends_the_record_as_planned() -> None:
    """Lowered, one request refused, raised again before the limits are read again: nothing is re-planned, the
    request is sent again as it was (one stall said) and the record reaches the target."""
    world = dlq_world()
    owner = world.worker()
    lowered_after_the_intent(world)

    def raise_again() -> None:
        world.streams.max_record_bytes["target"] = RAISED

    world.streams.on_refused = raise_again
    with capture_logs() as logs:
        owner.process([at(world, 1, "a"), at(world, 2, "big", size=LARGE)])
    assert [json.loads(e)["eventId"] for e in world.streams.data("target")] == ["a", "big"]
    assert world.streams.data("dlq") == []
    events = [e["event"] for e in logs]
    assert "replanned" not in events and events.count("shard_stalled") == 1


@pytest.mark.parametrize("crash", [None, "after the re-plan's write", "mid dead-letter put"])
def test_an_envelope_the_dead_letter_stream_now_refuses_is_wrapped_again_though_the_target_would_take_it(
    crash: str | None,
) -> None:
    """A record over the target's limit is planned for the dead-letter stream, its envelope keeping the payload
    under that stream's raised limit. While the chunk is in flight the operator raises the target's limit and
    lowers the dead-letter stream's: the envelope is refused. It stays bound for the dead-letter stream and is
    wrapped again (the payload's SHA-256 instead, its first reason kept), recorded in the chunk's digest batch
    before it is put; a successor after a crash verifies and redoes it exactly once. Before, the re-plan asked
    what the record would become now (the target, which takes it now), kept only moves to the dead-letter
    stream, and changed nothing: the shard stalled, dead-letter stream or not."""
    world = World(cfg=config(deadLetterStreamName="dlq", ordering="none"), stall_after=2)
    world.streams.max_record_bytes["dlq"] = RAISED  # the envelope keeps the payload when the chunk is planned
    give_up_after(world)
    owner = world.worker()
    records = [at(world, 1, "a"), at(world, 2, "big", size=LARGE), at(world, 3, "c")]
    batch_writes = [0]

    def hook(phase: str, call: str) -> bool:
        if call == "put_batch" and phase == "after":
            batch_writes[0] += 1
            if batch_writes[0] == 1:  # the intent is written: both limits change before the put
                world.streams.max_record_bytes.update({"target": RAISED, "dlq": MAX_RECORD_BYTES})
            return crash == "after the re-plan's write" and batch_writes[0] == 2
        return False

    world.store.crash_hook = hook
    if crash == "mid dead-letter put":
        world.streams.fault = lambda s, e: ([True] * len(e), SimulatedCrash("mid put") if s == "dlq" else None)
    with capture_logs() as logs:
        if crash is None:
            owner.process(records)
        else:
            with pytest.raises(SimulatedCrash):
                owner.process(records)
    assert "shard_stalled" not in [e["event"] for e in logs]
    batch = world.store.get_batch(KEY, 1)
    assert batch is not None and batch.revision == 1 and len(unpack_digests(batch.deadletter)) == 1
    if crash is not None:
        world.store.crash_hook = lambda p, c: False
        world.streams.fault = lambda s, e: ([True] * len(e), None)
        world.clock.advance(MINUTE)
        world.worker().process(records)
    if crash == "after the re-plan's write":  # nothing was dead-lettered: redone under the limits now, to the target
        assert ids_in(world.streams) == Counter({"a": 1, "big": 1, "c": 1}) and world.streams.data("dlq") == []
        return
    big = records[1]
    digest = hashlib.sha256(big.data).hexdigest()
    assert ids_in(world.streams) == Counter({"a": 1, f"sha256:{digest}": 1, "c": 1})
    size = record_size(big.partition_key, big.data)
    reason = f"record of {size} bytes exceeds the target's limit of {MAX_RECORD_BYTES} bytes"  # its first reason
    assert [json.loads(e)["reason"] for e in world.streams.data("dlq")] == [reason]


def test_without_a_dead_letter_stream_a_lowered_limit_still_stalls_the_shard() -> None:
    """Nothing to re-plan to: the shard stalls (shard_stalled, retried) and the runbook's restart with a
    dead-letter stream delivers the record once."""
    world = World(stall_after=2)
    world.streams.max_record_bytes.update({"target": RAISED, "dlq": RAISED})
    owner = world.worker()
    records = [at(world, 1, "a"), at(world, 2, "big", size=LARGE)]
    lowered_after_the_intent(world)
    with pytest.raises(SimulatedStall):
        owner.process(records)
    world.clock.advance(MINUTE)
    world.worker(cfg=config(deadLetterStreamName="dlq")).process(records)
    assert ids_in(world.streams) == Counter({"a": 1, "big": 1})


# -- a record limit copier cannot read (issue 47) -----------------------------------------------------------

HALF_OVER = MAX_RECORD_BYTES * 3 // 2  # 1.5 MiB: over the default limit, within a raised one


def test_a_record_over_1_mib_is_forwarded_when_the_targets_limit_cannot_be_read_and_the_target_takes_it() -> None:
    """DescribeStreamSummary fails for the target (throttled: no answer yet) and the target in fact takes 10 MiB
    records: a 1.5 MiB record is forwarded to it, as it would be with the limit known. (The unknown limit was
    taken as 1 MiB: the record was dead-lettered on a guess.)"""
    world = dlq_world()
    world.streams.max_record_bytes["target"] = 10 * MAX_RECORD_BYTES
    world.streams.unreadable.add("target")
    owner = world.worker()
    with capture_logs() as logs:
        owner.process([at(world, 1, "a"), at(world, 2, "big", size=HALF_OVER)])
    assert [json.loads(d)["eventId"] for d in world.streams.data("target")] == ["a", "big"]
    assert world.streams.data("dlq") == []
    assert "rerouted" not in [e["event"] for e in logs]


def test_a_record_the_unread_limit_refuses_is_dead_lettered_for_the_limit_the_refusal_names() -> None:
    """The target's limit cannot be read and really is 1 MiB: the 1.5 MiB record is tried and refused whole; the
    refusal names the limit, and the record is dead-lettered for it at once (the shard does not wait for
    DescribeStreamSummary, which stays unreadable), the chunk's other record reaching the target once."""
    world = World(cfg=config(deadLetterStreamName="dlq"))
    world.streams.max_record_bytes["dlq"] = 10 * MAX_RECORD_BYTES  # the envelope keeps the payload
    world.streams.unreadable.add("target")
    refusals = [0]

    def count() -> None:
        refusals[0] += 1

    world.streams.on_refused = count
    give_up_after(world)
    owner = world.worker()
    with capture_logs() as logs:
        owner.process([at(world, 1, "a"), at(world, 2, "big", size=HALF_OVER)])
    assert refusals[0] == 1, "the put was tried once: the target decided"
    assert "shard_stalled" not in [e["event"] for e in logs]
    assert world.target_ids() == Counter({"a": 1}) and ids_in(world.streams) == Counter({"a": 1, "big": 1})
    (envelope,) = [json.loads(d) for d in world.streams.data("dlq")]
    assert f"limit of {MAX_RECORD_BYTES} bytes" in envelope["reason"]


def test_the_limit_a_refusal_names_is_read_only_from_a_records_data() -> None:
    """AWS's words for a record over the limit name it; its words for a request of over 500 entries name 500 of
    'records', which is no record limit; another code names none."""
    over = (
        "1 validation error detected: Value at 'records.3.member.data' failed to satisfy constraint: Member must "
        "have length less than or equal to 1048576"
    )
    many = (
        "1 validation error detected: Value at 'records' failed to satisfy constraint: Member must have length "
        "less than or equal to 500"
    )
    assert refused_limit("ValidationException", over) == MAX_RECORD_BYTES
    assert refused_limit("ValidationException", many) is None
    assert refused_limit("InvalidArgumentException", over) == MAX_RECORD_BYTES  # the code AWS's model lists
    assert refused_limit("AccessDeniedException", over) is None
    assert refused_limit("ValidationException", "something else") is None
