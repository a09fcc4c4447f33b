"""Record age at the target: each forwarded event's age when it lands, per interval, and the replication checkpoint
the commit records (copier.core.recordage, ShardSession.on_landed, ChunkPipeline's commit)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from copier.adapters.metrics import Values
from copier.core.errors import AmbiguousPutError
from copier.core.recordage import EXACT_BELOW_MS, AgeHistogram
from copier.core.state import shard_key
from copier.testing.streams import THROTTLED
from tests.support.fakes import SHARD, OffsetClock, World, config, measured, rec

KEY = shard_key("staging", SHARD)
PUT_MS = 250  # each PutRecords takes this long on the fake clock


def _nearest_rank(ages: list[int], q: float) -> int:
    ordered = sorted(ages)
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def _close(reported: float, exact: int) -> bool:
    """Within the histogram's stated precision: exact below EXACT_BELOW_MS, else within 1/128 of the value."""
    if exact < EXACT_BELOW_MS:
        return reported == exact
    return abs(reported - exact) <= exact / 128


@given(st.lists(st.integers(min_value=0, max_value=10**10), min_size=1, max_size=400))
@settings(max_examples=300, deadline=None)
def test_percentiles_are_within_the_stated_precision_and_the_maximum_is_exact(ages: list[int]) -> None:
    """p50 and p99 within 0.8 % of the nearest-rank value (exact below 128 ms), never above the maximum; max exact."""
    histogram = AgeHistogram()
    for age in ages:
        histogram.add(age)
    summary = histogram.take()
    assert summary is not None
    assert (summary.count, summary.max_ms) == (len(ages), max(ages))
    for q, got in ((0.5, summary.p50_ms), (0.99, summary.p99_ms)):
        assert _close(got, _nearest_rank(ages, q)), (q, got, _nearest_rank(ages, q))
        assert got <= summary.max_ms
    assert histogram.take() is None, "take() starts the next interval empty"


def test_an_arrival_after_the_landing_is_age_0_and_an_unknown_arrival_is_left_out() -> None:
    """A clock error beyond the measured one cannot make an age negative; arrival 0 (the daemon gave none) would
    be an age of 54 years, and counts for nothing."""
    histogram = AgeHistogram()
    histogram.add_landed(1_000, [1_500, 0, 400])
    summary = histogram.take()
    assert summary is not None and (summary.count, summary.p50_ms, summary.max_ms) == (2, 0, 600)


def test_memory_grows_with_the_range_of_ages_not_their_number() -> None:
    """200,000 ages anywhere in a day take at most a few thousand buckets (log-linear: 64 per power of two)."""
    rng = random.Random(44)
    histogram = AgeHistogram()
    histogram.add_landed(90_000_000, [rng.randrange(1, 90_000_000) for _ in range(200_000)])
    assert histogram.count == 200_000 and histogram.buckets <= 64 * 27 + EXACT_BELOW_MS


@dataclass
class Recording:
    """A metrics emitter that keeps each document's values."""

    documents: list[Values] = field(default_factory=list)

    def emit(
        self, shard_id: str, values: Values, retries: Mapping[str, int], properties: Mapping[str, str] | None = None
    ) -> None:
        self.documents.append(values)


def _world(**settings: object) -> tuple[World, Recording]:
    world = World(config(metrics="emf", metricsIntervalSeconds=60, **settings))
    recording = Recording()
    world.metrics = recording
    return world, recording


def _landed_ages(world: World, arrivals: Mapping[str, int]) -> list[int]:
    """Each target record's true age: when the fake target took it (its own arrival, on the world's clock, which
    is AWS time) minus its event's staging arrival."""
    return [at - arrivals[json.loads(data)["eventId"]] for _, data, at, _ in world.streams.records["target"]]


def _slow_puts(world: World, throttle_first: bool) -> None:
    """Every PutRecords takes PUT_MS; with ``throttle_first`` the first request's last entry is throttled (it is
    sent again after a backoff, and lands later than the rest of its chunk)."""
    pending = [throttle_first]

    def slow(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[object], BaseException | None]:
        world.clock.advance(PUT_MS)
        if pending.pop() if pending else False:
            return [True] * (len(entries) - 1) + [(False, THROTTLED)], None
        return [True] * len(entries), None

    world.streams.fault = slow  # type: ignore[assignment]


def test_each_forwarded_event_is_aged_at_its_own_puts_answer_and_reported_per_interval() -> None:
    """Known arrivals, puts that take 250 ms, one entry throttled and sent again later, a duplicate: the interval's
    RecordAgeMax is the oldest forwarded event's exact age at its own landing, p50 and p99 are the ages' within
    0.8 %, and a duplicate (never put) has no age."""
    world, recording = _world()
    _slow_puts(world, throttle_first=True)
    start = world.clock.now_ms()
    arrivals = {f"e{i}": start - 9_000 + 73 * i for i in range(60)}
    worker = world.worker()
    records = [rec(i + 1, f"e{i}", arrival_ms=arrivals[f"e{i}"]) for i in range(40)]
    worker.process(records)
    worker.process([rec(41, "e3", arrival_ms=start - 1), rec(42, "e40", arrival_ms=arrivals["e40"])])  # e3 again
    world.clock.advance(61_000)
    worker.process([])  # the interval has passed: its document goes
    worker.process([rec(43 + i, f"e{41 + i}", arrival_ms=arrivals[f"e{41 + i}"]) for i in range(19)])
    worker.release()

    ages = _landed_ages(world, arrivals)
    assert len(ages) == 60 == len(set(arrivals)), "each event once"
    first, second = [d for d in recording.documents if "RecordAgeMax" in d]
    first_ages, second_ages = ages[:41], ages[41:]
    assert first["RecordAgeMax"] == (float(max(first_ages)), "Milliseconds")
    assert max(first_ages) >= 9_000 - 73 * 39 + 2 * PUT_MS, "the throttled entry's age counts its second put"
    for values, exact in ((first, first_ages), (second, second_ages)):
        assert values["RecordAgeMax"][0] == max(exact)
        assert _close(values["RecordAgeP50"][0], _nearest_rank(exact, 0.5))
        assert _close(values["RecordAgeP99"][0], _nearest_rank(exact, 0.99))
        assert values["RecordAgeP50"][1] == "Milliseconds"


