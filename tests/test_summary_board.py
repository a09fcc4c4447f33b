"""One DescribeStreamSummary answer per application and stream, kept in the state table
(``copier.core.summaryboard``, ``copier.adapters.summaryboard``): the application asks once per stream per
refresh interval however many hosts it runs on; a host whose clock cannot be trusted, a turn never given back,
a failed call and a state table that cannot be used each leave every host forwarding, on an answer no older
than the rules allow.

Hosts here are ``KinesisStreams`` of the lean path against a fake AWS endpoint on 127.0.0.1 that answers and
counts every DescribeStreamSummary, each with its own monotonic clock and one wall clock (skewed where a test
says so), and the state store in memory (the same conditional writes as DynamoDB's:
tests/test_state_contract.py). The last test runs the real processor clients against the local backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from copier.adapters.awsauth import StaticCredentials
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.summaryboard import ApplicationAnswers
from copier.core.config import Config, load_config
from copier.core.errors import TransientAwsError
from copier.core.state import BoardItem
from copier.core.streamsettings import SUMMARY_MAX_AGE_S, StreamSettings
from copier.core.summaryage import Answer
from copier.core.summaryboard import (
    HOST_SPREAD_MS,
    ITEM_LIFE_MS,
    MAX_AGE_MS,
    RETRY_MS,
    TURN_MS,
    Posted,
    adopt,
    answer_scope,
    answered,
    board_key,
    failing,
    host_answer,
    posted_fresh,
    turn_taken,
)
from copier.testing.store import InMemoryStateStore
from tests.support.fakeaws import FakeAws, clean_aws_env, fake_aws, json_reply
from tests.support.props import write_properties
from tests.support.summaries import KEYS, SETTINGS, SUMMARY, THROTTLED, described

AUTO = {"StreamDescriptionSummary": {"RecordDistributionStrategy": "AUTO", "OpenShardCount": 1}}
SKEW = 1000  # copier.clockSkewMillis' default
T0 = 1_800_000_000_000


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_aws_env(monkeypatch, tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeAws]:
    with fake_aws() as served:
        served.replies = [json_reply(200, SUMMARY) for _ in range(2000)]
        yield served


class Fleet:
    """Hosts of one application: one state store, one wall clock (``now_ms``); a host's clock may be off it."""

    def __init__(self, fake: FakeAws, tmp_path: Path, store: InMemoryStateStore | None = None) -> None:
        self.config = load_config(write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table"))
        self.store = store if store is not None else InMemoryStateStore()
        self.now_ms = T0
        self.slept: list[float] = []

    def host(self, off_ms: int = 0, store: object = None) -> KinesisStreams:
        """A host (one processor: the host share is tests/test_control_plane_budget.py's) whose wall clock reads
        ``off_ms`` from the fleet's, and whose monotonic clock is its own."""
        board = ApplicationAnswers(
            self.config,
            store or self.store,
            wall_ms=lambda: self.now_ms + off_ms,
            sleep=self._sleep,  # type: ignore[arg-type]
        )
        started = self.now_ms
        return KinesisStreams(
            self.config,
            monotonic=lambda: 50.0 + (self.now_ms - started) / 1000,
            lean=StaticCredentials(KEYS),
            board=board,
        )

    def _sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_ms += int(seconds * 1000)

    def key(self, stream: str = "target") -> str:
        return board_key(answer_scope(self.config), stream)

    def posted(self, stream: str = "target") -> Posted:
        item = self.store.get_posted(self.key(stream))
        assert item is not None
        decoded = Posted.decode(item.text)
        assert decoded is not None
        return decoded


# -- the rules ------------------------------------------------------------------------------------------------


def test_an_answer_is_fresh_for_its_life_and_not_from_a_clock_ahead_by_more_than_the_bound() -> None:
    posted = answered(SETTINGS, T0, draw=0.0)
    assert posted.expires_ms is not None and posted.expires_ms - T0 == MAX_AGE_MS - HOST_SPREAD_MS
    assert posted_fresh(posted, T0, MAX_AGE_MS, SKEW)
    assert posted_fresh(posted, posted.expires_ms, MAX_AGE_MS, SKEW)
    assert not posted_fresh(posted, posted.expires_ms + 1, MAX_AGE_MS, SKEW)
    assert not posted_fresh(posted, T0 + RETRY_MS + 1, RETRY_MS, SKEW), "a refresh wants one at most 30 s old"
    assert posted_fresh(posted, T0 - SKEW, MAX_AGE_MS, SKEW), "asked by a clock ahead within the bound"
    assert not posted_fresh(posted, T0 - SKEW - 1, MAX_AGE_MS, SKEW), "from further in the future: not trusted"
    stretched = replace(posted, expires_ms=T0 + MAX_AGE_MS + 1)
    assert not posted_fresh(stretched, T0, MAX_AGE_MS, SKEW), "an expiry past the longest life is not trusted"
    assert not posted_fresh(Posted(), T0, MAX_AGE_MS, SKEW)


def test_a_hosts_copy_is_never_acted_on_past_the_longest_age() -> None:
    for draw in (0.0, 0.5, 0.999):
        posted = answered(SETTINGS, T0, draw)
        assert posted.expires_ms is not None
        for host_draw in (0.0, 0.999):
            copy = host_answer(posted, T0 + 5000, 100.0, host_draw)
            assert copy.fetched_s == pytest.approx(95.0) and copy.settings == SETTINGS
            assert copy.expires_s is not None and copy.expires_s - copy.fetched_s <= SUMMARY_MAX_AGE_S
            assert copy.expires_s >= 100.0 + (posted.expires_ms - T0 - 5000) / 1000


def test_a_turn_runs_its_length_and_one_from_a_clock_far_ahead_is_free() -> None:
    turn = Posted(turn_until_ms=T0 + TURN_MS)
    assert turn_taken(turn, T0, SKEW) and not turn_taken(turn, T0 + TURN_MS, SKEW)
    assert not turn_taken(Posted(turn_until_ms=T0 + TURN_MS + SKEW + 1), T0, SKEW)
    assert not turn_taken(Posted(), T0, SKEW)


def test_a_failure_holds_everyone_back_for_the_retry_interval() -> None:
    failed = Posted(failed_ms=T0)
    assert failing(failed, T0, SKEW) and failing(failed, T0 + RETRY_MS - 1, SKEW)
    assert not failing(failed, T0 + RETRY_MS, SKEW)
    assert not failing(Posted(failed_ms=T0 + SKEW + 1), T0, SKEW), "a failure from a clock far ahead"


def test_an_item_not_exactly_as_written_is_never_trusted() -> None:
    good = answered(SETTINGS, T0, 0.3)
    assert Posted.decode(good.encode()) == good
    text = good.encode()
    for bad in (
        "",
        "[]",
        text.replace('"format": 1', '"format": 2'),
        text.replace('"asked": ', '"asked": 1.5, "x": '),
        text.replace(f'"asked": {T0}', f'"asked": "{T0}"'),
        text.replace(f'"asked": {T0}', '"asked": true'),
        text.replace('"max_record_bytes": 2097152', '"max_record_bytes": "2097152"'),
        text.replace('"turn": null', '"turn": []'),
        "[" * 100_000,
    ):
        assert Posted.decode(bad) is None, bad[:80]


def test_what_a_host_makes_of_the_applications_answer() -> None:
    held = Answer().answered(SETTINGS, 10.0, 0.0)
    stale_at = 10.0 + SUMMARY_MAX_AGE_S + 1
    fresh_one = answered(SETTINGS, T0, 0.0)
    taken = adopt(fresh_one, held, stale_at, T0, MAX_AGE_MS, SKEW, 0.0)
    assert taken is not None and taken.fetched_s == stale_at and taken.settings == SETTINGS
    failed = adopt(Posted(failed_ms=T0), held, stale_at, T0, MAX_AGE_MS, SKEW, 0.0)
    assert failed == held.failed(stale_at)
    busy = adopt(Posted(turn_until_ms=T0 + TURN_MS), held, stale_at, T0, MAX_AGE_MS, SKEW, 0.0)
    assert busy is not None and busy.fetched_s == held.fetched_s and busy.expires_s == stale_at + 1.0
    assert adopt(Posted(turn_until_ms=T0 + TURN_MS), Answer(), stale_at, T0, MAX_AGE_MS, SKEW, 0.0) is None
    assert adopt(None, held, stale_at, T0, MAX_AGE_MS, SKEW, 0.0) is None


# -- the fleet ------------------------------------------------------------------------------------------------


def test_the_application_asks_once_per_stream_per_interval_however_many_hosts_it_has(
    fake: FakeAws, tmp_path: Path
) -> None:
    """40 hosts asking for two streams at every chunk for an hour: at most one call per stream per refresh
    interval between them all, where each host alone would make 40 times as many."""
    fleet = Fleet(fake, tmp_path)
    hosts = [fleet.host() for _ in range(40)]
    hour_ms = 3_600_000
    while fleet.now_ms < T0 + hour_ms:
        for h in hosts:
            assert h.settings("staging") is not None and h.settings("target") is not None
        fleet.now_ms += 7000
    shortest_life_s = (MAX_AGE_MS - HOST_SPREAD_MS) / 1000 / 2
    assert 2 <= described(fake) <= 2 * (3600 / shortest_life_s + 1)
    assert fleet.slept == [], "nobody waited"
    reads = fleet.store.posted_reads
    assert reads <= 40 * 2 * (3600 / shortest_life_s + 2) * 2, f"{reads} reads of the item"


def test_a_switch_is_seen_by_every_host_within_the_longest_age(fake: FakeAws, tmp_path: Path) -> None:
    fleet = Fleet(fake, tmp_path)
    hosts = [fleet.host() for _ in range(10)]
    for h in hosts:
        assert h.settings("target") == StreamSettings.from_summary("target", SUMMARY["StreamDescriptionSummary"])
    fake.replies = [json_reply(200, AUTO) for _ in range(100)]
    switched = fleet.now_ms
    seen: dict[int, int] = {}
    while len(seen) < len(hosts):
        fleet.now_ms += 1000
        for n, h in enumerate(hosts):
            settings = h.settings("target")
            if n not in seen and settings is not None and settings.auto:
                seen[n] = fleet.now_ms - switched
    assert max(seen.values()) <= MAX_AGE_MS + 1000


def test_a_host_whose_clock_is_far_ahead_neither_holds_the_others_off_nor_feeds_them_old_answers(
    fake: FakeAws, tmp_path: Path
) -> None:
    """A host 10 minutes ahead posts an answer and a turn stamped in the future. The others do not trust either:
    they ask (once, between them) instead of acting for 10 minutes on an answer they cannot date."""
    fleet = Fleet(fake, tmp_path)
    ahead = fleet.host(off_ms=600_000)
    assert ahead.settings("target") is not None and described(fake) == 1
    others = [fleet.host() for _ in range(5)]
    for h in others:
        assert h.settings("target") is not None
    assert described(fake) == 2
    assert fleet.posted().asked_ms == T0, "the answer the others can date"
    fleet.store.post(fleet.key(), fleet.store.get_posted(fleet.key()), Posted(turn_until_ms=T0 + 600_000).encode(), 0)
    late = fleet.host()
    assert late.settings("target") is not None and described(fake) == 3, "a turn from the future is free"


def test_a_host_whose_clock_is_behind_by_the_bound_acts_on_an_answer_at_most_the_bound_older(
    fake: FakeAws, tmp_path: Path
) -> None:
    """Answers are dated by the clock of the host that asked: one whose clock is behind by
    ``copier.clockSkewMillis`` takes an answer for that much younger than it is, and no more (the assumption
    docs/protocol.md states: a host further off is outside the bound the lease protocol relies on too)."""
    fleet = Fleet(fake, tmp_path)
    assert fleet.host().settings("target") is not None
    asked = fleet.posted()
    assert asked.expires_ms is not None
    fleet.now_ms = asked.expires_ms + SKEW  # stale on the fleet's clock; within the expiry on one behind by SKEW
    behind = fleet.host(off_ms=-SKEW)
    assert behind.settings("target") is not None and described(fake) == 1
    held = behind.summaries.held("target")
    assert held is not None and held.fetched_s is not None and held.expires_s is not None
    now_s = 50.0
    true_age_s = (fleet.now_ms - T0) / 1000
    assert true_age_s - (now_s - held.fetched_s) == SKEW / 1000, "younger by the clock difference, no more"
    assert held.expires_s - held.fetched_s <= SUMMARY_MAX_AGE_S
    fleet.now_ms += 1
    assert fleet.host(off_ms=-SKEW).settings("target") is not None and described(fake) == 2, "past it: asked"


def test_a_turn_never_given_back_holds_the_others_off_for_one_turn_only(fake: FakeAws, tmp_path: Path) -> None:
    """A host took the turn and died before answering: a host with an answer goes on with it, looking again a
    second later, without calling; once the turn has run out, one of them asks."""
    fleet = Fleet(fake, tmp_path)
    hosts = [fleet.host() for _ in range(3)]
    for h in hosts:
        assert h.settings("target") is not None
    assert described(fake) == 1
    fleet.now_ms += MAX_AGE_MS + 1
    item = fleet.store.get_posted(fleet.key())
    dead = replace(fleet.posted(), turn_until_ms=fleet.now_ms + TURN_MS)
    fleet.store.post(fleet.key(), item, dead.encode(), fleet.now_ms + ITEM_LIFE_MS)
    for _ in range(TURN_MS // 1000 - 1):
        for h in hosts:
            assert h.settings("target") is not None, "the stale answer, not a wait"
        fleet.now_ms += 1000
    assert described(fake) == 1 and fleet.slept == []
    fleet.now_ms += 1000
    for h in hosts:
        assert h.settings("target") is not None
    assert described(fake) == 2


def test_a_host_with_no_answer_waits_for_the_one_asking_then_takes_its_answer(fake: FakeAws, tmp_path: Path) -> None:
    """A host just started has nothing to go on (the target might be AUTO under ordering = partitionKey): it
    looks at the item every second up to FIRST_ANSWER_WAIT_S, and takes the asker's answer when it comes."""
    fleet = Fleet(fake, tmp_path)
    fleet.store.post(fleet.key(), None, Posted(turn_until_ms=T0 + TURN_MS).encode(), T0 + ITEM_LIFE_MS)
    asker = answered(SETTINGS, T0, 0.0)

    def sleep(seconds: float) -> None:
        fleet.slept.append(seconds)
        fleet.now_ms += int(seconds * 1000)
        if len(fleet.slept) == 3:
            fleet.store.post(fleet.key(), fleet.store.get_posted(fleet.key()), asker.encode(), T0 + ITEM_LIFE_MS)

    fleet._sleep = sleep  # type: ignore[method-assign]
    host = fleet.host()
    assert host.settings("target") == SETTINGS
    assert described(fake) == 0 and fleet.slept == [1.0, 1.0, 1.0]


def test_a_failed_call_is_asked_again_by_one_host_after_the_retry_interval(fake: FakeAws, tmp_path: Path) -> None:
    fake.replies = [json_reply(400, THROTTLED)] + [json_reply(200, SUMMARY) for _ in range(10)]
    fleet = Fleet(fake, tmp_path)
    hosts = [fleet.host() for _ in range(5)]
    assert [h.settings("target") for h in hosts] == [None] * 5, "none waits: each goes on at once"
    assert described(fake) == 1 and fleet.posted().failed_ms == T0
    fleet.now_ms += RETRY_MS
    assert all(h.settings("target") is not None for h in hosts)
    assert described(fake) == 2


class _Broken:
    """A state table that cannot be used (throttled, denied, deleted under the fleet)."""

    def get_posted(self, key: str) -> BoardItem | None:
        raise TransientAwsError("GetItem", "ProvisionedThroughputExceededException", "throttled")

    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        raise AssertionError("not reached")


def test_a_state_table_that_cannot_be_used_leaves_each_host_asking_for_itself(fake: FakeAws, tmp_path: Path) -> None:
    fleet = Fleet(fake, tmp_path)
    hosts = [fleet.host(store=_Broken()) for _ in range(3)]
    assert all(h.settings("target") is not None for h in hosts)
    assert described(fake) == 3


def test_an_item_of_another_format_is_asked_again_and_written_over(fake: FakeAws, tmp_path: Path) -> None:
    fleet = Fleet(fake, tmp_path)
    fleet.store.post(fleet.key(), None, '{"format": 99}', T0 + ITEM_LIFE_MS)
    assert fleet.host().settings("target") is not None and described(fake) == 1
    assert fleet.posted().settings is not None


def test_two_applications_or_targets_in_two_accounts_never_share_an_item(fake: FakeAws, tmp_path: Path) -> None:
    fleet = Fleet(fake, tmp_path)
    other: Config = replace(fleet.config, target_role_arn="arn:aws:iam::123456789012:role/other")
    renamed: Config = replace(fleet.config, application_name="another")
    keys = {board_key(answer_scope(c), "target") for c in (fleet.config, other, renamed)}
    assert len(keys) == 3 and all(k.startswith("#summary/") for k in keys)


def test_a_preflight_takes_a_recent_answer_and_posts_the_one_it_asks_for(fake: FakeAws, tmp_path: Path) -> None:
    """``copier run``'s checks (``StreamSummaries.starting``): one at most SUMMARY_RETRY_S old is taken, the
    processors' first; an older one is asked for and posted, so a fleet starting together asks once."""
    fleet = Fleet(fake, tmp_path)
    first = fleet.host().summaries.starting("target")
    assert described(fake) == 1 and fleet.posted().settings == first
    fleet.now_ms += RETRY_MS - 1000
    assert fleet.host().summaries.starting("target") == first and described(fake) == 1
    fleet.now_ms += 2000
    fleet.host().summaries.starting("target")
    assert described(fake) == 2


# -- the real store -------------------------------------------------------------------------------------------


def test_hosts_of_one_application_share_one_answer_through_the_real_state_table(
    pipeline: Callable[..., object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processors' own clients (``copier process``: lean store and streams) on the local backend: the
    second host takes the first one's answer from the table instead of asking Kinesis."""
    from copier.commands.cli import _processor_clients
    from copier.core.clockcheck import ClockBounds
    from tests.support.backend import DUMMY_ENV

    for name, value in DUMMY_ENV.items():
        monkeypatch.setenv(name, value)
    config = load_config(pipeline.properties)  # type: ignore[attr-defined]
    asked: list[str] = []
    hosts = []
    for _ in range(2):
        _store, streams = _processor_clients(config, ClockBounds(), shared=True)
        ask = streams.summaries._ask_now
        streams.summaries._ask_now = lambda stream, ask=ask: (asked.append(stream), ask(stream))[1]
        hosts.append(streams)
    first, second = (h.settings(config.target_stream_name) for h in hosts)
    assert first is not None and first == second
    assert asked == [config.target_stream_name]


# -- found in review ------------------------------------------------------------------------------------------

LOWERED = {"StreamDescriptionSummary": {"RetentionPeriodHours": 24, "MaxRecordSizeInKiB": 1024, "OpenShardCount": 1}}


def test_a_refused_put_reads_the_limit_now_whatever_the_application_holds(fake: FakeAws, tmp_path: Path) -> None:
    """A put was refused (``ShardSession.settings(now=True)``: ``describe(keep=True)``): the limit may have been
    lowered since any answer, the application's of 10 s ago too. The processor asks Kinesis now and keeps that
    answer; taking the application's instead re-planned the refused record under the old limit, and the shard
    retried it until that answer was 30 s old."""
    fleet = Fleet(fake, tmp_path)
    first = fleet.host().settings("target")
    assert first is not None and first.max_record_bytes == 2048 * 1024 and described(fake) == 1
    fake.replies = [json_reply(200, LOWERED) for _ in range(10)]
    fleet.now_ms += 10_000
    refused = fleet.host()
    assert refused.describe("target", keep=True).max_record_bytes == 1024 * 1024
    assert described(fake) == 2
    held = refused.summaries.held("target")
    assert held is not None and held.settings is not None and held.settings.max_record_bytes == 1024 * 1024


def test_a_refreshing_host_looks_at_the_item_once_a_second_while_another_host_asks(
    fake: FakeAws, tmp_path: Path
) -> None:
    """A processor that wants an answer at most 30 s old (a setting stops it, or records suggest a switch) asks
    at every chunk. While another host holds the turn it goes on with its answer and looks at the item again a
    second later, not at every chunk: a GetItem a chunk was a busy loop for as long as the turn ran."""
    fleet = Fleet(fake, tmp_path)
    host = fleet.host()
    assert host.settings("target") is not None
    fleet.now_ms += RETRY_MS + 1000  # older than a refresh accepts, fresh otherwise
    busy = replace(fleet.posted(), turn_until_ms=fleet.now_ms + TURN_MS)
    fleet.store.post(fleet.key(), fleet.store.get_posted(fleet.key()), busy.encode(), fleet.now_ms + ITEM_LIFE_MS)
    reads = fleet.store.posted_reads
    for _ in range(20):
        assert host.settings("target", refresh=True) is not None
    assert fleet.store.posted_reads - reads == 1
    fleet.now_ms += 1000
    assert host.settings("target", refresh=True) is not None
    assert fleet.store.posted_reads - reads == 2
    assert described(fake) == 1 and fleet.slept == []


def test_a_preflight_whose_call_fails_says_so_without_asking_again(fake: FakeAws, tmp_path: Path) -> None:
    """``copier run``'s checks take the turn and ask; the call is throttled. The failure is posted (every host
    held back 30 s) and goes up to the check (a warning, the start goes on), instead of the check asking again at
    once: the throttled account asked twice by every host starting."""
    fake.replies = [json_reply(400, THROTTLED)] + [json_reply(200, SUMMARY) for _ in range(10)]
    fleet = Fleet(fake, tmp_path)
    with pytest.raises(TransientAwsError):
        fleet.host().summaries.starting("target")
    assert described(fake) == 1 and fleet.posted().failed_ms == T0


class _Racing(InMemoryStateStore):
    """The state table, where another host writes the item between this host's read and its write (once)."""

    def __init__(self) -> None:
        super().__init__()
        self.before_post: Callable[[], None] | None = None

    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        hook, self.before_post = self.before_post, None
        if hook is not None:
            hook()
        return super().post(key, seen, text, expires_ms)


def test_a_host_with_an_answer_that_loses_the_turn_to_another_goes_on_at_once(fake: FakeAws, tmp_path: Path) -> None:
    """Two hosts find the answer stale together; the other one's conditional write comes first. This host reads
    the item again at once and goes on with its answer while the other asks: it never sleeps in a chunk."""
    store = _Racing()
    fleet = Fleet(fake, tmp_path, store)
    host = fleet.host()
    assert host.settings("target") is not None
    fleet.now_ms += MAX_AGE_MS + 1

    def other_takes_the_turn() -> None:
        turn = replace(fleet.posted(), turn_until_ms=fleet.now_ms + TURN_MS)
        store.post(fleet.key(), store.get_posted(fleet.key()), turn.encode(), fleet.now_ms + ITEM_LIFE_MS)

    store.before_post = other_takes_the_turn
    assert host.settings("target") is not None
    assert fleet.slept == [] and described(fake) == 1


def test_an_answer_whose_life_leaves_no_room_for_a_hosts_spread_is_not_trusted() -> None:
    """A host's copy lives up to HOST_SPREAD_MS past the answer's expiry: an item whose expiry is further than
    SUMMARY_MAX_AGE_S less that from its asking (another writer's, of the same format) would be acted on past
    the longest age the docs promise, so it is asked again."""
    posted = replace(answered(SETTINGS, T0, 0.0), expires_ms=T0 + MAX_AGE_MS)
    copy = host_answer(posted, T0, 100.0, 0.999) if posted_fresh(posted, T0, MAX_AGE_MS, SKEW) else None
    assert copy is None, f"a copy acted on for {copy.expires_s - 100.0 if copy and copy.expires_s else 0} s"
    assert posted_fresh(answered(SETTINGS, T0, 0.0), T0, MAX_AGE_MS, SKEW)
