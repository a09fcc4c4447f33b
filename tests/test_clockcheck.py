"""This host's clock against AWS: bounds from the Date header of answers, and the hooks that feed them."""

from __future__ import annotations

import json
import math
import random
from email.utils import formatdate

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copier.adapters.awsjson import JsonClient
from copier.adapters.clockhooks import wall_ms, watch_botocore
from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.kinesis import KinesisStreams
from copier.core.clockcheck import KEEP_MS, ClockBounds, ClockSnapshot, parse_http_date
from copier.core.config import load_config
from copier.core.errors import AwsError
from copier.core.state import ShardState
from tests.conftest import Pipeline
from tests.support.backend import client

T0 = 1_700_000_000_000  # a local wall-clock time, in epoch ms
SMALL_RTT_MS = 20


def STEADY() -> int:  # noqa: N802 - a constant, as a frame
    """A wall clock that never steps (wall minus monotonic stays 0): the simulated answers' own times are exact."""
    return 0


def http_date(ms: float) -> str:
    """The Date header a server whose clock reads ``ms`` sends (its whole second, as servers truncate)."""
    return formatdate(math.floor(ms / 1000), usegmt=True)


def answer(bounds: ClockBounds, true_ms: float, rtt_ms: float, at: float, shift_ms: float) -> None:
    """One simulated request: AWS reads true time, the local clock ``true + shift`` (so the offset is ``-shift``).

    Sent at ``true_ms``, answered ``rtt_ms`` later; the server read its clock
    ``at`` of the way through the round trip; local stamps are whole ms.
    """
    sent = math.floor(true_ms + shift_ms)
    received = math.floor(true_ms + rtt_ms + shift_ms)
    bounds.observe(sent, received, http_date(true_ms + at * rtt_ms))


def contains(snapshot: ClockSnapshot, offset_ms: float) -> bool:
    """Whether the offset lies within the snapshot's ``offset ± error``, and within its bound."""
    assert snapshot.offset_ms is not None and snapshot.error_ms is not None and snapshot.bound_ms is not None
    inside = snapshot.offset_ms - snapshot.error_ms <= offset_ms <= snapshot.offset_ms + snapshot.error_ms
    return inside and abs(offset_ms) <= snapshot.bound_ms


def many_small_answers(bounds: ClockBounds, rng: random.Random, start_ms: float, shift_ms: float, n: int) -> float:
    """``n`` answers of round trips up to SMALL_RTT_MS, sent at random instants within 10 minutes; the end time."""
    t = start_ms
    for _ in range(n):
        t += rng.uniform(50, 950)
        answer(bounds, t, rng.uniform(0, SMALL_RTT_MS), rng.random(), shift_ms)
    return t


# -- dates ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"],
)
def test_the_three_http_date_forms_are_read(text: str) -> None:
    """IMF-fixdate (what AWS sends), RFC 850 and asctime all name the same second."""
    assert parse_http_date(text) == 784_111_777_000


@pytest.mark.parametrize("text", ["", "yesterday", "Sun, 06 Nov 1994", "Sun, 99 Foo 1994 08:49:37 GMT"])
def test_what_is_not_an_http_date_is_refused(text: str) -> None:
    """Garbage, a date without a time, an impossible month: None, never an exception."""
    assert parse_http_date(text) is None


# -- the interval --------------------------------------------------------------------------------------------------


def test_nothing_is_known_before_the_first_answer() -> None:
    """No sample: no offset, no error, no bound, and nothing to report."""
    bounds = ClockBounds(frame=STEADY)
    assert bounds.snapshot() == ClockSnapshot(None, None, None, 0, 0, 0)
    assert (bounds.offset_ms(), bounds.error_ms(), bounds.bound_ms()) == (None, None, None)
    assert bounds.changed_since_report() is False


def test_one_answer_bounds_the_offset_within_its_second_and_round_trip() -> None:
    """Sent at s, received at r, dated D: the offset lies in [D - r - 1, D + 1000 - s]."""
    bounds = ClockBounds(frame=STEADY)
    date_ms = 1_700_000_001_000
    bounds.observe(date_ms - 5_040, date_ms - 5_000, http_date(date_ms))  # local is about 5 s ahead
    low, high = date_ms - (date_ms - 5_000) - 1, date_ms + 1000 - (date_ms - 5_040)
    snapshot = bounds.snapshot()
    assert (low, high) == (4_999, 6_040)
    assert snapshot.offset_ms == (low + high) // 2 and snapshot.error_ms == high - snapshot.offset_ms
    assert snapshot.bound_ms == 6_040 and snapshot.samples == 1


