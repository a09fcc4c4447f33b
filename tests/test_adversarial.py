"""Regressions for the holes an adversarial read of the protocol found: each fails on the code before its fix.

In process, on the package's fakes (``copier.testing``): configuration
changes between owners with a chunk in flight, a target reshard while a put
is ambiguous, another shard's identical record, a fence while verifying,
a fenced processor given more than it can hold, an outage past the target's
retention or the digest TTL, partition keys Kinesis refuses, and a dedup
key changed within the window.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections import Counter
from dataclasses import replace

import pytest
from structlog.testing import capture_logs

from copier.adapters.kinesisread import KinesisReads
from copier.core.config import Config
from copier.core.errors import AmbiguousPutError, FatalAwsError, TransientAwsError
from copier.core.limits import UTF16_UNITS
from copier.core.packing import pack_digests
from copier.core.plan import PlanSettings, SourceRecord, becomes
from copier.core.positions import Position
from copier.core.state import DigestBatch, ShardState, shard_key
from copier.testing import InMemoryStreams
from tests.support.fakes import (
    SHARD,
    OffsetClock,
    SimulatedCrash,
    SimulatedPause,
    SimulatedStall,
    World,
    config,
    measured,
    once_asleep,
)
from tests.support.model import keyed_event, unkeyed

KEY = shard_key("staging", SHARD)
MINUTE = 60_000
HOUR = 60 * MINUTE
BIG = 1024 * 1024 + 10


def ids_in(streams: InMemoryStreams) -> Counter[str]:
    """Event IDs in the target and, through their envelopes, the dead-letter stream (by their original bytes)."""
    found: Counter[str] = Counter()
    for data in streams.data("target"):
        if data.startswith(b"{"):
            found[json.loads(data)["eventId"]] += 1
    for envelope in streams.data("dlq"):
        body = json.loads(envelope)
        found[_original_id(body)] += 1
    return found


def _original_id(body: dict[str, object]) -> str:
    data = body.get("data")
    if data is None:
        return f"sha256:{body['dataSha256']}"
    original = base64.b64decode(str(data))
    return str(json.loads(original)["eventId"]) if original.startswith(b"{") else original.decode()


def crash_mid_put(world: World, landed: bool) -> None:
    """The next put lands (or not) and the process dies before it hears back."""
    world.streams.fault = lambda s, e: ([landed] * len(e), SimulatedCrash("mid put"))


def all_land(world: World) -> None:
    world.streams.fault = lambda s, e: ([True] * len(e), None)


def left_in_flight(world: World, records: list[SourceRecord], landed: bool = True, outage_ms: int = MINUTE) -> None:
    """A processor takes the shard, puts ``records`` (landed or not) and dies mid-put; nobody runs for ``outage_ms``."""
    owner = world.worker()
    crash_mid_put(world, landed)
    with pytest.raises(SimulatedCrash):
        owner.process(records)
    all_land(world)
    world.clock.advance(outage_ms)


def at(world: World, seq: int, event_id: str, **kw: object) -> SourceRecord:
    return keyed_event(seq, event_id, world.clock.now_ms(), **kw)  # type: ignore[arg-type]


# -- 1. a configuration change between owners ------------------------------------------------------


def test_the_runbook_for_a_stalled_record_delivers_it_to_the_dead_letter_stream() -> None:
    """docs/operations.md "Stalled shard": a record too large with no dead-letter stream stalls the shard; set
    copier.deadLetterStreamName and restart: the record reaches the dead-letter stream (it was lost)."""
    world = World(stall_after=2)
    owner = world.worker()
    big = at(world, 1, "big", size=BIG)
    with pytest.raises(SimulatedStall):
        owner.process([big, at(world, 2, "b")])
    world.clock.advance(MINUTE)
    successor = world.worker(cfg=config(deadLetterStreamName="dlq"))
    successor.process([big, at(world, 2, "b")])
    assert ids_in(world.streams) == Counter({"b": 1, f"sha256:{hashlib.sha256(big.data).hexdigest()}": 1})


CHANGES = [
    pytest.param({}, {"dedupKey": "json:id"}, id="dedupKey"),
    pytest.param({"deadLetterStreamName": "dlq"}, {}, id="dead-letter stream removed"),
    pytest.param({}, {"deadLetterStreamName": "dlq"}, id="dead-letter stream added"),
    pytest.param(
        {"deadLetterStreamName": "dlq"}, {"deadLetterStreamName": "dlq", "unkeyedPolicy": "deadletter"}, id="policy"
    ),
    pytest.param({}, {"ordering": "none"}, id="ordering"),
]


@pytest.mark.parametrize("landed", [True, False], ids=["landed", "not landed"])
@pytest.mark.parametrize("before,after", CHANGES)
def test_a_chunk_in_flight_across_a_configuration_change_lands_exactly_once(
    before: dict[str, object], after: dict[str, object], landed: bool
) -> None:
    """A rolling deploy of a new configuration while a chunk is in flight: verified as it was recorded, redone
    under the new configuration; every keyed event once, every unkeyed one at least once, across both streams."""
    world = World(cfg=config(**before))
    owner = world.worker()
    records = [
        at(world, 1, "a"),
        at(world, 2, "big", size=BIG),
        unkeyed(3, "no id", world.clock.now_ms()),
        at(world, 4, "c", pk=""),
        at(world, 5, "d"),
    ]
    if "deadLetterStreamName" not in before:
        records = [r for r in records if len(r.data) < BIG]  # without one, a record too large stalls the shard
    crash_mid_put(world, landed)
    with pytest.raises(SimulatedCrash):
        owner.process(records)
    all_land(world)
    world.clock.advance(MINUTE)
    successor = world.worker(cfg=config(**after))
    sent = [r for r in records if "deadLetterStreamName" in after or len(r.data) < BIG]
    successor.process(sent)
    found = ids_in(world.streams)
    keyed = {"a", "c", "d"}
    assert {k: found[k] for k in keyed} == {k: 1 for k in keyed}, found
    unkeyed_copies = world.streams.data("target").count(b"no id") + sum(
        1 for e in world.streams.data("dlq") if json.loads(e).get("data") == base64.b64encode(b"no id").decode()
    )
    assert unkeyed_copies >= 1


@pytest.mark.parametrize("after", [{"unkeyedPolicy": "forward"}, {"unkeyedPolicy": "deadletter"}])
def test_the_report_of_a_redone_chunk_covers_the_copy_its_first_owner_put(after: dict[str, object]) -> None:
    """A record without an event ID put by an owner that died before it committed (the put landed) is sent again
    by its successor, to the target or, under ``unkeyedPolicy = deadletter`` (a rolling deploy), to the
    dead-letter stream. The successor's report must excuse the first owner's copy, which arrived before the redo:
    when the resend goes to the dead-letter stream, that earlier copy is the extra one. Before, the report's
    window began at the redo (chaos seed 20 on kinesis-mock: the first owner's copy arrived before it, and
    nothing excused it)."""
    world = World(cfg=config(deadLetterStreamName="dlq"))
    owner = world.worker()
    crash_mid_put(world, landed=True)
    with pytest.raises(SimulatedCrash):
        owner.process([unkeyed(1, "no id", world.clock.now_ms())])
    all_land(world)
    first_copy_ms = max(arrival for _, data, arrival, _ in world.streams.records["target"] if data == b"no id")
    world.clock.advance(MINUTE)
    with capture_logs() as logs:
        world.worker(cfg=config(deadLetterStreamName="dlq", **after)).process(
            [unkeyed(1, "no id", world.clock.now_ms())]
        )
    (report,) = [e for e in logs if e["event"] == "possible_duplicates"]
    assert report["unkeyed_digests"] and report["window_from_ms"] <= first_copy_ms


def test_a_producer_retry_after_the_dedup_key_changed_is_still_dropped() -> None:
    """The window holds IDs read under the old dedup key: a retry of an event forwarded under it is a duplicate."""
    world = World()
    world.worker().process([at(world, 1, "a")])
    world.clock.advance(MINUTE)
    successor = world.worker(cfg=config(dedupKey="json:id"))
    successor.process([at(world, 2, "a", body="retry"), at(world, 3, "b")])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1})


def test_a_new_event_dropped_for_its_id_under_the_earlier_dedup_key_is_said_as_a_possible_loss() -> None:
    """The dedup key changed (json:orderId -> json:eventId) because orderId did not name one event: for one window
    a record is also checked under the old key, so a distinct new event whose orderId was forwarded before is
    dropped. The price is stated (docs/protocol.md); the drop is logged at warning, a line for the chunk with the
    count and the positions, apart from ordinary duplicates (a retry under the current key). Before, it was
    counted with the duplicates and nothing named it."""
    world = World(cfg=config(dedupKey="json:orderId"))
    order = lambda seq, order_id, event_id: SourceRecord(  # noqa: E731
        Position(seq), "k", json.dumps({"orderId": order_id, "eventId": event_id}).encode(), world.clock.now_ms()
    )
    world.worker().process([order(1, "o1", "e1")])
    world.clock.advance(MINUTE)
    successor = world.worker(cfg=config(dedupKey="json:eventId"))
    with capture_logs() as logs:
        successor.process([order(2, "o2", "e2")])
        successor.process([order(3, "o1", "e3"), order(4, "o2", "e2"), order(5, "o4", "e4")])
    assert [json.loads(d)["eventId"] for d in world.streams.data("target")] == ["e1", "e2", "e4"]
    said = [e for e in logs if e["event"] == "dropped_under_earlier_key"]
    assert [(e["log_level"], e["count"], e["positions"], e["earlier_keys"]) for e in said] == [
        ("warning", 1, ["3/0"], ["json:orderId"])
    ], "e3 is said; the retry of e2 (4) is an ordinary duplicate"
    state = world.store.get(KEY)
    assert state is not None and state.counters["duplicates"] == 2


def test_a_producer_retry_of_a_dead_lettered_event_is_dropped() -> None:
    """Exactly once across target and dead-letter stream: the window learns dead-lettered IDs too."""
    world = World(cfg=config(deadLetterStreamName="dlq"))
    owner = world.worker()
    big = at(world, 1, "big", size=BIG)
    owner.process([big])
    owner.process([at(world, 2, "big", size=BIG, body="retry")])
    assert len(world.streams.data("dlq")) == 1


# -- 2. an ambiguous put, then a target reshard ---------------------------------------------------------


@pytest.mark.parametrize("reshard", ["split", "merge"])
def test_an_ambiguous_put_verified_after_a_target_reshard_reads_the_parent(reshard: str) -> None:
    """The shard map is refreshed between an ambiguous put and its verification, and names the children: the
    entries that landed in the parent are found there, not sent again."""
    world = World(target_shards=3)
    world.streams.map_max_age_ms = 300_000
    owner = world.worker()
    streams = world.streams

    def change() -> None:
        if reshard == "split":
            streams.split("target", "shardId-000000000000")
            streams.split("target", "shardId-000000000001")
        else:
            streams.merge("target", "shardId-000000000000", "shardId-000000000001")
        streams.refresh_map("target")

    calls = {"n": 0}

    def ambiguous_then_reshard(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException]:
        calls["n"] += 1
        if calls["n"] == 1:
            streams.after_put = change
            return [True] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "lost")
        return [True] * len(entries), None  # type: ignore[return-value]

    streams.fault = ambiguous_then_reshard  # type: ignore[assignment]
    routes = streams.current_map("target")
    keys = [k for k in (f"e{i}" for i in range(100)) if routes.shard_for(k) != "shardId-000000000002"][:8]
    owner.process([at(world, i, k) for i, k in enumerate(keys, 1)])  # to the shards that reshard only
    assert ids_in(streams) == Counter({k: 1 for k in keys})


# -- 3. an identical record from another staging shard ----------------------------------------------------


@pytest.mark.parametrize("when", ["ambiguous put", "crash mid-put"])
def test_an_identical_unkeyed_record_from_another_shard_does_not_hide_this_ones(when: str) -> None:
    """Shard A's heartbeat is in the target; shard B's identical heartbeat did not land: B sends it again."""
    world = World()
    owner = world.worker()
    world.streams.put_records("target", [("hb", b"heartbeat", None)])  # another staging shard's copy
    heartbeat = SourceRecord(Position(1), "hb", b"heartbeat", world.clock.now_ms())
    if when == "ambiguous put":
        calls = {"n": 0}

        def lose_first(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
            calls["n"] += 1
            if calls["n"] == 1:
                return [False] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "lost")
            return [True] * len(entries), None

        world.streams.fault = lose_first
        owner.process([heartbeat])
    else:
        crash_mid_put(world, landed=False)
        with pytest.raises(SimulatedCrash):
            owner.process([heartbeat])
        all_land(world)
        world.clock.advance(MINUTE)
        world.worker().process([heartbeat])
    assert world.streams.data("target").count(b"heartbeat") == 2


# -- 4. a fence while verifying --------------------------------------------------------------------------


def test_a_fence_during_a_slow_verification_leaves_the_processor_fenced_not_exited() -> None:
    """Verification reads slower than the lease and a rival takes over meanwhile: no exception (the process
    would exit and restart every shard on the host); the processor holds, takes the shard back, and
    everything lands once."""
    world = World(target_shards=4)
    records = [at(world, i, f"e{i}") for i in range(1, 9)]
    left_in_flight(world, records)
    streams = world.streams
    streams.read_page, streams.page_ms = 1, world.config.lease_millis
    rivals = []

    def rival_takes_over() -> None:
        streams.on_read_page = None
        streams.read_page = 0
        rival = world.worker()
        rival.lose_lease()  # it got copier's lease and then lost the daemon's
        rivals.append(rival)

    streams.on_read_page = rival_takes_over
    with capture_logs() as logs:
        successor = world.worker()
        assert successor.fenced and rivals
        world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis + 1)
        successor.process(records)
    assert "took_back" in [e["event"] for e in logs]
    assert ids_in(streams) == Counter({f"e{i}": 1 for i in range(1, 9)})


def test_a_long_verification_keeps_the_lease() -> None:
    """A verification that reads for longer than the lease renews it meanwhile: a rival has to wait."""
    world = World(target_shards=4)
    records = [at(world, i, f"e{i}") for i in range(1, 9)]
    left_in_flight(world, records)
    world.streams.read_page, world.streams.page_ms = 1, world.config.lease_millis // 2
    leases: list[int] = []

    def lease_left() -> None:
        state = world.store.get(KEY)
        assert state is not None
        leases.append(state.lease_until_ms - world.clock.now_ms())

    world.streams.on_read_page = lease_left
    successor = world.worker()
    assert len(leases) >= 8 and min(leases) > 0, leases  # at every page, the lease still held
    assert not successor.fenced


class _BusyTarget:
    """GetShardIterator and GetRecords (as ``KinesisReads`` calls them) of the world's target, which other
    writers keep writing to: 20 records of theirs land between two pages (100 a second at 5 pages a second), so
    no page at the tip is ever empty. More than ``MAX_PAGES`` pages: the read would not have ended."""

    MAX_PAGES = 500

    def __init__(self, world: World) -> None:
        self.world = world
        self.pages = 0

    def get_shard_iterator(self, **kwargs: object) -> dict[str, str]:
        since = int(float(kwargs["Timestamp"]) * 1000)  # type: ignore[arg-type]
        log = self.world.streams.records.get("target", [])
        return {"ShardIterator": str(next((i for i, r in enumerate(log) if r[2] >= since), len(log)))}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, object]:  # botocore's argument names
        self.pages += 1
        assert self.pages <= self.MAX_PAGES, "the verification read does not end on a busy target"
        start = int(ShardIterator)
        page = self.world.streams.records.get("target", [])[start : start + Limit]
        others = [
            (f"other{self.pages}-{i}", json.dumps({"eventId": f"other-{self.pages}-{i}"}).encode()) for i in range(20)
        ]
        self.world.streams.put_records("target", others)
        records = [
            {
                "SequenceNumber": str(start + i + 1),
                "PartitionKey": pk,
                "Data": data,
                "ApproximateArrivalTimestamp": at / 1000,
            }
            for i, (pk, data, at, _) in enumerate(page)
        ]
        return {"Records": records, "NextShardIterator": str(start + len(page)), "MillisBehindLatest": 0}


def _reading_a_busy_target(world: World) -> _BusyTarget:
    """The world's verification reads go through ``KinesisReads`` over a target others keep writing to."""
    busy = _BusyTarget(world)
    reads = KinesisReads(lambda op, fn, **kw: fn(**kw), None, busy, lambda s: world.clock.advance(int(s * 1000)))

    def read_identities(
        stream: str, shards: object, since: int, until: int | None, identity: object, keep_alive: object = None
    ) -> object:
        assert stream == "target"
        return reads.read_identities(stream, world.streams.shards(stream), shards, since, until, identity, keep_alive)  # type: ignore[arg-type]

    world.streams.read_identities = read_identities  # type: ignore[assignment,method-assign]
    return busy


