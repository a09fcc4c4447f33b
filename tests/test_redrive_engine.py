"""The redrive's rule (``copier.core.redrive``) and the per-shard protocol driving it (``copier.shard.source``), in
process on the fakes of ``copier.testing``: what a run sends of each dead-letter record, and, as a property, that
runs with any selections, killed or fenced anywhere, send each event once."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from copier.commands.redrive import PREFIX, RedriveRun, source_config
from copier.core.audittypes import content_name
from copier.core.config import Config, parse_dedup_key
from copier.core.errors import AmbiguousPutError
from copier.core.identity import id_digest
from copier.core.plan import PlanSettings, SourceRecord, dead_letter_envelope
from copier.core.positions import Position
from copier.core.redrive import RedriveRule, Selection, letter_digest
from copier.core.state import ShardState
from copier.core.window import DedupWindow
from copier.shard.source import SourceShard
from copier.testing import FakeClock, InMemoryStreams
from tests.support.fakes import CrashingStore, SimulatedCrash, StallingStreams, config
from tests.support.readers import FakeReader

SHARD = "shardId-000000000000"
T0 = 1_700_000_000_000
LIMIT = 300  # the fake target's record limit in these tests (bytes): an "oversize" event is over it
STAGING = PlanSettings(parse_dedup_key("json:eventId"), "deadletter", "dlq", "staging", SHARD, "target")
TRUNCATING = PlanSettings(
    parse_dedup_key("json:eventId"), "deadletter", "dlq", "staging", SHARD, "target", dead_letter_max_bytes=200
)


def letter(
    seq: int,
    event_id: str | None,
    reason: str = "no event ID: payload is not JSON",
    *,
    staging_seq: int | None = None,
    pk: str | None = None,
    size: int = 0,
    body: str = "x",
    truncate: bool = False,
    arrival: int = T0,
) -> SourceRecord:
    """A dead-letter record as copier writes it: the envelope of a staging record (at ``staging_seq``)."""
    if event_id is None:
        data = f"raw {body}".encode()
    else:
        data = json.dumps({"eventId": event_id, "pad": "p" * size}).encode()
    key = pk if pk is not None else (event_id or "u")
    original = SourceRecord(Position(seq if staging_seq is None else staging_seq), key, data, arrival)
    envelope = dead_letter_envelope(TRUNCATING if truncate else STAGING, original, reason)
    return SourceRecord(Position(seq), key, envelope, arrival + 10)


def oversize(seq: int, event_id: str, size: int = 400, arrival: int = T0) -> SourceRecord:
    reason = "record of 420 bytes exceeds the target's limit of 300 bytes"
    return letter(seq, event_id, reason, size=size, arrival=arrival)


def original_of(record: SourceRecord) -> bytes:
    from copier.core.envelope import read_envelope_bytes

    found = read_envelope_bytes(record.data).data
    assert found is not None
    return found


def plan_settings(limit: int = LIMIT) -> PlanSettings:
    return PlanSettings(parse_dedup_key("json:eventId"), "forward", None, "dlq", SHARD, "target", limit)


def plan(
    rule: RedriveRule, records: list[SourceRecord], state: ShardState | None = None, window: DedupWindow | None = None
) -> list[SourceRecord]:
    """The records the rule sends, as the target gets them (key, bytes)."""
    window = DedupWindow(3_600_000, 1000) if window is None else window
    planned = rule(records, state or ShardState(), window, plan_settings())
    window.add(planned.keyed_digests + planned.dead_ids, planned.arrival_max_ms)
    return [SourceRecord(o.position, o.partition_key, o.data) for o in planned.send]


def test_two_dead_letter_records_of_one_event_are_sent_once_in_a_chunk_and_across_chunks() -> None:
    rule = RedriveRule(Selection())
    window = DedupWindow(3_600_000, 1000)
    first = plan(rule, [oversize(1, "e", size=10), oversize(2, "e", size=10)], window=window)
    later = plan(rule, [oversize(3, "e", size=10)], window=window)
    assert [r.position for r in first] == [Position(1)] and later == []
    assert rule.tally.already == 2


def test_identical_records_without_an_id_are_two_events_each_sent() -> None:
    """Their envelopes name two staging positions: two records, both sent, though their bytes are the same."""
    rule = RedriveRule(Selection())
    window = DedupWindow(3_600_000, 1000)
    sent = plan(rule, [letter(1, None, body="same"), letter(2, None, body="same")], window=window)
    assert [r.data for r in sent] == [b"raw same", b"raw same"]
    assert plan(rule, [letter(1, None, body="same"), letter(2, None, body="same")], window=window) == []


def test_two_identical_envelopes_are_one_record_sent_once_in_a_chunk_as_across_chunks() -> None:
    """A frozen processor's late copy of a dead-letter put leaves the same envelope twice (the live copier reports
    it): one record, whose own digest the chunk checks against the records before it as well as the window (before,
    both went out when they fell in one chunk, a copy no report names)."""
    twins = [letter(1, None, body="same", staging_seq=5), letter(2, None, body="same", staging_seq=5)]
    assert twins[0].data == twins[1].data
    rule = RedriveRule(Selection())
    assert [r.position for r in plan(rule, twins)] == [Position(1)]
    assert rule.tally.already == 1
    apart = RedriveRule(Selection())
    window = DedupWindow(3_600_000, 1000)
    assert [r.position for r in plan(apart, twins[:1], window=window) + plan(apart, twins[1:], window=window)] == [
        Position(1)
    ]


def test_a_selection_takes_records_by_reason_arrival_and_staging_shard() -> None:
    records = [
        letter(1, None, arrival=T0),
        oversize(2, "big", arrival=T0 + 100),
        letter(3, "k", "partition key is empty", pk="", arrival=T0 + 200),
    ]
    assert [r.position.seq for r in plan(RedriveRule(Selection(reasons=frozenset({"no_id"}))), records)] == [1]
    timed = RedriveRule(Selection(since_ms=T0 + 50, until_ms=T0 + 150))
    assert plan(timed, records) == [] and timed.tally.selected == 1  # big: selected, fails again (400 > 300)
    assert plan(RedriveRule(Selection(shards=frozenset({"shardId-000000000009"}))), records) == []


def test_an_event_still_over_the_limit_or_under_a_refused_key_fails_again_and_is_not_remembered() -> None:
    rule = RedriveRule(Selection())
    window = DedupWindow(3_600_000, 1000)
    assert plan(rule, [oversize(1, "big"), letter(2, "k", "partition key is empty", pk="")], window=window) == []
    assert [m.why.split(":")[0] for m in rule.tally.failed_again] == ["fails again", "fails again"]
    assert "over the target's limit of 300" in rule.tally.failed_again[0].why
    assert id_digest("big") not in window, "a later run (after the limit is raised) can still send it"


def test_an_envelope_without_its_bytes_is_sent_from_staging_or_reported_not_redrivable() -> None:
    records = [letter(n, e, truncate=True, size=150) for n, e in ((1, "a"), (2, "b"), (3, "c"))]
    rule = RedriveRule(Selection())
    original = json.dumps({"eventId": "a", "pad": "p" * 150}).encode()
    rule.payloads = {Position(1): original, Position(2): b"other bytes", Position(3): None}
    sent = plan(rule, records)
    assert [r.data for r in sent] == [original]
    assert [m.event_id for m in rule.tally.not_redrivable] == [None, None]
    assert all("SHA-256" in m.why for m in rule.tally.not_redrivable)


def test_a_record_of_the_redo_set_is_sent_whatever_the_selection_though_its_event_is_in_the_window() -> None:
    """A killed run's chunk, verified by the next run: what it did not find is sent once, whatever this run selects
    (the run that recorded it had selected it); the other record of the same event is not."""
    first = oversize(1, "e", size=10)
    window = DedupWindow(3_600_000, 1000)
    window.add([id_digest("e"), letter_digest(first.partition_key, first.data)], T0)
    state = ShardState(redo_last=Position(1), redo_digests=(letter_digest(first.partition_key, first.data),))
    rule = RedriveRule(Selection(reasons=frozenset({"no_id"})))
    planned = rule([first, oversize(2, "e", size=10)], state, window, plan_settings())
    assert [o.position for o in planned.send] == [Position(1)] and planned.redo is None
    assert rule.tally.resumed == 1


# -- the per-shard protocol on the fakes ------------------------------------------------------------------------


@dataclass
class DeadLetterWorld:
    """A dead-letter stream's shard and a target on the fakes; runs of ``copier redrive``'s engine over them."""

    letters: list[SourceRecord]
    clock: FakeClock = field(default_factory=FakeClock)
    runs: int = 0

    def __post_init__(self) -> None:
        self.store = CrashingStore(self.clock)
        self.streams = StallingStreams(self.clock, {"target": 2}, max_record_bytes={"target": LIMIT}, stall_after=3)
        self.config: Config = source_config(config(deadLetterStreamName="dlq"))

    def shard(self, selection: Selection, chunk: int = 10_000) -> tuple[SourceShard, RedriveRule]:
        self.runs += 1
        rule = RedriveRule(selection)
        shard = SourceShard(
            self.config,
            self.store,
            self.streams,
            PREFIX,
            rule,
            clock=self.clock,
            owner=f"run-{self.runs}",
            chunk_events=chunk,
            replanning=False,
        )
        return shard, rule

    def run(self, selection: Selection = Selection(), page: int = 3, chunk: int = 10_000) -> SourceShard:
        """One run over every dead-letter record, a page at a time, to its end or until fenced."""
        shard, rule = self.shard(selection, chunk)
        if not shard.start(SHARD):
            return shard
        for i in range(0, len(self.letters), page):
            shard.forward(self.letters[i : i + page])
            if shard.fenced:
                return shard
        shard.finish()
        return shard

    def target(self) -> Counter[bytes]:
        return Counter(self.streams.data("target"))


def test_a_run_killed_mid_put_is_verified_by_the_next_which_sends_only_what_is_missing() -> None:
    letters = [oversize(n, f"e{n}", size=10) for n in range(1, 7)] + [letter(7, None, body="u")]
    world = DeadLetterWorld(letters)
    landed = [True, False, True, True, False, True, True]
    world.streams.fault = lambda s, e: (landed[: len(e)], SimulatedCrash("mid put"))
    try:
        world.run(page=10)
    except SimulatedCrash:
        pass
    world.streams.fault = lambda s, e: ([True] * len(e), None)
    with capture_logs() as logs:
        world.run(page=10)
    counts = world.target()
    assert all(counts[original_of(r)] == 1 for r in letters[:6]), counts
    assert counts[b"raw u"] == 2  # sent again: a record without an ID cannot be told from an identical one
    reported = [e for e in logs if e["event"] == "possible_duplicates"]
    assert reported and reported[0]["unkeyed_digests"] == [content_name("u", b"raw u")]
    verified = next(e for e in logs if e["event"] == "verified_pending")
    assert verified["landed"] == 4 and verified["to_redo"] == 3


def test_a_second_run_fences_the_first_and_finishes_what_it_left_in_flight() -> None:
    letters = [oversize(n, f"e{n}", size=10) for n in range(1, 10)]
    world = DeadLetterWorld(letters)
    rival: list[SourceShard] = []

    def hook(phase: str, call: str) -> bool:
        if call == "put_batch" and phase == "after":  # the first run's chunk is recorded, not put
            world.store.crash_hook = lambda p, c: False
            rival.append(world.run())  # announces itself, waits out the first run's lease, takes over, finishes
        return False

    world.store.crash_hook = hook
    first = world.run(page=3)
    assert first.fenced and rival and not rival[0].fenced
    assert world.target() == Counter(original_of(r) for r in letters)


def test_a_window_loads_every_batch_though_runs_sent_old_records_after_new_ones() -> None:
    """A redrive's digest batches are in no arrival order: a run that sends an old record (another selection)
    writes a high index with an old arrival. The next run's window holds every committed batch; before, the load
    stopped at the first batch a horizon older than the highest index's and never saw the ones below it, so a
    record they held was sent again."""
    hour = 3_600_000
    old = oversize(1, "e1", size=10)
    middle = oversize(2, "e2", size=10, arrival=T0 + 23 * hour)
    new = oversize(3, "e3", size=10, arrival=T0 + 26 * hour)
    world = DeadLetterWorld([old, middle, new])
    world.config = replace(world.config, dedup_window_seconds=25 * 3600)  # a horizon of 25 h, as for 24 h retention
    world.run(Selection(since_ms=T0 + 22 * hour, until_ms=T0 + 24 * hour), page=1, chunk=1)  # batch 1: e2, at 23 h
    world.run(Selection(until_ms=T0 + hour), page=1, chunk=1)  # batch 2: e1, at 0 h
    world.run(Selection(since_ms=T0 + 25 * hour), page=1, chunk=1)  # batch 3: e3, at 26 h
    shard, _ = world.shard(Selection())
    assert shard.start(SHARD)
    shard.forward([middle, new])  # what the dead-letter stream still holds: e1's record expired
    shard.finish()
    assert world.target() == Counter(original_of(r) for r in (old, middle, new))


@dataclass
class ReshardedDeadLetters:
    """A dead-letter stream split after a record of event 7 (and three others) reached its one shard; a producer
    retry of event 7, dead-lettered too, then reached a child. ``copier redrive``'s runs over it, in process."""

    clock: FakeClock = field(default_factory=FakeClock)

    def __post_init__(self) -> None:
        self.store = CrashingStore(self.clock)
        self.streams = InMemoryStreams(self.clock, {"target": 1}, max_record_bytes={"target": LIMIT})
        self.config = config(deadLetterStreamName="dlq")
        for n in (1, 2, 3):
            self.dead_letter(oversize(n, f"other-{n}", size=10, arrival=self.clock.now_ms()))
        self.first = self.dead_letter(oversize(4, "e7", size=10, arrival=self.clock.now_ms()))
        self.children = self.streams.split("dlq", SHARD)
        self.clock.advance(2 * 3_600_000)
        self.retry = self.dead_letter(oversize(20, "e7", size=10, arrival=self.clock.now_ms()))

    def dead_letter(self, record: SourceRecord) -> SourceRecord:
        self.streams.put_records("dlq", [(record.partition_key, record.data)])
        self.clock.advance(1000)
        return record

    def run(self, name: str, selection: Selection = Selection()) -> RedriveRun:
        def shard(*args: Any, **kwargs: Any) -> SourceShard:
            return SourceShard(*args, clock=self.clock, owner=name, chunk_events=1, **kwargs)

        run = RedriveRun(self.config, selection, self.store, self.streams, FakeReader(self.streams), make_shard=shard)
        run.run()
        return run

    def target(self) -> Counter[str]:
        return Counter(json.loads(d)["eventId"] for d in self.streams.data("target"))


