"""The control-plane simulation (``copier.bench.sim``): a day of 1,000 shards stays within every budget, and
the simulation can say otherwise: before the host share it goes over, its account throttles past AWS's
limits, and a batch that waits on a throttled call is counted as waiting.

The simulated day runs copier's own control-plane code (``KinesisStreams``, the share, ``ShardSession``,
``StreamGuard``) on a simulated clock: no sleeps, no threads, the same figures on every machine.
"""

from __future__ import annotations

from typing import Any

import pytest

from copier.bench.sim.account import Account, Stream
from copier.bench.sim.day import Day
from copier.bench.sim.processors import STAGING, TARGET, MemoryShare, Processor, SimClock, sim_config
from copier.bench.sim.report import run
from copier.core.errors import TransientAwsError
from copier.core.limits import MAX_STREAM_RECORD_BYTES

# The day of 1,000 shards is about 20 CPU seconds (a listing of the target every 301 simulated seconds for each
# processor, through the adapter's own paging): room for a machine shared with other tests.
pytestmark = pytest.mark.timeout(900)


def _api(result: dict[str, Any], api: str, caller: str = "copier") -> dict[str, Any]:
    return next(a for a in result["apis"] if a["api"] == api and a["caller"] == caller)


@pytest.fixture(scope="module")
def day_of_1000() -> dict[str, Any]:
    return run(Day(shards=1000))


def test_a_day_of_1000_shards_keeps_every_copier_rate_within_its_budget(day_of_1000: dict[str, Any]) -> None:
    result = day_of_1000
    over = [a for a in result["apis"] if not a["within"]]
    assert not over, over
    summary = _api(result, "DescribeStreamSummary")
    assert summary["calls"] > 0 and summary["throttled"] == 0
    assert summary["peak"] <= summary["budget"] == summary["limit"] / 2
    listing = _api(result, "ListShards")
    assert listing["calls"] > 0 and listing["peak"] <= listing["budget"]
    assert result["within_budgets"]


def test_forwarding_never_waits_on_a_control_plane_call(day_of_1000: dict[str, Any]) -> None:
    result = day_of_1000
    assert result["batches"] > 1000 * 24 * 3600 // Day.interval_s * 0.9  # every processor forwarded all day
    assert result["forwarding_wait_max_s"] == 0


def test_the_day_has_its_events(day_of_1000: dict[str, Any]) -> None:
    """The fleet start, the reshards, the host loss and the rolling deploy each took shards over, and every
    processor running at a switch of the target acted on it."""
    result = day_of_1000
    resharded = int(1000 * Day.reshard_share)  # split into two children each, then merged back into one
    started, children, merged, lost, deployed = 1000, 2 * resharded, resharded, Day.shards_per_host, 1000
    assert result["takeovers"] >= started + children + merged + lost + deployed
    assert set(result["switch_seen_within_s"]) == {
        "target AUTO",
        "target USER_PARTITION_KEY",
        "target MaxRecordSize 10 MiB",
    }
    verified = _api(result, "GetShardIterator")["calls"]  # the lost host's shards (16, and a child it took)
    assert verified % Day.verify_shards == 0 and verified >= Day.shards_per_host * Day.verify_shards


def test_each_processor_asking_for_itself_goes_over_the_budget() -> None:
    """Copier before the host share (``shared=False``: every processor's own DescribeStreamSummary answer):
    at 1,000 shards its calls go over copier's half of the account's 20 a second within the first hour,
    where the shared answer keeps well inside it."""
    hour = {"shards": 1000, "duration_s": 3600.0, "application": False}
    alone, shared = run(Day(shared=False, **hour)), run(Day(shared=True, **hour))
    assert _api(alone, "DescribeStreamSummary")["peak"] > _api(alone, "DescribeStreamSummary")["budget"]
    assert not alone["within_budgets"]
    assert shared["within_budgets"]
    assert _api(shared, "DescribeStreamSummary")["calls"] * 5 < _api(alone, "DescribeStreamSummary")["calls"]