@pytest.mark.parametrize("when", ["ambiguous put", "chunk in flight at a takeover"])
def test_a_verification_read_of_a_target_others_keep_writing_to_ends(when: str) -> None:
    """A put's outcome is unknown (its answer lost; it landed) while other writers keep adding records to the
    target shard: the verification reads up to the end of what the put could have landed (the verification's
    start plus the clock margin, or the writer's lease end plus the put timeout and the margin), finds the
    event and does not send it again. Before, the forwarder's read had no end and stopped only at an empty page
    at the tip: it read for as long as the others wrote, renewing the lease, committing nothing."""
    world = World()
    busy = _reading_a_busy_target(world)
    record = at(world, 1, "e")
    if when == "ambiguous put":
        owner = world.worker()
        lost: list[bool] = []

        def answer_lost_once(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], object]:
            if lost or entries[0][0].startswith("other"):  # the other writers' puts are answered
                return [True] * len(entries), None
            lost.append(True)
            return [True] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeout", "no answer by the deadline")

        world.streams.fault = answer_lost_once  # type: ignore[assignment]
        assert owner.process([record]) == Position(1)
    else:
        left_in_flight(world, [record])
        world.worker().process([record])
    assert world.target_ids()["e"] == 1
    assert busy.pages < 20, busy.pages