def test_an_interval_in_which_nothing_landed_has_no_record_age() -> None:
    """Only duplicates: no value (an idle shard has no age; the alarm treats missing data as not breaching)."""
    world, recording = _world()
    worker = world.worker()
    worker.process([rec(1, "a", arrival_ms=world.clock.now_ms() - 10)])
    world.clock.advance(61_000)
    worker.process([])  # the first interval's document, with "a"'s age
    assert [d["RecordAgeMax"] for d in recording.documents] == [(10.0, "Milliseconds")]
    recording.documents.clear()
    worker.process([rec(2, "a", arrival_ms=world.clock.now_ms())])
    worker.release()
    assert recording.documents and all("RecordAgeMax" not in d for d in recording.documents)


def test_a_hosts_clock_off_aws_time_is_corrected_by_its_measured_offset() -> None:
    """A host 3 s ahead of AWS time would add 3 s to every age (its clock at the answer minus an arrival stamped
    by AWS): its measured offset takes it off, to within the measurement's error."""
    world, recording = _world()
    _slow_puts(world, throttle_first=False)
    host = OffsetClock(world.clock, 3_000)
    bounds = measured(host)
    worker = world.worker(clock=host, clock_bounds=bounds)
    start = world.clock.now_ms()
    arrivals = {f"e{i}": start - 2_000 + i for i in range(5)}
    worker.process([rec(i + 1, f"e{i}", arrival_ms=arrivals[f"e{i}"]) for i in range(5)])
    worker.release()
    true_max = max(_landed_ages(world, arrivals))
    (values,) = [d for d in recording.documents if "RecordAgeMax" in d]
    error = bounds.snapshot().error_ms
    assert error is not None and error < 500, "the correction is worth making: far less than the 3 s it takes off"
    assert abs(values["RecordAgeMax"][0] - true_max) <= error


def test_an_ambiguous_puts_entries_found_by_the_verification_are_aged_when_found() -> None:
    """A put whose answer is lost landed at an unknown time: its entries count, once each, at the time the
    verification read found them (an upper bound), not never and not twice."""
    world, recording = _world()
    lost = [True]

    def ambiguous(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        if lost:
            lost.clear()
            return [True] * len(entries), AmbiguousPutError("PutRecords", "ReadTimeoutError", "no answer")
        return [True] * len(entries), None

    world.streams.fault = ambiguous
    worker = world.worker()
    start = world.clock.now_ms()
    worker.process([rec(1, "a", arrival_ms=start - 500), rec(2, "b", arrival_ms=start - 400)])
    found_at = world.clock.now_ms()
    assert found_at > start, "the verification waited out the put timeout"
    assert worker.session.metrics.record_age.count == 2
    worker.release()
    (values,) = [d for d in recording.documents if "RecordAgeMax" in d]
    assert values["RecordAgeMax"][0] == found_at - (start - 500)


def test_the_commit_records_the_replication_checkpoint() -> None:
    """The state item holds the committed position's staging arrival and how long after it its chunk had landed
    in full (the last put's answer); a chunk of duplicates only moves it too, aged at its commit."""
    world, _ = _world()
    _slow_puts(world, throttle_first=False)
    worker = world.worker()
    start = world.clock.now_ms()
    worker.process([rec(1, "a", arrival_ms=start - 3_000), rec(2, "b", arrival_ms=start - 2_000)])
    state = world.store.get(KEY)
    assert state is not None and state.position is not None and state.position.seq == 2
    assert (state.position_arrival_ms, state.position_age_ms) == (start - 2_000, 2_000 + PUT_MS)
    world.clock.advance(1_000)
    worker.process([rec(3, "a", arrival_ms=start + 500)])  # a duplicate: nothing put
    state = world.store.get(KEY)
    assert state is not None and state.position is not None and state.position.seq == 3
    assert (state.position_arrival_ms, state.position_age_ms) == (start + 500, PUT_MS + 1_000 - 500)


def test_a_record_without_an_arrival_leaves_the_checkpoint_without_one() -> None:
    """The daemon gave no arrival time (0): no arrival and no age, rather than an age of 54 years."""
    world, _ = _world()
    worker = world.worker()
    worker.process([rec(1, "a")])
    state = world.store.get(KEY)
    assert state is not None and (state.position_arrival_ms, state.position_age_ms) == (None, None)