def test_answers_on_both_sides_of_the_servers_tick_narrow_it_to_the_round_trip() -> None:
    """Tick detection: one answer just after the Date's second began, one just before it ends."""
    bounds = ClockBounds(frame=STEADY)
    answer(bounds, T0 + 1, 4, 0.5, 0)  # the server read T0 + 3: Date T0
    answer(bounds, T0 + 2_995, 4, 0.5, 0)  # the server read T0 + 2997: Date T0 + 2000
    # [-6, 5] from about a second each: the round trips, 1 ms for whole-ms stamps, and how near the tick each fell
    assert (bounds.offset_ms(), bounds.error_ms(), bounds.bound_ms()) == (-1, 6, 6)
    assert contains(bounds.snapshot(), 0)


def test_unreadable_dates_and_answers_before_their_request_are_ignored_and_counted() -> None:
    """Neither changes the interval; both show in ``ignored``."""
    bounds = ClockBounds(frame=STEADY)
    answer(bounds, T0, 10, 0.5, 0)
    before = bounds.snapshot()
    bounds.observe(T0 + 100, T0 + 110, "not a date")
    bounds.observe(T0 + 200, T0 + 190, http_date(T0 + 5_000))  # received before sent: the local clock stepped back
    after = bounds.snapshot()
    assert (after.offset_ms, after.error_ms, after.samples, after.steps) == (
        before.offset_ms,
        before.error_ms,
        1,
        0,
    )
    assert after.ignored == 2


def test_old_answers_are_forgotten_so_a_drifted_clock_is_followed_without_a_step() -> None:
    """After ``keep_ms`` the samples of an old offset stop pinning the interval; answers that overlap it are no step."""
    bounds = ClockBounds(keep_ms=60_000, frame=STEADY)
    answer(bounds, T0 + 0.5, 4, 0.5, 0)  # a tick pair at offset 0: [-5, 3]
    answer(bounds, T0 + 997, 4, 0.5, 0)
    assert contains(bounds.snapshot(), 0) and bounds.error_ms() == 4
    for second in range(1, 100):  # the offset has drifted to +30 ms; these answers, mid-second, overlap [-5, 3]
        answer(bounds, T0 + second * 1000 + 498, 4, 0.5, -30)
    answer(bounds, T0 + 100_000.5, 4, 0.5, -30)  # a tick pair at offset 30: [25, 33]
    answer(bounds, T0 + 100_997, 4, 0.5, -30)
    snapshot = bounds.snapshot()
    assert contains(snapshot, 30) and snapshot.steps == 0 and snapshot.error_ms == 4


def test_a_step_of_the_local_clock_is_counted_and_followed() -> None:
    """A jump of an hour is disjoint from every kept sample: counted, and the interval starts again."""
    bounds = ClockBounds(frame=STEADY)
    rng = random.Random(3)
    end = many_small_answers(bounds, rng, T0, 0, 50)
    many_small_answers(bounds, rng, end, 3_600_000, 50)
    snapshot = bounds.snapshot()
    assert snapshot.steps == 1 and contains(snapshot, -3_600_000)
    assert snapshot.error_ms is not None and snapshot.error_ms < 500


def test_a_report_is_due_first_then_only_when_the_bound_moves_past_the_threshold_or_a_step_is_seen() -> None:
    """``changed_since_report``: the first bound, a move of more than the threshold, a step; not a small move."""
    bounds = ClockBounds(frame=STEADY)
    bounds.observe(T0, T0 + 10, http_date(T0))
    assert bounds.changed_since_report(threshold_ms=100) is True
    assert bounds.changed_since_report(threshold_ms=100) is False, "reported: nothing new"
    bounds.observe(T0 + 2_000, T0 + 2_010, http_date(T0 + 2_000))  # narrows the bound by 3 ms at most
    assert bounds.changed_since_report(threshold_ms=100) is False
    bounds.observe(T0 + 2_300, T0 + 2_310, http_date(T0 + 2_000))  # the second ticked late: bound 300 ms lower
    assert bounds.changed_since_report(threshold_ms=100) is True
    bounds.observe(T0 + 5_000, T0 + 5_010, http_date(T0 + 9_000))  # a step: 4 s
    assert bounds.steps == 1 and bounds.changed_since_report(threshold_ms=100_000) is True