# -- 6. outages past the target's retention or the digest TTL --------------------------------------------------


def test_a_chunk_verified_after_the_targets_retention_is_resent_and_reported() -> None:
    """An outage longer than the target's retention: what the verification cannot see is sent again, and
    reported as possible duplicates with the events' IDs (it was resent silently)."""
    world = World(retention_ms={"target": 24 * HOUR, "staging": 7 * 24 * HOUR})
    records = [at(world, 1, "a"), at(world, 2, "b")]
    left_in_flight(world, records, outage_ms=30 * HOUR)
    with capture_logs() as logs:
        world.worker().process(records)
    reported = [i for e in logs if e["event"] == "possible_duplicates" for i in e["event_ids"]]
    assert sorted(reported) == ["a", "b"]
    assert "verification_beyond_retention" in [e["event"] for e in logs]


def test_a_chunk_in_flight_outlives_the_digest_ttl_while_staging_keeps_its_records() -> None:
    """copier.digestTtlHours is a floor: a digest batch expires only after the staging stream's retention (and
    the window) have passed its arrivals, so an outage past the TTL still finds the chunk and verifies it."""
    world = World(
        cfg=config(digestTtlHours=2, dedupWindowSeconds=60),
        retention_ms={"target": 7 * 24 * HOUR, "staging": 7 * 24 * HOUR},
        ttl_ms=2 * HOUR,
    )
    owner = world.worker()
    records = [at(world, 1, "a"), at(world, 2, "b")]
    retry = keyed_event(3, "a", records[0].arrival_ms + 10_000, body="retry")  # written 10 s after the original
    owner.process(records[:1])
    crash_mid_put(world, landed=True)
    with pytest.raises(SimulatedCrash):
        owner.process(records[1:])
    all_land(world)
    world.clock.advance(3 * HOUR)
    successor = world.worker()
    successor.process([*records, retry])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1})


# -- 7. partition keys Kinesis refuses ---------------------------------------------------------------