def test_a_record_a_child_shard_sent_is_known_when_its_parent_is_read_later() -> None:
    """Event 7 has a dead-letter record on the parent and a later one on a child. A run selecting only the later
    one sends it from the child; the next run, selecting everything, reads the parent first: its window holds
    what every shard of the stream sent, so event 7 is not sent again (before, a shard's window held its own and
    its ancestors' only, and the parent's record went out: a duplicate)."""
    world = ReshardedDeadLetters()
    assert world.retry.arrival_ms > world.first.arrival_ms
    world.run("run-1", Selection(since_ms=world.first.arrival_ms + 3_600_000))  # the retry's original only
    assert world.target() == Counter({"e7": 1})
    second = world.run("run-2")
    assert world.target() == Counter({"e7": 1, "other-1": 1, "other-2": 1, "other-3": 1})
    assert second.tally.already == 2  # the parent's record of event 7 (its ID), the child's (its own digest)


def test_a_run_fenced_on_a_shard_goes_on_to_no_other_and_two_runs_never_send_at_once() -> None:
    """A second run starts while the first has sent one record of the parent: it takes every shard over (the
    first is fenced at its next write), loads its windows only then, and sends the rest. The first stops where it
    was fenced, its remaining shards left to the second (before, a run fenced on a parent went on to its children
    with a window loaded from the parent as it had left it, while the other run sent from the parent)."""
    world = ReshardedDeadLetters()
    rival: list[RedriveRun] = []

    def hook(phase: str, call: str) -> bool:
        if (phase, call) == ("after", "write") and not rival and world.streams.data("target"):
            world.store.crash_hook = lambda p, c: False
            rival.append(world.run("run-B"))
        return False

    world.store.crash_hook = hook
    first = world.run("run-A")
    assert rival and rival[0].exit_status() == 0
    assert [o.taken_over for o in first.shards] == [True, True, True]
    assert first.exit_status() == 1 and "taken over by another redrive" in "\n".join(first.summary())
    assert world.target() == Counter({"e7": 1, "other-1": 1, "other-2": 1, "other-3": 1})
    for shard in world.children:
        state = world.store.get(PREFIX + "dlq/" + shard)
        assert state is not None and state.owner == "run-B", "the fenced run took no shard back"