def test_keep_ms_must_be_positive() -> None:
    """A window of no time would keep no sample."""
    with pytest.raises(ValueError, match="positive"):
        ClockBounds(keep_ms=0)


# -- properties ----------------------------------------------------------------------------------------------------

Timing = tuple[int, float, float, float]
timings = st.lists(
    st.tuples(
        st.integers(0, 2 * KEEP_MS),  # ms since the previous request
        st.floats(0, 5_000),  # round trip, ms
        st.floats(0, 1),  # when the server read its clock, as a fraction of the round trip
        st.floats(0, 0.999),  # sub-millisecond part of the send time
    ),
    min_size=1,
    max_size=60,
)


@given(offset=st.floats(-1e8, 1e8), samples=timings)
def test_the_true_offset_is_always_inside_the_interval(
    offset: float, samples: list[tuple[int, float, float, float]]
) -> None:
    """Whatever the offset and the timings (round trips up to 5 s, any spacing), the interval holds the truth."""
    bounds = ClockBounds(frame=STEADY)
    t = float(T0)
    for gap, rtt, at, fraction in samples:
        t += gap + fraction
        answer(bounds, t, rtt, at, -offset)
        assert contains(bounds.snapshot(), offset)
    assert bounds.steps == 0 and bounds.samples == len(samples)


@settings(max_examples=40)
@given(offset=st.integers(-(10**8), 10**8), seed=st.integers(0, 2**32))
def test_many_answers_of_small_round_trips_narrow_the_error_to_about_the_round_trip(offset: int, seed: int) -> None:
    """600 answers with round trips up to 20 ms, at random instants: the error falls from 500 ms to 40 ms or less."""
    bounds = ClockBounds(frame=STEADY)
    many_small_answers(bounds, random.Random(seed), T0, -offset, 600)
    snapshot = bounds.snapshot()
    assert contains(snapshot, offset)
    assert snapshot.error_ms is not None and snapshot.error_ms <= 2 * SMALL_RTT_MS  # measured: 13 at worst


@settings(max_examples=40)
@given(
    offset=st.integers(-(10**6), 10**6),
    step=st.integers(200, 10**8),
    backwards=st.booleans(),
    seed=st.integers(0, 2**32),
)
def test_a_step_larger_than_the_error_is_seen_and_the_interval_follows_it(
    offset: int, step: int, backwards: bool, seed: int
) -> None:
    """Once narrowed (error under 60 ms), a local step of 200 ms or more is counted once and the new offset followed."""
    rng = random.Random(seed)
    bounds = ClockBounds(frame=STEADY)
    end = many_small_answers(bounds, rng, T0, -offset, 600)
    step = -step if backwards else step
    many_small_answers(bounds, rng, end, -offset + step, 600)
    snapshot = bounds.snapshot()
    assert snapshot.steps == 1
    assert contains(snapshot, offset - step)


class SteppingHost:
    """A host whose wall clock steps while its monotonic clock runs on: ``frame`` is wall minus monotonic."""

    def __init__(self) -> None:
        self.stepped_ms = 0

    def frame(self) -> int:
        return self.stepped_ms


@settings(max_examples=60)
@given(
    offset=st.integers(-(10**6), 10**6),
    steps=st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
)
def test_a_step_of_any_size_moves_the_interval_at_once_and_is_counted_at_the_next_answer(
    offset: int, steps: list[int], seed: int
) -> None:
    """However small the step (smaller than the error, which intersecting wall-clock samples would hide), the
    interval holds the new offset the instant the wall clock steps, before any answer; the next answer counts it."""
    rng = random.Random(seed)
    host = SteppingHost()
    bounds = ClockBounds(frame=host.frame)
    shift = -offset  # local minus AWS
    end = many_small_answers(bounds, rng, T0, shift, 200)
    for step in steps:
        host.stepped_ms += step
        shift += step
        assert contains(bounds.snapshot(), -shift), f"right after a step of {step} ms, with no answer since"
        before = bounds.steps
        end = many_small_answers(bounds, rng, end, shift, 50)
        snapshot = bounds.snapshot()
        assert contains(snapshot, -shift)
        assert snapshot.steps == before + (step != 0)


# -- the hooks, against the local backend ---------------------------------------------------------------------------