@pytest.mark.parametrize("key", ["", "K" * 257], ids=["empty", "257 characters"])
@pytest.mark.parametrize("dead_letter", [True, False], ids=["dead-letter stream", "none"])
def test_a_partition_key_kinesis_refuses_never_stalls_the_shard(key: str, dead_letter: bool) -> None:
    """A non-KPL aggregate's record with an empty or too long key: dead-lettered (with a dead-letter stream)
    or forwarded under a stable replacement key; the rest of the request goes through."""
    cfg: Config = config(deadLetterStreamName="dlq") if dead_letter else config()
    world = World(cfg=cfg, stall_after=2)
    owner = world.worker()
    odd = SourceRecord(Position(1, 0), key, json.dumps({"eventId": "odd"}).encode(), world.clock.now_ms())
    with capture_logs() as logs:
        assert owner.process([odd, at(world, 2, "b")]) == Position(2)
    assert ids_in(world.streams) == Counter({"odd": 1, "b": 1})
    assert [e["event"] for e in logs if e["event"] == "rerouted"] == ["rerouted"]
    if not dead_letter:
        keys = [pk for pk, data, _, _ in world.streams.records["target"] if b"odd" in data]
        assert keys[0].startswith("copier-") and 1 <= len(keys[0]) <= 256


# -- clocks ---------------------------------------------------------------------------------------------


def test_an_ambiguous_put_on_a_host_whose_clock_runs_ahead_is_verified_from_far_enough_back() -> None:
    """A host 300 ms ahead of AWS time (measured from answers' Date headers, margin 100 ms): the read after an
    ambiguous put starts before the landed records' arrival stamps, so they are found, not sent again."""
    world = World()
    ahead = OffsetClock(world.clock, 300)
    owner = world.worker(clock=ahead, clock_bounds=measured(ahead))
    calls = {"n": 0}

    def lose_the_answer(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        calls["n"] += 1
        if calls["n"] == 1:
            return [True] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "lost")
        return [True] * len(entries), None

    world.streams.fault = lose_the_answer
    owner.process([at(world, 1, "a"), at(world, 2, "b")])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1})


def test_a_successor_waits_out_the_lease_of_an_owner_whose_clock_runs_behind() -> None:
    """An owner 400 ms behind AWS (measured) holds a lease that ends 400 ms later than its clock says: the
    successor's margin widens to the two bounds, logged, so it does not take over while the owner may put."""
    world = World()
    behind = OffsetClock(world.clock, -400)
    owner = world.worker(clock=behind, clock_bounds=measured(behind))
    owner.process([at(world, 1, "a")])
    lease_end_true = world.store.get(KEY).lease_until_ms + 400  # type: ignore[union-attr]
    with capture_logs() as logs:
        world.worker(clock_bounds=measured(OffsetClock(world.clock, 0)))
    assert world.clock.now_ms() > lease_end_true + world.config.clock_skew_millis
    widened = [e for e in logs if e["event"] == "clock_margin_widened"]
    assert widened and widened[0]["margin_ms"] >= 400


# -- found by an adversarial review of the fixed code (docs/protocol.md and copier/ alone) ------------------


def test_a_zombie_fenced_between_two_put_rounds_reports_what_it_sent() -> None:
    """The honest limit, fenced before its commit: frozen past its lease after sending a chunk's first round,
    the zombie's round lands after the successor redid the chunk; its next lease check is fenced, and the
    events it sent are reported as possible duplicates (they were not)."""
    world = World()
    zombie = world.worker()
    records = [at(world, 1, "e1", pk="k"), at(world, 2, "e2", pk="k")]  # one key: two rounds
    calls = {"n": 0}

    def frozen_during_the_first_round(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], None]:
        calls["n"] += 1
        if calls["n"] == 1:
            world.clock.advance(world.config.lease_millis + 5_000)  # frozen before this request landed
            world.streams.fault = lambda s, e: ([True] * len(e), None)
            world.worker().process(records)  # the successor verifies (nothing yet) and redoes the chunk
        return [True] * len(entries), None

    world.streams.fault = frozen_during_the_first_round  # type: ignore[assignment]
    with capture_logs() as logs:
        zombie.process(records)
    reported = [i for e in logs if e["event"] == "possible_duplicates" for i in e["event_ids"]]
    assert zombie.fenced and ids_in(world.streams)["e1"] == 2 and reported == ["e1"]


