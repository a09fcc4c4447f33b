"""A new application started at a point in time, on the fakes: what arrived before the start is never forwarded,
and a producer retry after the start of an event from before it is a duplicate (copier.shard.prestart)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from structlog.testing import capture_logs

import copier.shard.prestart
from copier.adapters.kinesisread import KinesisReads
from copier.core.config import Config
from copier.core.errors import ConfigError, FatalAwsError, TransientAwsError
from copier.core.identity import id_digest
from copier.core.packing import unpack_digests
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.state import shard_key
from copier.core.window import BUCKETS_PER_HORIZON
from tests.support.fakes import SHARD, SimulatedCrash, SimulatedStall, World, config, crash_at, rec

START = 1_700_000_000_000  # the fake clock's start, a whole second, as the KCL takes it
WINDOW = 600_000
BUCKET = WINDOW // BUCKETS_PER_HORIZON
KEY = shard_key("staging", SHARD)


def started(window_s: int = WINDOW // 1000, **copier: object) -> Config:
    return config({"initialPositionInStreamExtended": START // 1000}, dedupWindowSeconds=window_s, **copier)


def before_start(shard: str = SHARD) -> list[SourceRecord]:
    """A staging shard's records before the start: one older than the window, two inside it, one without an ID."""
    return [
        rec(1, "old", arrival_ms=START - WINDOW - 1),
        rec(2, "a", arrival_ms=START - WINDOW),
        rec(3, "b", arrival_ms=START - 1),
        rec(4, None, arrival_ms=START - 100),
    ]


def world_started(**copier: object) -> World:
    world = World(started(**copier))
    world.streams.add_staging(SHARD, before_start())
    return world


def test_a_new_shard_learns_what_arrived_within_the_window_before_the_start_and_forwards_none_of_it() -> None:
    """Retries after the start of events from the window before it are dropped; an event older than the window
    before the start, retried after it, is forwarded (the window's horizon); what arrived after the start goes
    once; the load reads [start - window, start) once and records it in a digest batch that puts nothing."""
    world = world_started()
    worker = world.worker()
    assert world.streams.arrival_reads == [(SHARD, START - WINDOW, START)]
    state = world.store.get(KEY)
    assert state is not None and state.prestart_ms == START and state.batches == 1 and state.position is None
    batch = world.store.get_batch(KEY, 1)
    assert batch is not None and batch.last == Position(0) and not batch.keyed
    assert sorted(unpack_digests(batch.before_ids)) == sorted([id_digest("a"), id_digest("b")])
    assert batch.arrival_min_ms == START - WINDOW and batch.arrival_max_ms == START - 1
    worker.process(
        [
            rec(5, "c", arrival_ms=START),
            rec(6, "a", arrival_ms=START + 1000),
            rec(7, "old", arrival_ms=START + 1000),
            rec(8, "b", arrival_ms=START + 2000),
            rec(9, "d", arrival_ms=START + 3000),
        ]
    )
    assert world.target_ids() == Counter({"c": 1, "old": 1, "d": 1})


def test_a_retry_later_than_the_window_after_the_start_is_forwarded() -> None:
    """The events before the start count as arrived just before it: a retry of one is dropped until the window's
    newest arrival passes the start plus the window (and at most one of its 32 buckets), forwarded after."""
    world = world_started()
    worker = world.worker()
    worker.process([rec(5, "a", arrival_ms=START + WINDOW - 1000), rec(6, "b", arrival_ms=START + WINDOW + 2 * BUCKET)])
    assert world.target_ids() == Counter({"b": 1})