def test_the_applications_answer_makes_describe_stream_summary_independent_of_the_fleets_size() -> None:
    """With the application's answer in the state table, an hour of 1,000 shards asks DescribeStreamSummary about
    as often as one of 250 (the hosts' starts and the refreshes of two streams), where one answer per host grows
    with the hosts; the item's reads stay far inside its partition's 3,000 a second."""
    hour = {"duration_s": 3600.0}
    small, large = run(Day(shards=250, **hour)), run(Day(shards=1000, **hour))
    per_host = run(Day(shards=1000, application=False, **hour))
    calls = {name: _api(r, "DescribeStreamSummary")["calls"] for name, r in (("250", small), ("1000", large))}
    assert calls["1000"] <= calls["250"] * 1.5, calls
    assert calls["1000"] * 5 < _api(per_host, "DescribeStreamSummary")["calls"]
    read = _api(large, "GetItem")
    assert read["peak"] <= read["budget"] and large["within_budgets"]


def _processor(account: Account, share: MemoryShare | None = None) -> Processor:
    return Processor(sim_config(), account, SimClock(), "shardId-000000000000", "k0", share)


def test_the_account_refuses_calls_past_aws_limits_with_aws_errors() -> None:
    account = Account([Stream.even(STAGING, 4), Stream.even(TARGET, 4)])
    p = _processor(account)
    for _ in range(20):
        p.streams.describe(STAGING)
    with pytest.raises(TransientAwsError) as refused:
        p.streams.describe(TARGET)  # the 21st in the same second: the account's limit, whatever the stream
    assert refused.value.code == "LimitExceededException"
    for _ in range(5):
        account.answer("GetShardIterator", {"StreamName": STAGING, "ShardId": "shardId-000000000001"}, "kcl", 0.0)
    with pytest.raises(TransientAwsError) as refused:
        account.answer("GetShardIterator", {"StreamName": STAGING, "ShardId": "shardId-000000000001"}, "kcl", 0.0)
    assert refused.value.code == "ProvisionedThroughputExceededException"
    account.answer("GetShardIterator", {"StreamName": STAGING, "ShardId": "shardId-000000000002"}, "kcl", 0.0)
    for _ in range(1000):
        account.answer("ListShards", {"StreamName": STAGING}, "copier", 0.5)
    with pytest.raises(TransientAwsError):
        account.answer("ListShards", {"StreamName": STAGING}, "copier", 0.5)
    account.answer("ListShards", {"StreamName": TARGET}, "copier", 0.5)  # per stream
    account.answer("ListShards", {"StreamName": STAGING}, "copier", 1.5)  # a second later: refilled
    assert account.throttled[("DescribeStreamSummary", "copier")] == 1
    assert account.throttled[("GetShardIterator", "kcl")] == 1
    assert account.throttled[("ListShards", "copier")] == 1


def test_a_throttled_describe_stream_summary_never_holds_a_batch() -> None:
    """The account's DescribeStreamSummary spent by others: the batch goes on at once under the most any
    stream takes (the put decides), and the call is asked again 30 s later, by one processor of the host."""
    account = Account([Stream.even(STAGING, 4), Stream.even(TARGET, 4)])
    share = MemoryShare()
    p, other = _processor(account, share), _processor(account, share)
    waits: list[float] = []
    p.take_over(waits)
    for _ in range(20):
        account.call("DescribeStreamSummary", "", "kcl", 0.0)
    p.batch(waits)
    other.batch(waits)
    assert waits == [0.0, 0.0, 0.0]
    assert p.session.settings().max_record_bytes == MAX_STREAM_RECORD_BYTES
    # one call a stream (staging, target), by the first processor: the second goes on with the failure shared
    assert account.throttled[("DescribeStreamSummary", "copier")] == 2


def test_a_batch_that_waits_on_a_throttled_call_is_counted_as_waiting() -> None:
    """The wait the simulation reports can be other than 0: a shard map listed while ListShards is spent
    waits for its retries (``ShardSession.retrying``), and the batch says so."""
    account = Account([Stream.even(STAGING, 4), Stream.even(TARGET, 4)])
    p = _processor(account)
    waits: list[float] = []
    p.take_over(waits)
    for _ in range(1000):
        account.call("ListShards", TARGET, "kcl", 0.0)
    p.batch(waits)
    assert waits[0] == 0 and waits[1] > 0