@pytest.mark.parametrize("fault", ["ambiguous put", "crash after the put"])
def test_a_partition_key_too_long_to_be_an_id_is_no_id(fault: str) -> None:
    """copier.dedupKey = partitionKey and a 300-character key: forwarded under a replacement key, the target
    cannot give that ID back, so the record counts as one without an ID (at least once), and a verification
    never counts on finding it: no silent resend of a keyed event."""
    world = World(cfg=config(dedupKey="partitionKey"))
    owner = world.worker()
    record = SourceRecord(Position(1), "u" * 300, b"payload", world.clock.now_ms())
    with capture_logs() as logs:
        if fault == "ambiguous put":
            calls = {"n": 0}

            def lose(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
                calls["n"] += 1
                error = AmbiguousPutError("PutRecords", "ReadTimeoutError", "lost") if calls["n"] == 1 else None
                return [True] * len(entries), error

            world.streams.fault = lose
            owner.process([record])
        else:
            left_in_flight(world, [record], landed=True)
            world.worker().process([record])
    reasons = [e["reason"] for e in logs if e["event"] == "unkeyed_event"]
    assert reasons[0] == "partition key has 300 characters, over Kinesis' 256"
    assert all(pk.startswith("copier-") for pk, _, _, _ in world.streams.records["target"])


def test_a_retry_early_in_a_chunk_that_reaches_past_the_window_is_still_dropped() -> None:
    """A backlog of a quiet shard: one delivery spans hours. A retry 50 minutes after its original is dropped
    even when the same chunk goes on to records two hours later (the window used to jump to the chunk's
    newest arrival before planning it)."""
    world = World()
    owner = world.worker()
    t0 = world.clock.now_ms() - 10 * HOUR
    owner.process([keyed_event(1, "x", t0), keyed_event(2, "a", t0 + MINUTE)])
    owner.process([keyed_event(3, "x", t0 + 50 * MINUTE, body="retry"), keyed_event(4, "b", t0 + 80 * MINUTE)])
    owner.process([keyed_event(5, "c", t0 + 120 * MINUTE)])
    assert ids_in(world.streams) == Counter({"x": 1, "a": 1, "b": 1, "c": 1})
    world2 = World()
    world2.worker().process([keyed_event(1, "x", t0), keyed_event(2, "a", t0 + MINUTE)])
    world2.worker().process(
        [
            keyed_event(3, "x", t0 + 50 * MINUTE, body="retry"),
            keyed_event(4, "b", t0 + 80 * MINUTE),
            keyed_event(5, "c", t0 + 120 * MINUTE),
        ]
    )
    assert ids_in(world2.streams) == Counter({"x": 1, "a": 1, "b": 1, "c": 1})


def test_a_child_shard_whose_parent_expired_from_list_shards_still_starts() -> None:
    """More than a retention after a split, ListShards no longer lists the parent: the lineage walk of the
    child's takeover stops there (it used to retry 'not listed' forever, and the shard never started)."""
    world = World()
    parent = world.worker()
    parent.process([at(world, 1, "a")])
    parent.end_shard()
    child_id = "shardId-000000000001"
    world.streams.shard_parents[child_id] = [SHARD]
    child = world.worker(child_id)
    child.process([at(world, 10, "b", pk="x")])
    world.clock.advance(48 * HOUR)
    world.streams.unlisted.add(SHARD)
    successor = world.worker(child_id)  # returns: no endless retry
    assert successor.state is not None and not successor.fenced


def test_a_verification_whose_target_retention_cannot_be_read_assumes_the_shortest() -> None:
    """DescribeStreamSummary fails at verification after a 30 h outage: the retention counts as Kinesis'
    shortest (24 h), so the resends are reported, not silent."""
    world = World(retention_ms={"target": 24 * HOUR, "staging": 7 * 24 * HOUR})
    records = [at(world, 1, "a"), at(world, 2, "b")]
    left_in_flight(world, records, outage_ms=30 * HOUR)

    def unreadable(stream: str) -> int | None:
        raise TransientAwsError("DescribeStreamSummary", "LimitExceededException", "throttled")

    world.streams.retention = unreadable  # type: ignore[method-assign]
    with capture_logs() as logs:
        world.worker().process(records)
    reported = [i for e in logs if e["event"] == "possible_duplicates" for i in e["event_ids"]]
    assert sorted(reported) == ["a", "b"]


def test_a_staging_retention_unreadable_once_is_read_again_for_later_batches() -> None:
    """One failed DescribeStreamSummary at takeover costs one batch the longest lifetime, not the process's
    life: the next batch is written with the staging retention, read again."""
    world = World(retention_ms={"staging": 7 * 24 * HOUR})
    real = world.streams.retention
    failures = [None]
    world.streams.retention = lambda stream: failures.pop() if failures else real(stream)  # type: ignore[method-assign]
    owner = world.worker()
    owner.process([at(world, 1, "a")])
    owner.process([at(world, 2, "b")])
    first, second = world.store.get_batch(KEY, 1), world.store.get_batch(KEY, 2)
    assert first is not None and second is not None
    assert first.expires_ms >= first.arrival_max_ms + 365 * 24 * HOUR  # the one read that failed: the longest
    assert second.arrival_max_ms + 7 * 24 * HOUR <= second.expires_ms < second.arrival_max_ms + 8 * 24 * HOUR


def test_a_stall_past_the_digest_ttl_with_the_staging_retention_unreadable_resends_nothing() -> None:
    """A role without kinesis:DescribeStreamSummary: the staging retention (7 days here) cannot be read. A chunk
    left in flight, then no owner for 3 days (past copier.digestTtlHours, within the retention): its digest batch
    is still there, so the successor verifies it and the daemon's replay of it sends nothing twice. (Its
    lifetime fell back to digestTtlHours: the batch expired and the chunk was sent again, silently.)"""
    world = World(
        cfg=config(digestTtlHours=48, dedupWindowSeconds=60),
        retention_ms={"target": 7 * 24 * HOUR, "staging": 7 * 24 * HOUR},
    )
    world.streams.retention = lambda stream: None  # type: ignore[method-assign]
    records = [at(world, 1, "a"), at(world, 2, "b")]
    with capture_logs() as logs:
        left_in_flight(world, records, landed=True, outage_ms=3 * 24 * HOUR)
        world.worker().process(records)
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1})
    assert "retention_unknown" in [e["event"] for e in logs]
    assert "possible_duplicates" not in [e["event"] for e in logs]


def test_a_successor_whose_clock_steps_back_while_it_waits_waits_longer() -> None:
    """A successor's clock steps back during its wait for the owner's lease: it checks again after the sleep
    and waits the rest, instead of taking the shard over early."""
    world = World()
    owner = world.worker()
    owner.process([at(world, 1, "a")])
    lease_end = world.store.get(KEY).lease_until_ms  # type: ignore[union-attr]
    stepping = OffsetClock(world.clock, 0)
    real_sleep = stepping.sleep_ms
    steps = iter([-3_000])

    def sleep_then_step_back(ms: int) -> None:
        real_sleep(ms)
        stepping.offset_ms += next(steps, 0)

    stepping.sleep_ms = sleep_then_step_back  # type: ignore[method-assign]
    successor = world.worker(clock=stepping)
    assert successor.state is not None and successor.state.epoch == 2
    assert stepping.now_ms() >= lease_end + world.config.clock_skew_millis


def test_a_key_of_characters_outside_the_basic_plane_counts_as_kinesis_counts_it() -> None:
    """200 emoji are 200 code points (400 UTF-16 units): a key Kinesis takes, forwarded as it is; 257 are too
    many, replaced (copier.core.limits: Kinesis counts code points)."""
    world = World(stall_after=2)
    fits, over = "\U0001f600" * 200, "\U0001f600" * 257
    e, f = json.dumps({"eventId": "e"}).encode(), json.dumps({"eventId": "f"}).encode()
    world.worker().process([SourceRecord(Position(1), fits, e, 0), SourceRecord(Position(2), over, f, 0)])
    assert ids_in(world.streams) == Counter({"e": 1, "f": 1})
    keys = [pk for pk, _, _, _ in world.streams.records["target"]]
    assert keys[0] == fits and keys[1].startswith("copier-")


def test_a_chunk_in_flight_to_a_stream_deleted_since_is_redone_under_the_current_configuration() -> None:
    """The old target named by a chunk in flight was deleted and the configuration moved to a new one: the
    verification finds nothing there (it is gone) and the chunk goes to the new target; no exit on every
    restart."""
    world = World()
    records = [at(world, 1, "a"), at(world, 2, "b")]
    left_in_flight(world, records, landed=True)
    real = world.streams.read_identities

    def old_target_gone(stream: str, *args: object, **kwargs: object) -> object:
        if stream == "target":
            raise FatalAwsError("GetShardIterator", "ResourceNotFoundException", "Stream target not found")
        return real(stream, *args, **kwargs)  # type: ignore[arg-type]

    world.streams.read_identities = old_target_gone  # type: ignore[method-assign]
    with capture_logs() as logs:
        world.worker(cfg=config(targetStreamName="target2")).process(records)
    assert "verification_stream_gone" in [e["event"] for e in logs]
    moved = Counter(json.loads(d)["eventId"] for d in world.streams.data("target2"))
    assert moved == Counter({"a": 1, "b": 1})