def test_a_retention_raised_after_a_run_keeps_what_it_sent_known() -> None:
    """A run sends everything while the dead-letter stream keeps records a day; the operator then raises the
    retention to a week (as check-config advises), and the records stay readable. A run 60 hours later sends
    nothing again: the first run's digest batches outlive any retention the stream can be given (before, they
    expired two days and two hours after their newest record, and every record went out a second time)."""
    world = ReshardedDeadLetters()
    world.run("run-1")
    everything = Counter({"e7": 1, "other-1": 1, "other-2": 1, "other-3": 1})
    assert world.target() == everything
    world.streams.retention_ms["dlq"] = 7 * 24 * 3_600_000  # IncreaseStreamRetentionPeriod
    world.clock.advance(60 * 3_600_000)
    again = world.run("run-2")
    assert sum(again.tally.sent.values()) == 0 and world.target() == everything


# -- the property -----------------------------------------------------------------------------------------------

REASONS = ["no_id", "oversize", "key"]


@st.composite
def dead_letters(draw: st.DrawFn) -> tuple[list[SourceRecord], dict[Position, bytes | None]]:
    """Letters of keyed events (some dead-lettered twice), records without an ID (some identical), events that
    fail again (over the limit, a refused key), and envelopes without their bytes (in staging or not)."""
    out: list[SourceRecord] = []
    payloads: dict[Position, bytes | None] = {}
    for n in range(draw(st.integers(1, 12))):
        seq = n + 1
        kind = draw(st.sampled_from(["keyed", "keyed", "unkeyed", "unkeyed", "too_large", "bad_key", "truncated"]))
        arrival = T0 + draw(st.integers(0, 5)) * 1000
        event_id = f"e{draw(st.integers(0, 4))}"
        if kind == "keyed":
            out.append(oversize(seq, event_id, size=10, arrival=arrival))
        elif kind == "unkeyed":
            out.append(letter(seq, None, body=str(draw(st.integers(0, 2))), arrival=arrival))
        elif kind == "too_large":
            out.append(oversize(seq, f"big{n}", arrival=arrival))
        elif kind == "bad_key":
            out.append(letter(seq, f"k{n}", "partition key is empty", pk="", arrival=arrival))
        else:
            record = letter(seq, event_id, truncate=True, size=150, arrival=arrival)
            out.append(record)
            kept = draw(st.booleans())
            payloads[record.position] = json.dumps({"eventId": event_id, "pad": "p" * 150}).encode() if kept else None
    return out, payloads


