"""copier's control-plane calls against the account's, stream's and shard's budgets (docs/operations.md, "The AWS
API budget"): one DescribeStreamSummary answer per stream for a host's processors, refreshed at jittered times,
never waited for (``copier.core.summaryage``, ``copier.adapters.summaryshare``); a takeover's range and lineage
from one ListShards (a listing is one call per 1,000 shards, and a stream takes 1,000 a second).

The processors are ``KinesisStreams`` of the lean path against a fake AWS
endpoint on 127.0.0.1 that answers every DescribeStreamSummary and counts
them (the local backend cannot count calls per process); each processor's
clock is a shared fake monotonic clock, as ``CLOCK_MONOTONIC`` is one clock
for a host's processes.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from copier.adapters import shardlistings
from copier.adapters.awsauth import StaticCredentials
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.summaryshare import SHARE_ENV, SummaryShare
from copier.core.config import load_config
from copier.core.errors import TransientAwsError
from copier.core.shardmap import (
    SHARD_MAP_MAX_AGE_S,
    ShardMap,
    decode_entries,
    decode_listing,
    encode_entries,
    encode_listing,
    listing_fresh,
)
from copier.core.streamsettings import SUMMARY_MAX_AGE_S, SUMMARY_RETRY_S, StreamSettings
from copier.core.summaryage import JITTER, Answer, expiry, fresh, latest, may_ask
from tests.support.fakeaws import FakeAws, clean_aws_env, fake_aws, json_reply
from tests.support.props import write_properties
from tests.support.summaries import KEYS, SETTINGS, SUMMARY, THROTTLED, described


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_aws_env(monkeypatch, tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeAws]:
    with fake_aws() as served:
        yield served


class Host:
    """Processors of one host: ``KinesisStreams`` sharing ``share`` (None: each asks alone) and one clock."""

    def __init__(self, fake: FakeAws, tmp_path: Path, share: SummaryShare | None) -> None:
        self.config = load_config(write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table"))
        self.share = share
        self.now = 1000.0

    def processor(self) -> KinesisStreams:
        return KinesisStreams(self.config, monotonic=lambda: self.now, lean=StaticCredentials(KEYS), share=self.share)


def test_a_hosts_processors_ask_once_per_stream_per_interval_however_many_they_are(
    fake: FakeAws, tmp_path: Path
) -> None:
    """16 processors asking for two streams at every chunk for an hour make at most one call per stream per
    refresh interval between them (at least half of SUMMARY_MAX_AGE_S), not 16. (Each asked alone: 16 times
    as many, 0.0029 calls a second per shard and stream.)"""
    fake.replies = [json_reply(200, SUMMARY) for _ in range(400)]
    host = Host(fake, tmp_path, SummaryShare(tmp_path / "share"))
    (tmp_path / "share").mkdir()
    processors = [host.processor() for _ in range(16)]
    hour = 3600
    while host.now < 1000 + hour:
        for p in processors:
            assert p.settings("staging") is not None and p.settings("target") is not None
        host.now += 7
    bound = 2 * (hour / (SUMMARY_MAX_AGE_S * (1 - JITTER)) + 1)
    assert 2 <= described(fake) <= bound


def test_a_throttled_call_is_asked_again_by_one_processor_after_the_retry_interval_and_nobody_waits(
    fake: FakeAws, tmp_path: Path
) -> None:
    """The call fails (LimitExceededException): every processor goes on at once with the last answer it knows
    (none yet: None), and the host asks again only SUMMARY_RETRY_S later, once, not at every chunk of every
    processor, nor at once within the call (one attempt: a retry would only spend more of the account's 20 a
    second)."""
    fake.replies = [json_reply(400, THROTTLED), json_reply(200, SUMMARY)]
    host = Host(fake, tmp_path, SummaryShare(tmp_path))
    processors = [host.processor() for _ in range(4)]
    for p in processors:
        assert p.settings("target") is None
    assert described(fake) == 1, "one call, one attempt, for the host"
    host.now += SUMMARY_RETRY_S / 2
    assert [p.settings("target") for p in processors] == [None] * 4
    assert described(fake) == 1
    host.now += SUMMARY_RETRY_S
    found = [p.settings("target") for p in processors]
    assert described(fake) == 2 and all(s is not None and s.max_record_bytes == 2048 * 1024 for s in found)


def test_a_processor_never_waits_for_another_asking_now(fake: FakeAws, tmp_path: Path) -> None:
    """While another processor of the host holds the turn to ask (its call under way), a processor goes on with
    the answer it has, stale or none, and makes no call of its own."""
    fake.replies = [json_reply(200, SUMMARY) for _ in range(4)]
    share = SummaryShare(tmp_path)
    host = Host(fake, tmp_path, share)
    first, second = host.processor(), host.processor()
    assert first.settings("target") is not None
    host.now += SUMMARY_MAX_AGE_S + 1
    with share.turn("target") as mine:
        assert mine
        assert first.settings("target") is not None, "the stale answer, not a wait"
        assert second.settings("target") is not None, "the host's answer, stale, read from the share"
    assert described(fake) == 1
    assert first.settings("target") is not None and described(fake) == 2


def test_the_share_is_not_used_when_its_directory_is_open_to_other_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user could write answers there (a limit that dead-letters records): no share, each processor asks
    alone. A run's private directory is shared by the processors it names it to; outside a run there is none."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    config = load_config(write_properties(tmp_path / "p.properties", "http://127.0.0.1:9/", "s", "t", "table"))
    run = SummaryShare.start_run()
    assert run is not None and run.parent == tmp_path / f"copier-{os.getuid()}"
    share = SummaryShare.for_host(config, {SHARE_ENV: str(run)})
    again = SummaryShare.for_host(config, {SHARE_ENV: str(run)})
    assert share is not None and again is not None and again.directory == share.directory
    assert SummaryShare.for_host(config, {}) is None, "a copier process outside copier run asks alone"
    other = SummaryShare.start_run()
    assert other is not None and other != run, "another run starts with none"
    os.chmod(run, 0o777)
    assert SummaryShare.for_host(config, {SHARE_ENV: str(run)}) is None
    os.chmod(run.parent, 0o777)
    assert SummaryShare.start_run() is None


def test_answers_expire_between_half_and_all_of_the_max_age_so_hosts_started_together_drift_apart() -> None:
    """The expiry is drawn when the answer comes: a switch is seen within SUMMARY_MAX_AGE_S, and two hosts that
    asked together do not ask together again."""
    assert expiry(100.0, 0.0) == 100.0 + SUMMARY_MAX_AGE_S
    assert expiry(100.0, 0.999) == pytest.approx(100.0 + SUMMARY_MAX_AGE_S * (1 - JITTER * 0.999))
    answers = {expiry(0.0, draw / 10) for draw in range(10)}
    assert len(answers) == 10 and all(SUMMARY_MAX_AGE_S * (1 - JITTER) < t <= SUMMARY_MAX_AGE_S for t in answers)


def test_freshness_retry_and_which_answer_is_later() -> None:
    """``refresh`` accepts SUMMARY_RETRY_S of age; an answer from the future is stale; a failed call holds the
    host back SUMMARY_RETRY_S; of two answers the later wins, and of two received together the one that failed."""
    answer = Answer().answered(SETTINGS, 100.0, 0.0)
    assert fresh(answer, 100.0 + SUMMARY_MAX_AGE_S, refresh=False)
    assert not fresh(answer, 101.0 + SUMMARY_MAX_AGE_S, refresh=False)
    assert fresh(answer, 100.0 + SUMMARY_RETRY_S, refresh=True)
    assert not fresh(answer, 101.0 + SUMMARY_RETRY_S, refresh=True)
    assert not fresh(answer, 99.0, refresh=False), "from the future: a clock that restarted"
    assert not fresh(Answer(), 100.0, refresh=False)
    failed = answer.failed(200.0)
    assert failed.settings == SETTINGS
    assert not may_ask(failed, 200.0 + SUMMARY_RETRY_S - 1) and may_ask(failed, 200.0 + SUMMARY_RETRY_S)
    assert latest(answer, failed) is failed and latest(failed, answer) is failed
    assert latest(answer, None) is answer
    newer = Answer().answered(SETTINGS, 150.0, 0.5)
    assert latest(failed, newer) is newer


def test_the_shared_answer_survives_its_encoding_and_anything_else_is_asked_again() -> None:
    """What the share keeps decodes to the same answer; a file cut short, or another shape, is no answer."""
    answer = Answer().answered(SETTINGS, 100.0, 0.3).failed(120.0)
    assert Answer.decode(answer.encode()) == answer
    assert Answer.decode(Answer().encode()) == Answer()
    every = StreamSettings("t", 86_400_000, 4 << 20, "AUTO", "KMS", "alias/k", "ON_DEMAND", 7)  # no field left out
    assert Answer.decode(Answer().answered(every, 1.0, 0.0).encode()) == Answer().answered(every, 1.0, 0.0)
    text = answer.encode()
    for broken in (text[: len(text) // 2], "[]", '{"settings": null}', text.replace("100.0", '"x"')):
        assert Answer.decode(broken) is None


def test_check_config_under_a_throttled_describe_stream_summary_lets_the_start_go_on(
    fake: FakeAws, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """check-config is the service's ExecStartPre: a DescribeStreamSummary throttled at a fleet's start (the
    account's 20 a second) is a warning and exit 0, as for ``copier run``, not exit 3 and a host that does not
    start (restarted by systemd every 5 s, each start spending the budget again). No ``ok:`` line: not every
    check passed."""
    from copier.commands.preflight import check_config

    table = {"Table": {"TableName": "table", "TableStatus": "ACTIVE"}}
    ttl = {"TimeToLiveDescription": {"TimeToLiveStatus": "ENABLED", "AttributeName": "expires_at"}}
    fake.replies = [json_reply(200, table), json_reply(200, ttl)]
    fake.replies += [json_reply(400, THROTTLED) for _ in range(10)]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    config = load_config(write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table"))
    assert check_config(config, offline=False) == 0
    out, err = capsys.readouterr()
    assert "could not be checked" in err and "LimitExceededException" in err
    assert ": ok: " not in out


LINEAGE_SHARD = "shardId-000000000002"
LISTING = {
    "Shards": [
        {"ShardId": "shardId-000000000000", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}},
        {
            "ShardId": LINEAGE_SHARD,
            "ParentShardId": "shardId-000000000000",
            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "4"},
        },
    ]
}


def listed(fake: FakeAws) -> int:
    return sum(1 for r in fake.received if r.headers.get("X-Amz-Target", "").endswith("ListShards"))


def test_the_range_and_the_lineage_of_a_takeover_come_from_one_listing(fake: FakeAws, tmp_path: Path) -> None:
    """The shard's own entry (its range) and its parents, asked within seconds: one ListShards. (Each asked its
    own: two, and a third for the lineage before the start.)"""
    fake.replies = [json_reply(200, LISTING) for _ in range(4)]
    streams = Host(fake, tmp_path, None).processor()
    entry = streams.shard_entry("staging", LINEAGE_SHARD)
    assert entry is not None and entry["HashKeyRange"]["EndingHashKey"] == "4"
    assert streams.parents("staging", LINEAGE_SHARD) == ["shardId-000000000000"]
    assert streams.parents("staging", "shardId-000000000000", ancestor=True) == []
    assert listed(fake) == 1


def test_a_shard_the_cached_listing_does_not_name_is_asked_about_fresh(fake: FakeAws, tmp_path: Path) -> None:
    """A shard created since the cached listing (a split seconds ago) is looked for in a new one; one that is
    still not listed is None (its own: a transient error, as the KCL handed it out)."""
    fake.replies = [json_reply(200, LISTING) for _ in range(5)]
    streams = Host(fake, tmp_path, None).processor()
    assert streams.shard_entry("staging", LINEAGE_SHARD) is not None
    assert streams.shard_entry("staging", "shardId-000000000007") is None
    assert listed(fake) == 2
    with pytest.raises(TransientAwsError):
        streams.parents("staging", "shardId-000000000007")


HALF = 2**127
TARGET_LISTING = {
    "Shards": [
        {"ShardId": "shardId-000000000000", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(HALF - 1)}},
        {
            "ShardId": "shardId-000000000001",
            "HashKeyRange": {"StartingHashKey": str(HALF), "EndingHashKey": str(2 * HALF - 1)},
        },
    ]
}
CLOSED = {"StartingSequenceNumber": "1", "EndingSequenceNumber": "2"}
SPLIT_LISTING = {  # shardId-000000000000 split in two: its children take its range, it takes no more
    "Shards": [
        {**TARGET_LISTING["Shards"][0], "SequenceNumberRange": CLOSED},
        TARGET_LISTING["Shards"][1],
        {
            "ShardId": "shardId-000000000002",
            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(HALF // 2 - 1)},
        },
        {
            "ShardId": "shardId-000000000003",
            "HashKeyRange": {"StartingHashKey": str(HALF // 2), "EndingHashKey": str(HALF - 1)},
        },
    ]
}


def _shared_host(fake: FakeAws, tmp_path: Path) -> Host:
    (tmp_path / "share").mkdir()
    return Host(fake, tmp_path, SummaryShare(tmp_path / "share"))


def test_a_hosts_processors_list_the_target_once_per_max_age_and_see_a_split_within_it(
    fake: FakeAws, tmp_path: Path
) -> None:
    """16 processors routing every chunk for an hour list the target once per SHARD_MAP_MAX_AGE_S between them
    (each for itself: 16 times as many, 333 ListShards a second for a fleet on a 10,000-shard target). The
    shared map is never older than that bound: a split is in every processor's map within it."""
    fake.replies = [json_reply(200, TARGET_LISTING) for _ in range(40)]
    host = _shared_host(fake, tmp_path)
    processors = [host.processor() for _ in range(16)]
    hour, step = 3600, 7
    while host.now < 1000 + hour:
        assert {p.shard_map("target").ranges[0][2] for p in processors} == {"shardId-000000000000"}
        host.now += step
    assert hour / (SHARD_MAP_MAX_AGE_S + step) <= listed(fake) <= hour / SHARD_MAP_MAX_AGE_S + 1
    fake.replies = [json_reply(200, SPLIT_LISTING) for _ in range(4)]
    split_at, seen = host.now, 0.0
    while {p.shard_map("target").ranges[0][2] for p in processors} != {"shardId-000000000002"}:
        host.now += step
        seen = host.now - split_at
    assert seen <= SHARD_MAP_MAX_AGE_S + step