@pytest.mark.parametrize("step_ms", [5_000, 300, 60])
def test_a_clock_step_forward_just_before_a_chunk_is_recorded_is_in_the_bound_it_records(step_ms: int) -> None:
    """A host clock jumps ahead after its last AWS answer and before it records a chunk, by more than the
    margin or by less than the measurement's error: the chunk's recorded clock bound already holds the step
    (the wall clock moved against the monotonic one), and a successor verifying the chunk after a crash finds
    what landed (it used to read from the stepped start and resend it, unreported; the model found the
    300 ms case, smaller than the error of the intersected Date samples)."""
    world = World()
    host = OffsetClock(world.clock, 0)
    owner = world.worker(clock=host, clock_bounds=measured(host), answering=True)
    owner.process([at(world, 1, "a")])
    host.offset_ms += step_ms
    crash_mid_put(world, landed=True)
    with pytest.raises(SimulatedCrash):
        owner.process([at(world, 2, "b"), at(world, 3, "c")])
    recorded = next(world.store.batches(KEY, 10))
    assert recorded.clock_bound_ms is not None and recorded.clock_bound_ms >= step_ms
    all_land(world)
    world.clock.advance(MINUTE)
    world.worker().process([at(world, 2, "b"), at(world, 3, "c")])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1, "c": 1})


def test_an_owner_whose_clock_stepped_back_renews_before_a_put_its_lease_no_longer_covers() -> None:
    """A host clock jumps 3 s back: its lease looks 3 s longer than it is. Once an answer shows the step, the
    put rule counts the measured bound, so when the lease has run out in AWS time the owner renews it (and
    records its bound for a successor) before it puts, instead of putting on a lease a successor may already
    have slept out."""
    world = World()
    host = OffsetClock(world.clock, 0)
    owner = world.worker(clock=host, clock_bounds=measured(host), answering=True)
    owner.process([at(world, 1, "a")])
    host.offset_ms -= 3_000
    world.clock.advance(world.config.lease_millis)  # by AWS time the lease is over; by the host's, 3 s are left
    calls: list[str] = []
    write, put_batch = world.store.write, world.store.put_batch
    world.store.write = lambda *a: calls.append("write") or write(*a)  # type: ignore[method-assign, func-returns-value]
    world.store.put_batch = lambda *a: calls.append("batch") or put_batch(*a)  # type: ignore[method-assign, func-returns-value]
    owner.process([at(world, 3, "c")])
    assert calls[:2] == ["write", "batch"], calls  # renewed (with its bound) before anything of the chunk
    state = world.store.get(KEY)
    assert state is not None and state.clock_bound_ms is not None and state.clock_bound_ms >= 3_000


@pytest.mark.parametrize("ahead_ms", [400, 5_000])
def test_a_step_back_during_an_ambiguous_put_does_not_make_its_check_read_past_what_landed(ahead_ms: int) -> None:
    """A host ahead of AWS time (measured) reads the chunk's start, puts, loses the answer, and its clock is
    stepped back to AWS time meanwhile: the check reads from the start less the bound *at the start*, finds
    what landed and sends nothing again (it used the bound after the step: both copies landed, unreported)."""
    world = World()
    host = OffsetClock(world.clock, ahead_ms)
    owner = world.worker(clock=host, clock_bounds=measured(host), answering=True)
    owner.process([at(world, 1, "a")])
    calls = []

    def step_back_while_in_flight(stream: str, entries: list[object]) -> tuple[list[bool], Exception | None]:
        calls.append(stream)
        if len(calls) == 1:
            host.offset_ms = 0
            return [True] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "answer lost")
        return [True] * len(entries), None

    world.streams.fault = step_back_while_in_flight  # type: ignore[assignment]
    with capture_logs() as logs:
        owner.process([at(world, 2, "b"), at(world, 3, "c")])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1, "c": 1})
    assert not [e for e in logs if e["event"] == "possible_duplicates"]


@pytest.mark.parametrize("ahead_ms", [400, 5_000])
def test_a_step_back_between_a_chunks_start_and_its_record_keeps_the_bound_of_the_start(ahead_ms: int) -> None:
    """The clock steps back after the chunk's start was read and before its batch is written (during the
    shard-map lookup), the put lands and the owner dies: the batch keeps the bound paired with its start, so
    the successor's check finds both records (it recorded the bound after the step and resent both)."""
    world = World()
    host = OffsetClock(world.clock, ahead_ms)
    owner = world.worker(clock=host, clock_bounds=measured(host), answering=True)
    owner.process([at(world, 1, "a")])
    real_map = world.streams.shard_map

    def step_back_then_map(stream: str) -> object:
        host.offset_ms = 0
        return real_map(stream)

    world.streams.shard_map = step_back_then_map  # type: ignore[method-assign, assignment]
    crash_mid_put(world, landed=True)
    with pytest.raises(SimulatedCrash):
        owner.process([at(world, 2, "b"), at(world, 3, "c")])
    world.streams.shard_map = real_map  # type: ignore[method-assign]
    batch = world.store.get_batch(KEY, 2)
    assert batch is not None and batch.clock_bound_ms is not None and batch.clock_bound_ms >= ahead_ms
    all_land(world)
    world.clock.advance(MINUTE)
    world.worker().process([at(world, 2, "b"), at(world, 3, "c")])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1, "c": 1})


def _as_an_earlier_version(worker: object) -> None:
    """Make ``worker`` record what a copier from before typed IDs recorded: settings without "i", and the
    integer 7 digested as the string "7"."""
    session = worker.session  # type: ignore[attr-defined]
    settings = session.settings
    session.settings = lambda: replace(settings(), typed_ids=False)


def _int_event(world: World, seq: int, event_id: int) -> SourceRecord:
    data = json.dumps({"eventId": event_id, "body": seq}).encode()
    return SourceRecord(Position(seq), f"k{event_id}", data, world.clock.now_ms())


def test_a_chunk_in_flight_from_a_version_before_typed_ids_is_verified_as_that_version_recorded_it() -> None:
    """An upgrade with a chunk in flight: the earlier copier recorded integer IDs as text; the new one reads
    the batch's settings (no "i") and verifies with the digest it recorded: found, not sent twice."""
    world = World()
    old = world.worker()
    _as_an_earlier_version(old)
    crash_mid_put(world, landed=True)
    with pytest.raises(SimulatedCrash):
        old.process([_int_event(world, 1, 7), _int_event(world, 2, 8)])
    all_land(world)
    world.clock.advance(MINUTE)
    world.worker().process([_int_event(world, 1, 7), _int_event(world, 2, 8)])
    assert Counter(json.loads(d)["eventId"] for d in world.streams.data("target")) == Counter({7: 1, 8: 1})