def _sendable(record: SourceRecord, payloads: dict[Position, bytes | None]) -> bytes | None:
    from copier.core.envelope import read_envelope_bytes

    envelope = read_envelope_bytes(record.data)
    data = envelope.data if envelope.data is not None else payloads.get(record.position)
    if data is None or (envelope.sha256 and hashlib.sha256(data).hexdigest() != envelope.sha256):
        return None
    if not envelope.partition_key or len(envelope.partition_key) + len(data) > LIMIT:
        return None
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), dead_letters())
def test_runs_with_any_selections_killed_or_fenced_anywhere_send_each_event_once(
    data: st.DataObject, drawn: tuple[list[SourceRecord], dict[Position, bytes | None]]
) -> None:
    """Whatever runs were made (each with its selection, page and chunk size, and a fault: a crash before or after
    its digest batch or its commit, mid-put with any entries landed, an ambiguous put, a rival run that takes the
    shard over once a chunk is recorded), and a last run with no selection: each keyed event that can be sent is in
    the target once, each record without an ID at least once with every further copy reported, nothing that fails
    again or cannot be read back is, and nothing was ever put to the dead-letter stream."""
    letters, payloads = drawn
    world = DeadLetterWorld(letters)
    with capture_logs() as logs:
        for n in range(data.draw(st.integers(0, 3), label="runs before the last")):
            reasons = frozenset(data.draw(st.sets(st.sampled_from(REASONS)), label=f"run {n} reasons"))
            since = data.draw(st.sampled_from([None, T0 + 2000]), label=f"run {n} since")
            _one_run(world, data, payloads, Selection(since_ms=since, reasons=reasons), n)
        world.store.crash_hook = lambda p, c: False
        world.streams.fault = lambda s, e: ([True] * len(e), None)
        last = _last_run(world, payloads)
        assert not last.fenced
    expected_keyed: dict[str, bytes] = {}
    expected_unkeyed: Counter[bytes] = Counter()
    for record in letters:
        sendable = _sendable(record, payloads)
        if sendable is None:
            continue
        try:
            expected_keyed.setdefault(json.loads(sendable)["eventId"], sendable)
        except ValueError:
            expected_unkeyed[sendable] += 1
    target = world.target()
    keyed = Counter(json.loads(d)["eventId"] for d in target.elements() if d.startswith(b"{"))
    assert keyed == Counter(set(expected_keyed)), (keyed, expected_keyed)
    unkeyed = Counter(d for d in target.elements() if not d.startswith(b"{"))
    reported = Counter(n for e in logs if e["event"] == "possible_duplicates" for n in e.get("unkeyed_digests", []))
    for body, wanted in expected_unkeyed.items():
        assert unkeyed[body] >= wanted, (body, unkeyed, expected_unkeyed)
        assert unkeyed[body] - wanted <= reported[content_name(body_key(letters, body), body)], (body, reported)
    assert not world.streams.data("dlq")