def test_a_record_delivered_from_before_the_start_is_dropped_and_learned_for_later_owners() -> None:
    """The daemon may deliver a record that arrived before the start (a lease created at TRIM_HORIZON, arrival
    stamps out of order): it is not forwarded, counted as before_start, and its retries are duplicates in the
    same chunk, in a later one and after a takeover (a chunk of such records alone is recorded all the same)."""
    world = World(started())
    first = world.worker()
    with capture_logs() as logs:
        first.process([rec(1, "z", arrival_ms=START - 5)])  # nothing to put, an ID to learn
    assert [e["records"] for e in logs if e["event"] == "before_start"] == [1]
    first.process(
        [
            rec(2, "z", arrival_ms=START + 1),
            rec(3, "x", arrival_ms=START - 4),
            rec(4, "x", arrival_ms=START + 1),
            rec(5, "y", arrival_ms=START),
        ]
    )
    assert world.target_ids() == Counter({"y": 1})
    state = world.store.get(KEY)
    assert state is not None and state.counters["before_start"] == 2 and state.counters["duplicates"] == 2
    first.release()
    second = world.worker()
    second.process([rec(6, "z", arrival_ms=START + 3), rec(7, "x", arrival_ms=START + 3)])
    assert world.target_ids() == Counter({"y": 1})


def test_a_record_without_an_arrival_time_is_never_before_the_start_and_is_said() -> None:
    """The daemon stamps every Kinesis record; one delivered without a stamp (read as 0) cannot be judged against
    the start: it is forwarded and said (no_arrival_time), never dropped unseen as before the start (before, it
    was: an event after the start lost)."""
    world = World(started())
    worker = world.worker()
    with capture_logs() as logs:
        worker.process([rec(1, "n", arrival_ms=0), rec(2, "z", arrival_ms=START - 5), rec(3, "y", arrival_ms=START)])
    assert world.target_ids() == Counter({"n": 1, "y": 1})
    assert [e["records"] for e in logs if e["event"] == "no_arrival_time"] == [1]
    state = world.store.get(KEY)
    assert state is not None and state.counters["before_start"] == 1


def test_a_later_owner_loads_the_events_before_the_start_from_the_digest_batches() -> None:
    """The load happens once per shard: the next owner's window has them from the state table, not from a
    second read of staging."""
    world = world_started()
    first = world.worker()
    first.process([rec(5, "c", arrival_ms=START)])
    first.release()
    second = world.worker()
    assert len(world.streams.arrival_reads) == 1
    second.process([rec(6, "a", arrival_ms=START + 500), rec(7, "b", arrival_ms=START + 600)])
    assert world.target_ids() == Counter({"c": 1})