def test_the_lean_client_reports_every_answer_error_answers_included(endpoint: str) -> None:
    """``JsonClient(on_answer=...)`` gets the send and receive times and the Date, for a 200 and for a 400."""
    seen: list[tuple[int, int, str]] = []
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    botocore_client = session.client("dynamodb", region_name="us-east-1", endpoint_url=endpoint)
    credentials = session.get_credentials()
    lean = JsonClient.for_botocore(botocore_client, credentials, 5.0, 10.0, on_answer=lambda *a: seen.append(a))
    lean.call("ListTables", b"{}")
    with pytest.raises(AwsError):  # an error answer: still an answer, still dated
        lean.call("DescribeTable", json.dumps({"TableName": "no-such-table"}).encode())
    assert len(seen) == 2
    for sent, received, date in seen:
        assert sent <= received and parse_http_date(date) is not None


def test_botocore_hooks_measure_each_answer_and_watching_twice_counts_once(endpoint: str) -> None:
    """``watch_botocore``: one sample per answered call, however often the client is watched."""
    bounds = ClockBounds()
    kinesis = watch_botocore(watch_botocore(client("kinesis", endpoint), bounds), bounds)
    kinesis.list_streams()
    kinesis.list_streams()
    assert (bounds.samples, bounds.ignored) == (2, 0)


def test_a_copier_process_store_and_streams_measure_this_hosts_clock_against_the_backend(
    pipeline: Pipeline,
) -> None:
    """Through KinesisStreams and DynamoStateStore: every kind of client feeds one ClockBounds, which holds 0."""
    config = load_config(pipeline.properties)
    bounds = ClockBounds()
    store = DynamoStateStore(config, clock_bounds=bounds)
    streams = KinesisStreams(config, clock_bounds=bounds)
    key = f"{pipeline.staging}/shardId-000000000000"
    started = wall_ms()

    assert store.get(key) is None  # PynamoDB's botocore client
    state = ShardState(epoch=1, version=1, owner="w1", lease_until_ms=started + 10_000)
    store.replace_if_unchanged(key, None, state)  # PynamoDB
    store.write(key, state, ShardState(epoch=1, version=2, owner="w1", lease_until_ms=started + 20_000))  # lean
    after_store = bounds.samples
    assert after_store == 3
    streams.shards(pipeline.staging)  # the staging client
    streams.shards(pipeline.target)  # the target's read client
    assert streams.put_records(pipeline.target, [("pk", b'{"eventId": "1"}', None)]) == [None]  # lean PutRecords
    for i in range(20):  # a few more answers, as a busy shard would have
        streams.put_records(pipeline.target, [(f"pk{i}", b"{}", None)])
    snapshot = bounds.snapshot()
    assert snapshot.samples == after_store + 23 and snapshot.ignored == 0 and snapshot.steps == 0
    assert contains(snapshot, 0), f"the backend runs on this host: {snapshot}"
    assert snapshot.bound_ms is not None and snapshot.bound_ms < 1_500, snapshot


def test_a_step_back_during_a_slow_request_leaves_the_true_offset_inside() -> None:
    """The request is sent in one wall-clock frame and answered in another (NTP stepped the host back 3 s
    while a 3.5 s answer was on its way): the sample is widened by the step, the true offset stays inside
    (it used to pin the bound to about 1 s, a third of the truth, and drop the good samples as a step)."""
    host = SteppingHost()
    bounds = ClockBounds(frame=host.frame)
    rng = random.Random(7)
    end = many_small_answers(bounds, rng, T0, 0, 100)  # on time
    aws = (math.floor(end / 1000) + 1) * 1000 - 1  # sent just before a second boundary, in the old frame
    sent = aws
    host.stepped_ms = -3_000
    received = aws + 3_500 - 3_000  # answered 3.5 s later, in the new frame
    bounds.observe(sent, received, http_date(aws + 1))  # the server stamped right after its second ticked
    snapshot = bounds.snapshot()
    assert contains(snapshot, 3_000), snapshot


@given(offset=st.floats(-1e8, 1e8), samples=timings)
def test_the_bound_read_alone_is_the_snapshots_bound(
    offset: float, samples: list[tuple[int, float, float, float]]
) -> None:
    """``bound_ms`` (read several times a delivery, without building a snapshot) is the snapshot's ``bound_ms``
    before any answer and after each one."""
    bounds = ClockBounds(frame=STEADY)
    assert bounds.bound_ms() is None and bounds.snapshot().bound_ms is None
    t = float(T0)
    for gap, rtt, at, fraction in samples:
        t += gap + fraction
        answer(bounds, t, rtt, at, -offset)
        assert bounds.bound_ms() == bounds.snapshot().bound_ms