def body_key(letters: list[SourceRecord], body: bytes) -> str:
    return next(r.partition_key for r in letters if original_of_or_none(r) == body)


def original_of_or_none(record: SourceRecord) -> bytes | None:
    from copier.core.envelope import read_envelope_bytes

    return read_envelope_bytes(record.data).data


def _last_run(world: DeadLetterWorld, payloads: dict[Position, bytes | None]) -> SourceShard:
    shard, rule = world.shard(Selection())
    rule.payloads = payloads
    assert shard.start(SHARD)
    shard.forward(world.letters)
    shard.finish()
    return shard


def _one_run(
    world: DeadLetterWorld, data: st.DataObject, payloads: dict[Position, bytes | None], selection: Selection, n: int
) -> None:
    fault = data.draw(
        st.sampled_from(["none", "crash_store", "crash_mid_put", "ambiguous", "rival"]), label=f"run {n} fault"
    )
    page = data.draw(st.integers(1, 5), label=f"run {n} page")
    chunk = data.draw(st.integers(1, 4), label=f"run {n} chunk")
    mask = data.draw(st.lists(st.booleans(), min_size=12, max_size=12), label=f"run {n} landed mask")
    phase = data.draw(st.sampled_from(["before", "after"]), label=f"run {n} crash phase")
    call = data.draw(st.sampled_from(["put_batch", "write"]), label=f"run {n} crash at")
    calls = [0]

    def put_fault(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        calls[0] += 1
        if calls[0] > 1 or fault not in ("crash_mid_put", "ambiguous"):
            return [True] * len(entries), None
        error: BaseException = (
            SimulatedCrash("mid put")
            if fault == "crash_mid_put"
            else AmbiguousPutError("PutRecords", "ReadTimeoutError", "injected")
        )
        return mask[: len(entries)], error

    rival_done: list[bool] = []

    def store_hook(p: str, c: str) -> bool:
        if fault == "rival" and c == "put_batch" and p == "after" and not rival_done:
            rival_done.append(True)
            world.store.crash_hook = lambda p2, c2: False
            rival_selection = Selection(reasons=frozenset(data.draw(st.sets(st.sampled_from(REASONS)), label="rival")))
            shard, rule = world.shard(rival_selection, chunk)
            rule.payloads = payloads
            if shard.start(SHARD):
                shard.forward(world.letters)
                shard.finish()
            return False
        return fault == "crash_store" and p == phase and c == call

    world.streams.fault = put_fault
    world.store.crash_hook = store_hook
    shard, rule = world.shard(selection, chunk)
    rule.payloads = payloads
    try:
        if shard.start(SHARD):
            for i in range(0, len(world.letters), page):
                shard.forward(world.letters[i : i + page])
                if shard.fenced:
                    break
            else:
                shard.finish()
    except SimulatedCrash:
        world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis + 1)
    finally:
        world.store.crash_hook = lambda p, c: False
        world.streams.fault = lambda s, e: ([True] * len(e), None)