def test_a_window_from_a_version_before_typed_ids_still_catches_a_producer_retry_of_an_integer_id() -> None:
    """The earlier copier forwarded event 7 (digested as "7"); after the upgrade a producer's retry of it
    arrives within the window: a duplicate, dropped (IDs are read under the recorded scheme too until it ages
    out of the window); the integer 8, never forwarded, goes through."""
    world = World()
    old = world.worker()
    _as_an_earlier_version(old)
    old.process([_int_event(world, 1, 7)])
    world.clock.advance(MINUTE)
    world.worker().process([_int_event(world, 2, 7), _int_event(world, 3, 8)])
    assert Counter(json.loads(d)["eventId"] for d in world.streams.data("target")) == Counter({7: 1, 8: 1})


@pytest.mark.parametrize("setup", [{"deadLetterStreamName": "dlq"}, {"dedupKey": "partitionKey"}])
def test_a_chunk_in_flight_from_a_version_that_counted_utf16_units_is_redone_as_it_recorded_it(
    setup: dict[str, str],
) -> None:
    """An upgrade with a chunk in flight that did not land: the earlier copier found a key of 200 emoji too long
    (so dead-lettered it, or, with the key as the ID, found no ID); the new one redoes the chunk recognising the
    record by the identity the batch recorded (its settings say UTF-16): sent once, not taken for landed."""
    world = World(cfg=config(**setup))
    old = world.worker()
    settings = old.session.settings
    old.session.settings = lambda: replace(settings(), key_count=UTF16_UNITS)  # type: ignore[method-assign]
    record = SourceRecord(Position(1), "\U0001f600" * 200, json.dumps({"eventId": "e"}).encode(), world.clock.now_ms())
    world.streams.fault = lambda s, e: ([False] * len(e), SimulatedCrash("mid put"))
    with pytest.raises(SimulatedCrash):
        old.process([record])
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    world.clock.advance(60_000)
    world.worker().process([record])
    assert len(world.streams.data("target")) + len(world.streams.data("dlq")) == 1


def _as_a_copier_that_stored_no_settings(world: World, records: list[SourceRecord]) -> tuple[list[int], list[int]]:
    """The keyed and unkeyed digests a copier that stored no plan settings recorded for ``records``: IDs read as
    it read them (the integer 7 as the string "7"), keys counted in UTF-16 units."""
    cfg = world.config
    settings = PlanSettings(
        cfg.dedup_key, cfg.unkeyed_policy, cfg.dead_letter_stream_name, "staging", SHARD, "target", typed_ids=False
    )
    settings = replace(settings, key_count=UTF16_UNITS)
    sent = [becomes(settings, r) for r in records]
    return [o.identity for o in sent if o.event_id is not None], [o.identity for o in sent if o.event_id is None]


LEGACY_RECORDS = [
    pytest.param({}, 7, "k7", id="integer ID"),
    pytest.param({"dedupKey": "partitionKey"}, "emoji", "\U0001f600" * 200, id="key of 200 emoji as the ID"),
]


@pytest.mark.parametrize("left", ["a chunk in flight", "a redo set", "a redo set, then a crash redoing it"])
@pytest.mark.parametrize("setup,event_id,key", LEGACY_RECORDS)
def test_what_a_copier_that_stored_no_settings_left_to_redo_is_redone(
    setup: dict[str, str], event_id: object, key: str, left: str
) -> None:
    """An upgrade from a copier whose digest batches and state item stored no plan settings (""), which read the
    integer 7 as "7" and counted keys in UTF-16 units (a key of 200 emoji, 400 units, was no ID), leaves a chunk
    in flight that never landed, or a verified redo set (which the new copier may start to redo and crash): the
    replayed records are redone, each once. Before, the redo set's settings were recorded as "" (or kept as "",
    in the state item and in the digest batch of a chunk redoing it), which reads as the current settings: the
    record's identity under them matched no redo digest, and it was counted already landed: lost."""
    world = World(cfg=config(**setup))
    now = world.clock.now_ms()
    records = [
        SourceRecord(Position(1), key, json.dumps({"eventId": event_id}).encode(), now - 2 * MINUTE),
        SourceRecord(Position(2), "ks", json.dumps({"eventId": "s"}).encode(), now - 2 * MINUTE),
    ]
    keyed, unkeyed_ids = _as_a_copier_that_stored_no_settings(world, records)
    state = ShardState(epoch=1, version=5, owner="old", lease_until_ms=now - MINUTE)
    if left == "a chunk in flight":
        batch = DigestBatch(
            index=1,
            epoch=1,
            last=Position(2),
            started_ms=now - 100_000,
            keyed=pack_digests(keyed),
            unkeyed=pack_digests(unkeyed_ids),
            arrival_min_ms=now - 2 * MINUTE,
            arrival_max_ms=now - 2 * MINUTE,
        )
        world.store.put_batch(KEY, batch)
    else:
        state = replace(state, batches=1, redo_last=Position(2), redo_digests=tuple(sorted(keyed + unkeyed_ids)))
    world.store.replace_if_unchanged(KEY, None, state)
    if left.endswith("crash redoing it"):
        left_in_flight(world, records, landed=False)
    world.worker().process(records)
    assert world.target_ids() == Counter({str(event_id): 1, "s": 1})


def test_a_fenced_writers_late_digest_batch_cannot_replace_a_verified_one() -> None:
    """Owner 1 freezes writing chunk {b} as batch 2; owner 2 takes over, sees no batch 2, and freezes writing
    chunk {b, c} as batch 2 too. Owner 1's write lands; owner 3 verifies it (nothing landed: b to redo) and
    leaves; then owner 2's write lands. Owner 4 must forward b and c: the verified batch was sealed under
    owner 3's epoch, so the late write is refused (it replaced the verified batch, c entered owner 4's
    window as forwarded and was lost; the model found it)."""
    world = World()
    first = world.worker()
    first.process([at(world, 1, "a")])
    world.store.hold_next = True
    with pytest.raises(SimulatedPause):
        first.process([at(world, 2, "b")])
    world.clock.advance(MINUTE)
    second = world.worker()
    world.store.hold_next = True
    with pytest.raises(SimulatedPause):
        second.process([at(world, 2, "b"), at(world, 3, "c")])
    late = world.store.held.pop()  # owner 2's, still on its way
    world.store.release_held()  # owner 1's lands
    world.clock.advance(MINUTE)
    world.worker().release()  # owner 3 verified owner 1's batch 2
    world.store.held.append(late)
    world.store.release_held()  # owner 2's arrives now
    world.clock.advance(MINUTE)
    world.worker().process([at(world, 2, "b"), at(world, 3, "c")])
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1, "c": 1})


# -- found by the 50-seed chaos run on digest d76429787f1a6d80 ----------------------------------------------