def test_a_load_cut_short_by_a_crash_is_done_again_by_the_next_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed between two of its digest batches, the load left one committed and no prestart_ms: the next owner
    reads the range again, and the window holds every ID (the first one twice, harmlessly)."""
    monkeypatch.setattr(copier.shard.prestart, "MAX_CHUNK_EVENTS", 1)
    world = world_started()
    world.store.crash_hook = crash_at("before", "put_batch", 2)
    with pytest.raises(SimulatedCrash):
        world.worker()
    state = world.store.get(KEY)
    assert state is not None and state.prestart_ms is None and state.batches == 1
    world.store.crash_hook = lambda phase, call: False
    world.clock.advance(60_000)
    worker = world.worker()
    state = world.store.get(KEY)
    assert state is not None and state.prestart_ms == START and state.batches == 3
    assert len(world.streams.arrival_reads) == 2
    worker.process([rec(5, "b", arrival_ms=START + 1), rec(6, "a", arrival_ms=START + 2)])
    assert world.target_ids() == Counter()


@pytest.mark.parametrize("moved_ms", [-30 * 60_000, 30 * 60_000])
def test_a_start_changed_after_a_shard_loaded_its_events_before_is_refused_by_every_later_owner(moved_ms: int) -> None:
    """The first owner loaded what arrived before the start and died before the KCL checkpointed; the start is
    then changed, so the next owner's daemon starts at the new one. Lowered, the window still holds the old load
    and events between the two starts would be dropped as duplicates (lost); raised, the window before the new
    start was never loaded and a retry after it of an event between the two would be forwarded. The next owner
    refuses to start, naming both starts and the way back, and forwards nothing (before, it went on: one lost,
    one forwarded); set back, it goes on."""
    world = world_started()
    world.worker().release()
    moved = config({"initialPositionInStreamExtended": (START + moved_ms) // 1000}, dedupWindowSeconds=WINDOW // 1000)
    with pytest.raises(ConfigError, match=f"Set it back to {START // 1000}"):
        world.worker(cfg=moved)
    assert world.target_ids() == Counter()
    world.clock.advance(60_000)
    world.worker().process([rec(5, "c", arrival_ms=START)])
    assert world.target_ids() == Counter({"c": 1})


def test_a_child_whose_parent_loaded_for_another_start_is_refused() -> None:
    """The check follows the lineage: a child created after the change meets its parent's recorded start."""
    world = world_started()
    parent = world.worker()
    parent.process([rec(5, "c", arrival_ms=START)])
    children = world.streams.split("staging", SHARD)
    parent.end_shard()
    moved = config({"initialPositionInStreamExtended": START // 1000 - 600}, dedupWindowSeconds=WINDOW // 1000)
    with pytest.raises(ConfigError, match=f"{SHARD} loaded the events before"):
        world.worker(children[0], cfg=moved)


def test_a_child_shard_inherits_what_its_parent_loaded_and_reads_only_its_own_range() -> None:
    """A shard split after the start: its parent's history holds what arrived there before the start (the child
    loads it with its lineage); the child reads only itself, whose first record is after the start."""
    world = world_started()
    parent = world.worker()
    parent.process([rec(5, "c", arrival_ms=START)])
    children = world.streams.split("staging", SHARD)
    parent.end_shard()
    child = world.worker(children[0])
    assert world.streams.arrival_reads[1:] == [(children[0], START - WINDOW, START)]
    child.process([rec(100, "a", arrival_ms=START + 5000), rec(101, "e", arrival_ms=START + 6000)])
    assert world.target_ids() == Counter({"c": 1, "e": 1})


def test_an_ancestor_this_application_never_read_is_read_for_its_child() -> None:
    """A shard split shortly before the start: the KCL gives this application the children only, so the parent's
    records before the start are read with the child's, and a retry on the child of an event first written on
    the parent is a duplicate."""
    world = World(started())
    children = world.streams.split("staging", SHARD)
    world.streams.add_staging(SHARD, [rec(1, "p", arrival_ms=START - 60_000)])
    world.streams.add_staging(children[0], [rec(10, "q", arrival_ms=START - 30_000)])
    child = world.worker(children[0])
    assert world.streams.arrival_reads == [(children[0], START - WINDOW, START), (SHARD, START - WINDOW, START)]
    child.process(
        [rec(11, "p", arrival_ms=START + 1), rec(12, "q", arrival_ms=START + 2), rec(13, "r", arrival_ms=START + 3)]
    )
    assert world.target_ids() == Counter({"r": 1})


def test_an_ancestor_expired_from_list_shards_is_not_read_and_the_child_starts() -> None:
    """Staging was split longer ago than its retention: the open child still names its parent, which ListShards no
    longer lists (a read of it fails with ShardNotListed, for ever). The child's load leaves it out, as the window's
    lineage walk does, reads itself, and the shard starts and forwards (before: initialize never returned)."""
    world = World(started())
    children = world.streams.split("staging", SHARD)
    world.streams.unlisted.add(SHARD)
    world.streams.add_staging(children[0], [rec(10, "q", arrival_ms=START - 30_000)])
    reads = world.streams.read_arrivals

    def bounded(stream: str, shard: str, *args: object) -> object:
        if len(world.streams.arrival_reads) > 20:
            raise SimulatedStall(f"{shard} read {len(world.streams.arrival_reads)} times: the load never ends")
        return reads(stream, shard, *args)  # type: ignore[arg-type]

    world.streams.read_arrivals = bounded  # type: ignore[method-assign,assignment]
    child = world.worker(children[0])
    assert world.streams.arrival_reads == [(children[0], START - WINDOW, START)]
    child.process([rec(11, "q", arrival_ms=START + 1), rec(12, "r", arrival_ms=START + 2)])
    assert world.target_ids() == Counter({"r": 1})


def test_a_shard_that_planned_records_before_a_start_was_set_loads_nothing() -> None:
    """An application that ran without a start, then given one: the KCL ignores it for leases with checkpoints,
    and copier does not read staging again for a shard whose position it holds."""
    world = World(config(dedupWindowSeconds=WINDOW // 1000))
    world.streams.add_staging(SHARD, before_start())
    world.worker().process([rec(5, "c", arrival_ms=START)])
    world.clock.advance(60_000)
    world.worker(cfg=started())
    assert world.streams.arrival_reads == []
    state = world.store.get(KEY)
    assert state is not None and state.prestart_ms is None


def test_the_load_says_where_it_is_and_what_it_read() -> None:
    """prestart_reading before, prestart_progress while a slow read goes on (a page a record, 6 s a page),
    prestart_loaded after (IDs, records, batches); no load without a start."""
    world = world_started()
    world.streams.read_page, world.streams.page_ms = 1, 6000
    with capture_logs() as logs:
        world.worker()
    events = {e["event"]: e for e in logs}
    assert events["prestart_reading"]["shards"] == [SHARD]
    assert [e["records"] for e in logs if e["event"] == "prestart_progress"] == [2]
    loaded = events["prestart_loaded"]
    assert (loaded["ids"], loaded["records"], loaded["batches"]) == (2, 3, 1)
    plain = World(config(dedupWindowSeconds=WINDOW // 1000))
    plain.streams.add_staging(SHARD, before_start())
    with capture_logs() as logs:
        plain.worker()
    assert not [e for e in logs if str(e["event"]).startswith("prestart")]
    assert plain.streams.arrival_reads == []


class ThrottledStaging:
    """A staging client answering GetRecords with ProvisionedThroughputExceededException, then an expired iterator,
    then the page (the local backend never throttles: faults only a stub can inject)."""

    def __init__(self) -> None:
        self.iterators: list[dict[str, object]] = []
        self.faults = ["ProvisionedThroughputExceededException", "ExpiredIteratorException"]

    def get_shard_iterator(self, **kwargs: object) -> dict[str, str]:
        self.iterators.append(kwargs)
        return {"ShardIterator": f"it-{len(self.iterators)}"}

    def get_records(self, **kwargs: object) -> dict[str, object]:
        if self.faults:
            code = self.faults.pop(0)
            raise (
                TransientAwsError("GetRecords", code, "stubbed")
                if code.startswith("Prov")
                else FatalAwsError("GetRecords", code, "stubbed")
            )
        data = json.dumps({"eventId": "a"}).encode()
        record = {"SequenceNumber": "7", "PartitionKey": "a", "Data": data, "ApproximateArrivalTimestamp": START / 1000}
        return {"Records": [record], "NextShardIterator": None, "MillisBehindLatest": 0}


def test_the_load_waits_out_a_throttled_page_and_an_expired_iterator_where_it_was() -> None:
    """The shard's 5 reads a second are shared with both daemons: a throttled GetRecords is asked again a second
    later, and an iterator that expired meanwhile is taken again at the load's beginning (nothing read yet)."""
    staging, slept = ThrottledStaging(), []
    reads = KinesisReads(lambda op, fn, **kw: fn(**kw), staging, None, slept.append)
    listed = [{"ShardId": SHARD, "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)}}]
    pages = list(reads.read_arrivals("staging", listed, SHARD, START - WINDOW, START + 1))
    assert [r.position for page in pages for r in page] == [Position(7)]
    assert slept == [1.0]
    assert [i["ShardIteratorType"] for i in staging.iterators] == ["AT_TIMESTAMP", "AT_TIMESTAMP"]