def test_the_audit_counts_a_redriven_events_target_copy_not_its_dead_letter_record() -> None:
    """After a redrive an event is in the dead-letter stream and the target: the record the redrive names (by its
    own digest, or the event's ID) is no copy of its own; without the names both count, a duplicate."""
    from copier.core.audit import audit
    from copier.core.audittypes import DeadLetter, TargetRecord, digest_name

    dead = DeadLetter(
        "d0", "7", 5, reason="record of 2000000 bytes exceeds the target's limit", event_id="e", content="c" * 20
    )
    unkeyed = DeadLetter("d0", "8", 5, reason="no event ID: payload is not JSON", partition_key="u", content="ab" * 10)
    target = [TargetRecord("e", "e", "t0", "1", None, 9), TargetRecord(None, "u", "t0", "2", None, 9, "x" * 20)]
    produced = ["e"]
    assert audit(produced, target[:1], [dead]).duplicated == 1
    report = audit(produced, target[:1], [dead, unkeyed], redriven={digest_name(id_digest("e")), "ab" * 10})
    assert report.ok and report.duplicated == 0 and report.redriven == 2 and report.dead_lettered == 0
    assert audit(produced, [], [dead], redriven={"c" * 20}).lost == 1, "redriven, and not in the target: lost"


def test_source_metrics_say_a_run_is_at_work_on_a_shard_and_what_it_sent() -> None:
    from copier.adapters.sourcemetrics import SourceMetrics

    sent: list[tuple[str, dict[str, tuple[float, str]]]] = []

    class Emitter:
        def emit(
            self, shard_id: str, values: dict[str, tuple[float, str]], retries: object, properties: object = None
        ) -> None:
            sent.append((shard_id, values))

    now = [0.0]
    metrics = SourceMetrics(Emitter(), "Redrive", 60, clock=lambda: now[0])
    metrics.sent(SHARD, 5)
    metrics.sent(SHARD, 3)  # within the interval: added up
    now[0] = 61
    metrics.sent(SHARD, 2, done=True)
    assert sent == [
        ("redrive:" + SHARD, {"RedriveInProgress": (1.0, "None"), "EventsRedriven": (5.0, "Count")}),
        ("redrive:" + SHARD, {"RedriveInProgress": (0.0, "None"), "EventsRedriven": (5.0, "Count")}),
    ]