@pytest.mark.parametrize("slow", ["from the start", "stepped back after announcing"])
def test_a_fenced_owner_leaves_a_successor_on_a_slow_clock_its_whole_wait(slow: str) -> None:
    """Chaos seed 18: a successor on a host whose clock ran 8 s behind (measured) waited out the owner's lease
    with a margin of 8 s; the owner, fenced by its announcement and still fed by its daemon, took the shard
    back after its own 1 s margin and one more lease, so the successor found a new lease and announced
    itself again, fencing the owner again: for five minutes neither forwarded (the successor, waiting in
    its takeover, could not hear that its KCL lease had moved on). A fenced owner now leaves an announced
    successor its whole wait, counted on this host's clock, by the bound the successor recorded, which it
    raises when its clock steps back while it waits (found by the review of the fix); the successor takes
    over, hears its lease moved and releases, and the owner takes the shard back and forwards what it
    held, once."""
    world = World()
    owner = world.worker(clock_bounds=measured(OffsetClock(world.clock, 0)))
    owner.process([at(world, 1, "a")])
    delivered = iter(range(2, 1_000))
    sleep = world.clock.sleep_ms
    took_back: list[int] = []
    host = OffsetClock(world.clock, -8_000 if slow == "from the start" else 0)

    def owner_fed_while_the_successor_waits(ms: int) -> None:
        sleep(ms)
        if slow != "from the start" and host.offset_ms == 0:
            host.offset_ms = -8_000  # an NTP step back, after the announcement recorded a bound near 0
        seq = next(delivered)
        with capture_logs() as logs:
            owner.process([at(world, seq, f"e{seq}")])
        if any(e["event"] == "took_back" for e in logs):
            took_back.append(seq)
            raise AssertionError(f"the fenced owner took the shard back during the successor's wait (delivery {seq})")

    world.clock.sleep_ms = owner_fed_while_the_successor_waits  # type: ignore[method-assign]
    try:
        successor = world.worker(clock=host, clock_bounds=measured(host))
    finally:
        world.clock.sleep_ms = sleep  # type: ignore[method-assign]
    assert not took_back and owner.fenced
    assert successor.state is not None and successor.state.owner != owner.state.owner  # type: ignore[union-attr]
    held = next(delivered) - 2  # what the owner was given while fenced
    assert held > 0
    successor.lose_lease()  # its daemon's word: the KCL lease is the owner's
    last = 2 + held
    with capture_logs() as logs:
        assert owner.process([at(world, last, f"e{last}")]) == Position(last)
    assert [e["held"] for e in logs if e["event"] == "took_back"] == [held + 1]
    assert ids_in(world.streams) == Counter({"a": 1, **{f"e{n}": 1 for n in range(2, last + 1)}})


# -- a fenced processor cuts its lease when told it moved (a rolling deploy's pause) ------------------------


def test_a_processor_fenced_with_a_put_of_unknown_outcome_leaves_it_the_put_timeout_to_land() -> None:
    """Fenced between two requests of one round, the first of unknown outcome (its answer timed out, its
    entries land just before the put timeout), the processor is told its lease moved and cuts copier's lease
    short. Cut to now, the successor would read before the late entries arrive, send them again, and nobody
    would report the duplicates: the cut leaves the put timeout, as the check of an ambiguous put waits it."""
    world = World()
    owner = world.worker()
    timeout = world.config.put_timeout_millis
    records = [at(world, n, f"e{n}", pk=f"k{n}") for n in range(1, 502)]  # one round, two requests (500 + 1)
    late: list[list[tuple[str, bytes]]] = []
    land_at = {"ms": 0}

    def first_request_answer_lost(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], object]:
        if not late:
            late.append(entries)
            # its answer timed out; the next request needs a renewal (the lease ends within the put timeout and
            # the margin), which the announcement refuses: the lease can still be cut short, by the margin
            assert owner.state is not None
            world.clock.now = owner.state.lease_until_ms - timeout - world.config.clock_skew_millis
            land_at["ms"] = world.clock.now_ms() + timeout - 1  # within the put timeout of the answer's
            return [False] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected")
        return [True] * len(entries), None

    sleep = world.clock.sleep_ms

    def sleep_and_land_late(ms: int) -> None:
        sleep(ms)
        if late and land_at["ms"] and world.clock.now_ms() >= land_at["ms"]:
            land_at["ms"] = 0
            world.streams.put_records("target", late[0])

    def owner_fenced_mid_round_then_told() -> None:
        world.streams.fault = first_request_answer_lost  # type: ignore[assignment]
        assert owner.process(records) is None and owner.fenced
        all_land(world)
        assert owner.lose_lease() is True

    world.clock.sleep_ms = sleep_and_land_late  # type: ignore[method-assign]
    try:
        with once_asleep(world.clock, owner_fenced_mid_round_then_told) as told:
            successor = world.worker()
        assert told, "the owner was fenced and told while the successor waited"
        successor.process(records)
        world.clock.sleep_ms(timeout)  # whatever is still in flight lands now
    finally:
        world.clock.sleep_ms = sleep  # type: ignore[method-assign]
    assert ids_in(world.streams) == Counter({f"e{n}": 1 for n in range(1, 502)})


def test_a_fenced_processor_whose_put_outlasted_a_lease_keeps_its_lease_end_for_the_verification() -> None:
    """A chunk whose put took longer than a lease (throttled, the lease renewed before each request) lands
    past the chunk's start plus a lease; its commit is refused (a successor announced itself) and the owner is
    told its lease moved. The successor verifies the chunk by reading the target up to the end of the owner's
    last lease (plus the put timeout and the margin): the release must cut that lease to now, not to 0, or
    the read stops before the late entries and sends them again, unreported."""
    world = World()
    owner = world.worker()
    records = [at(world, 1, "a", pk="k1"), at(world, 2, "b", pk="k2")]
    cfg = world.config
    calls = {"n": 0}

    def throttled_past_a_lease_then_announced(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], None]:
        calls["n"] += 1
        if calls["n"] == 1:
            world.clock.advance(cfg.lease_millis + cfg.put_timeout_millis + cfg.clock_skew_millis + 1_000)
            return [False] * len(entries), None  # throttled: retried after a renewal
        seen = world.store.get(KEY)
        assert seen is not None
        announced = replace(seen, successor="rival", version=seen.version + 1)
        world.store.replace_if_unchanged(KEY, seen, announced)  # a successor announces itself during the put
        return [True] * len(entries), None

    world.streams.fault = throttled_past_a_lease_then_announced  # type: ignore[assignment]
    assert owner.process(records) is None and owner.fenced
    all_land(world)
    assert owner.lose_lease() is True
    with capture_logs() as logs:
        successor = world.worker()
    assert [(e["landed"], e["to_redo"]) for e in logs if e["event"] == "verified_pending"] == [(2, 0)]
    successor.process(records)
    assert ids_in(world.streams) == Counter({"a": 1, "b": 1})