def test_while_another_lists_a_processor_goes_on_with_its_stale_map_and_one_without_waits_a_bounded_time(
    fake: FakeAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stale map is safe (it names only ancestors of today's shards, whose descendants verification reads), so
    a processor with one makes no call while another holds the turn to list. A processor with none waits for the
    lister's map a bounded time, then lists alone (a lister stuck must not stop the shard)."""
    monkeypatch.setattr(shardlistings, "FIRST_LISTING_WAIT_S", 0.2)
    fake.replies = [json_reply(200, TARGET_LISTING) for _ in range(3)]
    host = _shared_host(fake, tmp_path)
    assert host.share is not None
    first = host.processor()
    first.shard_map("target")
    host.now += SHARD_MAP_MAX_AGE_S + 1
    with host.share.turn("target", what="listing") as mine:
        assert mine
        assert first.shard_map("target").ranges[0][2] == "shardId-000000000000"
        assert listed(fake) == 1, "the stale map, no call"
        newcomer = host.processor()
        assert len(newcomer.shard_map("target").ranges) == 2
        assert listed(fake) == 2, "waited, then listed alone"
    host.now += 1
    assert first.shard_map("target") is not None and listed(fake) == 3, "the stale one lists once the turn is free"


@pytest.mark.parametrize(
    "written",
    [
        "",
        '{"format": 2, "listed": 1000.0, "ranges": []}',
        '{"format": 1, "listed": true, "ranges": []}',
        '{"format": 1, "listed": 1000.0, "ranges": [[0, "9", "shardId-000000000000"]]}',
        '{"format": 1, "listed": 1000.0, "ranges": [["0", "9", "shard-0"]]}',
        f'{{"format": 1, "listed": 1000.0, "ranges": [["0", "{2**128}", "shardId-000000000000"]]}}',
        '{"format": 1, "listed": 1000.0, "ranges": [["0", "9"]]}',
        '{"format": 1, "listed": 1000.0, "ranges": [[null, "9", "shardId-000000000000"]]}',
        '{"format": 1, "listed": 1' + "0" * 400 + ', "ranges": []}',  # no float: OverflowError
        "[" * 100_000 + "]" * 100_000,  # RecursionError
    ],
)
def test_a_shared_listing_that_is_not_exactly_what_a_processor_wrote_is_listed_again(
    fake: FakeAws, tmp_path: Path, written: str
) -> None:
    fake.replies = [json_reply(200, TARGET_LISTING)]
    host = _shared_host(fake, tmp_path)
    (tmp_path / "share" / "target.map").write_text(written, encoding="utf-8")
    assert len(host.processor().shard_map("target").ranges) == 2 and listed(fake) == 1


def test_a_listing_survives_its_encoding_at_10000_shards_and_one_from_the_future_is_stale() -> None:
    width = 2**128 // 10_000
    shards = [
        {
            "ShardId": f"shardId-{n:012d}",
            "HashKeyRange": {"StartingHashKey": str(n * width), "EndingHashKey": str((n + 1) * width - 1)},
        }
        for n in range(10_000)
    ]
    listing = (1000.0, ShardMap.of(shards))
    assert decode_listing(encode_listing(listing)) == listing
    assert listing_fresh(listing, 1000.0 + SHARD_MAP_MAX_AGE_S) and not listing_fresh(
        listing, 1001 + SHARD_MAP_MAX_AGE_S
    )
    assert not listing_fresh(listing, 999.0), "stamped later than now: a clock that restarted"


def test_the_runs_checks_answers_are_its_processors_first_and_no_processor_asks_again(
    fake: FakeAws, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copier run``'s checks describe the staging and target streams before the daemon starts; with the run's
    share they keep their answers there, and the processors start on them: a fleet start asks once per host
    and stream (before: twice, the checks' call and the first processor's)."""
    from copier.adapters import dynamo
    from copier.commands.preflight import stream_verdicts
    from copier.testing.store import InMemoryStateStore

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEYS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEYS.secret_key)
    monkeypatch.setattr(dynamo, "DynamoStateStore", lambda config: InMemoryStateStore())  # the application's answers
    fake.replies = [json_reply(200, SUMMARY) for _ in range(2)]
    host = _shared_host(fake, tmp_path)
    stream_verdicts(host.config, host.share)
    assert described(fake) == 2
    host.now = time.monotonic() + 1  # the processors' clock is the checks' (CLOCK_MONOTONIC), a second later
    processors = [host.processor() for _ in range(16)]
    for p in processors:
        target = p.settings("target")
        assert p.settings("staging") is not None and target is not None
        assert target.max_record_bytes == SETTINGS.max_record_bytes
    assert described(fake) == 2


def test_the_supervisor_adopts_the_run_directory_its_own_process_made_and_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copier run`` makes the run's directory, then execs the supervisor (the same pid), which takes it over.
    A directory named in the environment that another process owns (inherited from another run) or that is not
    a run directory is never adopted: a fresh one is made."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    made = SummaryShare.start_run()
    assert made is not None and SummaryShare.start_run(adopt=str(made)) == made
    (made / "owner").write_text(str(os.getppid()), encoding="ascii")  # another process's run
    other = SummaryShare.start_run(adopt=str(made))
    assert other is not None and other != made
    elsewhere = tmp_path / "summaries-x"
    elsewhere.mkdir(mode=0o700)
    (elsewhere / "owner").write_text(str(os.getpid()), encoding="ascii")
    assert SummaryShare.start_run(adopt=str(elsewhere)) not in (None, elsewhere)


def test_a_hosts_takeovers_read_ranges_and_parents_from_one_listing_and_a_new_shard_is_listed_fresh(
    fake: FakeAws, tmp_path: Path
) -> None:
    """At a fleet start each processor read its own range and lineage from a listing of its own (10 pages at
    10,000 shards: 620 ListShards a second at the simulated peak). A host's processors now share the listing
    up to SHARD_MAP_MAX_AGE_S: a shard's range and parents never change once it exists. A shard the shared
    listing does not name (created since) is listed fresh, and so is everything once the listing is too old."""
    fake.replies = [json_reply(200, LISTING) for _ in range(3)]
    host = _shared_host(fake, tmp_path)
    first, second = host.processor(), host.processor()
    assert first.parents("staging", LINEAGE_SHARD) == ["shardId-000000000000"]
    host.now += 60
    entry = second.shard_entry("staging", LINEAGE_SHARD)
    assert entry is not None and entry["HashKeyRange"]["EndingHashKey"] == "4"
    assert second.parents("staging", "shardId-000000000000", ancestor=True) == []
    assert listed(fake) == 1, "the host's listing"
    assert second.shard_entry("staging", "shardId-000000000007") is None
    assert listed(fake) == 2, "a shard not named: listed fresh"
    host.now += SHARD_MAP_MAX_AGE_S + 1
    assert host.processor().shard_entry("staging", LINEAGE_SHARD) is not None
    assert listed(fake) == 3, "too old: listed again"


@pytest.mark.parametrize(
    "written",
    [
        "[]",
        '{"format": 1, "listed": 1000.0, "shards": [{"ShardId": "x", "HashKeyRange": '
        '{"StartingHashKey": "0", "EndingHashKey": "9"}}]}',
        '{"format": 1, "listed": 1000.0, "shards": [{"ShardId": "shardId-000000000002", "HashKeyRange": '
        '{"StartingHashKey": 0, "EndingHashKey": "9"}}]}',
        '{"format": 1, "listed": 1000.0, "shards": [{"HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}]}',
        '{"format": 1, "listed": 1000.0, "shards": [{"ShardId": "shardId-000000000002", "Other": 1, '
        '"HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}]}',
        '{"format": 1, "listed": 1' + "0" * 400 + ', "shards": []}',  # no float: OverflowError
    ],
)
def test_shared_entries_that_are_not_exactly_what_a_processor_wrote_are_listed_again(
    fake: FakeAws, tmp_path: Path, written: str
) -> None:
    fake.replies = [json_reply(200, LISTING)]
    host = _shared_host(fake, tmp_path)
    (tmp_path / "share" / "staging.shards").write_text(written, encoding="utf-8")
    assert host.processor().parents("staging", LINEAGE_SHARD) == ["shardId-000000000000"]
    assert listed(fake) == 1


def test_shared_entries_keep_ids_parents_and_ranges_exactly() -> None:
    shards = [{**s, "SequenceNumberRange": CLOSED} for s in LISTING["Shards"]]
    decoded = decode_entries(encode_entries(1000.0, shards))
    assert decoded == (1000.0, LISTING["Shards"])


EXPIRED_PARENT_LISTING = {"Shards": [LISTING["Shards"][1]]}  # the child's parent has expired from staging


def test_a_hosts_takeovers_whose_lineage_reaches_an_expired_ancestor_list_staging_once_a_host_not_once_a_shard(
    fake: FakeAws, tmp_path: Path
) -> None:
    """Review r47b: on a staging stream resharded longer ago than its retention, every child's parent has
    expired. A takeover whose own batches do not reach back the horizon (a new application, an idle shard, a
    restart after a downtime longer than the window) walks its lineage and asks for the parent
    (``parents(..., ancestor=True)``): the host's listing does not name it, so each processor lists the stream
    fresh, 10 pages at 10,000 shards, the fleet start's peak the shared listing was to remove. The host's
    listing names the child, so the parent it does not name had expired when it was taken (a parent is older
    than its child): no processor needs a listing of its own."""
    fake.replies = [json_reply(200, EXPIRED_PARENT_LISTING) for _ in range(20)]
    host = _shared_host(fake, tmp_path)
    for _ in range(8):
        processor = host.processor()
        assert processor.parents("staging", LINEAGE_SHARD) == ["shardId-000000000000"]
        assert processor.parents("staging", "shardId-000000000000", ancestor=True) == []
        host.now += 1
    assert listed(fake) <= 2, f"{listed(fake)} listings for 8 takeovers of one host"


def test_a_sweep_removes_the_directories_of_runs_that_were_killed_and_keeps_a_running_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor SIGKILLed (a host lost, a stop past its grace on a loaded machine) leaves its run directory;
    a local pipeline's stop sweeps: it goes, a running supervisor's stays, and the user's directory goes with
    the last (the demo left one behind when a worker's stop outlasted its grace)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import subprocess
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    killed = SummaryShare.start_run()
    live = SummaryShare.start_run()
    assert killed is not None and live is not None
    gone = subprocess.Popen(["true"])
    gone.wait()
    (killed / "owner").write_text(str(gone.pid), encoding="ascii")  # its supervisor has exited
    SummaryShare.sweep()
    assert not killed.exists() and live.exists(), "a run still going keeps its directory"
    again = SummaryShare.start_run()
    assert again is not None
    (again / "owner").write_text(str(gone.pid), encoding="ascii")
    SummaryShare.end_run(live)
    assert again.parent.exists(), "the killed run's directory keeps the user's"
    SummaryShare.sweep()
    assert not (tmp_path / f"copier-{os.getuid()}").exists()