def test_an_envelopes_bytes_are_read_back_through_a_throttle_and_only_a_record_gone_is_not_redrivable() -> None:
    """Staging throttles the read (the local backend never does: a stub injects it): read again, not reported
    as not redrivable; a shard gone with the retention, or a position past the trim horizon, is."""
    from copier.commands.redrive import RedriveRun
    from copier.core.errors import FatalAwsError, TransientAwsError

    record = SourceRecord(Position(7), "k", b"the bytes")
    answers: list[object] = []

    class Staging:
        def read_source(self, stream: str, shard_id: str, first: Position, last: Position) -> object:
            answer = answers.pop(0)
            if isinstance(answer, BaseException):
                raise answer
            return iter([[answer]])

    run = RedriveRun(config(deadLetterStreamName="dlq", maxBackoffMillis=10), Selection(), None, Staging(), None)  # type: ignore[arg-type]
    answers[:] = [TransientAwsError("GetRecords", "ProvisionedThroughputExceededException", "slow down"), record]
    assert run._staged("staging", SHARD, Position(7)) == b"the bytes"
    answers[:] = [TransientAwsError("ListShards", "ShardNotListed", "expired")]
    assert run._staged("staging", SHARD, Position(7)) is None
    answers[:] = [FatalAwsError("GetShardIterator", "InvalidArgumentException", "past the trim horizon")]
    assert run._staged("staging", SHARD, Position(7)) is None
    assert run._staged("another-stream", SHARD, Position(7)) is None


def test_a_run_whose_target_settings_cannot_be_read_sends_nothing_and_says_why() -> None:
    """The target's DescribeStreamSummary fails (throttled): the run does not start, rather than guess the
    target's record limit (before: a record over 1 MiB was said to fail again, under a limit never read)."""
    world = ReshardedDeadLetters()
    world.streams.unreadable.add("target")
    run = RedriveRun(world.config, Selection(), world.store, world.streams, FakeReader(world.streams))
    problem = run.blocked()
    assert problem is not None and "settings cannot be read" in problem
    world.streams.unreadable.discard("target")
    assert run.blocked() is None
