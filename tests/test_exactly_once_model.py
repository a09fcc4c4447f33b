"""Exactly-once of the whole per-shard protocol, under crashes, zombies, put faults and a changing world, as a property.

A ShardWorker runs on the in-memory store and streams of ``copier.testing``;
``tests/support/model.py`` plays the daemon and the world and says what each
drawn fault stands for. Hypothesis draws the events (with producer retries at
any distance, arrival times that span more than the dedup window, records
without an ID, records too large for the target, partition keys Kinesis
refuses), the batches the daemon delivers, the chunk size, whether each
committed position gets checkpointed, and the faults: throttled entries,
ambiguous puts with any subset landed, crashes before or after any state write
or digest batch write or in the middle of a put, frozen writers whose digest
writes land later, owner writes whose unanswered first attempt lands after
their retry, lease races (the owner told that its lease moved, or not) with a
fenced processor holding what it gets, target reshards while a put is ambiguous and stale shard maps refreshed at any
point, outages past the digest TTL and the target's and the staging stream's
retention, verifications slower than the lease with a rival taking over
meanwhile, identical records from another staging shard, and a new
configuration for every new processor (dedup key, unkeyed policy, dead-letter
stream, ordering). Whatever was drawn: every keyed event reaches the target or
the dead-letter stream exactly once (a second copy only where copier reported
it as a possible duplicate, and only where the producer's copies lie within
the dedup window), every event without an ID at least once, nothing stalls
once a dead-letter stream is configured, and nothing ends the process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

import copier.shard.holding
from copier.core.audittypes import content_name
from copier.core.plan import SourceRecord
from tests.support.fakes import SimulatedCrash, World, rec
from tests.support.model import (
    BIG,
    Driver,
    Outcome,
    collect_reports,
    collect_unkeyed,
    event_id_of,
    guaranteed,
    keyed_event,
    original_of,
    unkeyed,
)

SCALE = float(os.environ.get("COPIER_MODEL_SCALE", "1"))  # make model-long runs it 25 times longer
GAPS = st.sampled_from([0, 0, 500, 2_000, 8_000, 30_000])  # ms between two records' arrivals


@pytest.fixture(autouse=True)
def _held_cap_restored() -> object:
    """The model lowers the records a fenced processor holds; put the module's cap back afterwards."""
    cap = copier.shard.holding.MAX_HELD_RECORDS
    yield
    copier.shard.holding.MAX_HELD_RECORDS = cap


def arrivals(data: st.DataObject, n: int, start: int = 1_700_000_000_000) -> list[int]:
    out, at = [], start
    for _ in range(n):
        at += data.draw(GAPS, label="ms to the next arrival")
        out.append(at)
    return out


def run(driver: Driver) -> tuple[Outcome, Counter[str]]:
    """Run the driver, capturing what copier reported."""
    with capture_logs() as logs:
        try:
            outcome = driver.run()
        finally:
            driver.outcome.trace = trace(logs)
    outcome.reported = collect_reports(logs)
    outcome.reported_unkeyed = collect_unkeyed(logs)
    for name in sorted({covered(e) for e in logs} - {""}):
        event(name)  # --hypothesis-show-statistics: how often each situation was drawn
    return outcome, outcome.reported


def covered(entry: dict[str, object]) -> str:
    """The situation a log event shows, for the statistics ("" for routine events)."""
    name = str(entry["event"])
    if name == "verified_pending":
        return "verified a chunk in flight" + (" under other settings" if entry.get("settings_changed") else "")
    if name == "fenced":
        return f"fenced in {entry.get('where')}"
    if name in ("possible_duplicates", "rerouted", "reading_again", "verification_beyond_retention", "took_back"):
        return name
    if name == "replanned":
        return "re-planned a chunk in flight"
    if name == "put_retry" and entry.get("code") == "InternalFailure":
        return "an entry answered InternalFailure"
    if name == "released":
        fenced = " while fenced (cut short)" if entry.get("fenced") else ""
        announced = " under an announced successor" if entry.get("successor") else ""
        return f"released on {entry.get('why')}{fenced}{announced}"
    if name == "waiting_for_lease":
        return "waited for a lease"
    return ""


TRACED = {
    "took_over",
    "took_back",
    "released",
    "verified_pending",
    "fenced",
    "possible_duplicates",
    "rerouted",
    "reading_again",
    "replanned",
    "shard_stalled",
}


def trace(logs: list[dict[str, object]]) -> str:
    """The protocol events of a run, one line each: what a failing example's message shows."""
    keep = (
        "why",
        "epoch",
        "batch",
        "landed",
        "to_redo",
        "unkeyed_resent",
        "redo_until",
        "event_ids",
        "where",
        "reason",
        "code",
        "entries",
    )
    return "\n".join(
        f"{e['event']} " + " ".join(f"{k}={e[k]}" for k in keep if k in e) for e in logs if e["event"] in TRACED
    )


def keyed_counts(outcome: Outcome, records: list[SourceRecord]) -> Counter[str]:
    """Copies of each event ID in the target and the dead-letter stream (by the original bytes, or their hash)."""
    by_sha = {hashlib.sha256(r.data).hexdigest(): r.data for r in records}
    counts: Counter[str] = Counter()
    for payload, n in outcome.copies().items():
        event_id = event_id_of(payload)
        if event_id is None and payload.startswith(b"{") and b"dataSha256" in payload:
            original = by_sha.get(json.loads(payload)["dataSha256"])
            event_id = event_id_of(original) if original is not None else None
        if event_id is not None:
            counts[event_id] += n
    return counts


def check_keyed(outcome: Outcome, records: list[SourceRecord]) -> None:
    """Each keyed event: at least once unless every copy expired unread; at most once plus what copier reported."""
    counts = keyed_counts(outcome, records)
    promised = guaranteed(records)
    copies: Counter[str] = Counter()
    expired: set[str] = set()
    for record in records:
        event_id = event_id_of(record.data)
        if event_id is not None:
            copies[event_id] += 1
            if record.position in outcome.skipped:
                expired.add(event_id)
    assert set(counts) <= set(copies), set(counts) - set(copies)
    for event_id, produced in copies.items():
        if event_id not in expired:
            assert counts[event_id] >= 1, (event_id, "lost", counts, outcome.trace)
        allowed = 1 if event_id in promised else produced
        assert counts[event_id] <= allowed + outcome.reported[event_id], (
            event_id,
            counts[event_id],
            outcome.reported,
            outcome.trace,
        )
    assert outcome.stalls_with_dlq == 0, ("a shard stalled although a dead-letter stream was configured", outcome.trace)


def draw_keyed_records(data: st.DataObject, odd_keys: bool) -> list[SourceRecord]:
    ids = data.draw(st.lists(st.sampled_from("abcdefghijklmnop"), min_size=1, max_size=40), label="event ids")
    times = arrivals(data, len(ids))
    records = []
    for i, (event_id, at) in enumerate(zip(ids, times, strict=True)):
        pk = None
        if odd_keys:
            pk = data.draw(st.sampled_from([None] * 12 + ["", "K" * 300]), label="partition key")
        size = BIG if odd_keys and data.draw(st.integers(0, 40), label="oversize") == 7 else 0
        records.append(keyed_event(10 + i, event_id, at, body=f"copy{i}", pk=pk, size=size))
    return records


@settings(max_examples=int(400 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_event_lands_exactly_once_whatever_fails(data: st.DataObject) -> None:
    """Under any drawn mix of duplicates, chunks, checkpoints, faults, crashes, zombies, reshards, outages and
    configuration changes: each keyed event exactly once, unless copier reported the duplicate."""
    records = draw_keyed_records(data, odd_keys=True)
    driver = Driver(data, records, target_shards=data.draw(st.integers(1, 3), label="target shards"))
    outcome, _ = run(driver)
    check_keyed(outcome, records)


@settings(max_examples=int(150 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_record_limit_lowered_and_raised_while_chunks_are_in_flight_keeps_exactly_once(data: st.DataObject) -> None:
    """Records of 1 MiB and more among small ones; the target's record limit lowered while a chunk is in flight
    (and raised again, or not), the process dying around the re-plan, entries answered InternalFailure written
    or not, a write's first attempt landing late, beside the core faults and configuration changes: each keyed
    event exactly once across the target and the dead-letter stream, and no stall once a dead-letter stream is
    configured."""
    ids = data.draw(st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=24), label="event ids")
    times = arrivals(data, len(ids))
    records = [
        keyed_event(10 + i, e, at, body=f"copy{i}", size=BIG if data.draw(st.integers(0, 2), label="large") else 0)
        for i, (e, at) in enumerate(zip(ids, times, strict=True))
    ]
    lowered = ["limit_lowered"] * 4  # drawn as often as the core faults together
    driver = Driver(data, records, new_faults=[*lowered, "internal_failure", "late_write", "limit_raised"])
    outcome, _ = run(driver)
    check_keyed(outcome, records)


@settings(max_examples=int(200 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_identical_events_without_an_id_are_never_lost(data: st.DataObject) -> None:
    """Records without an event ID, some identical (here and on another staging shard), mixed with keyed ones:
    keyed exactly once, unkeyed at least once, and every copy beyond that named by a possible_duplicates report.

    Identical unkeyed records cannot be told apart in the target, so a
    verification errs towards sending one again, never towards losing one;
    what it sends again it reports first (by content digest), so that an
    audit can tell such a copy from a bug.
    """
    kinds = st.one_of(st.sampled_from("abcdef"), st.sampled_from(["u1", "u2"]))
    drawn = data.draw(st.lists(kinds, min_size=1, max_size=30), label="events")
    times = arrivals(data, len(drawn))
    records = [
        keyed_event(10 + i, k, at) if len(k) == 1 else unkeyed(10 + i, k, at)
        for i, (k, at) in enumerate(zip(drawn, times, strict=True))
    ]
    outcome, _ = run(Driver(data, records, target_shards=data.draw(st.integers(1, 3), label="target shards")))
    check_keyed(outcome, records)
    found = outcome.copies()
    for record in records:
        if event_id_of(record.data) is None and record.position not in outcome.skipped:
            produced = sum(1 for r in records if r.data == record.data and r.position not in outcome.skipped)
            assert found[record.data] >= produced + outcome.others[record.data], (record.data, found, outcome.others)
    check_unkeyed_reported(outcome, records)


def check_unkeyed_reported(outcome: Outcome, records: list[SourceRecord]) -> None:
    """Each record without an ID: no more copies (target and dead-letter stream) than produced, put by other
    shards, and named by reports in any form a copy of it took (as put to the target, or as an envelope)."""
    names: dict[bytes, set[str]] = {}
    for pk, data, _, _ in outcome.world.streams.records.get("target", []):
        names.setdefault(data, set()).add(content_name(pk, data))
    for pk, envelope, _, _ in outcome.world.streams.records.get("dlq", []):
        names.setdefault(original_of(envelope) or envelope, set()).add(content_name(pk, envelope))
    found = outcome.copies()
    for data in {r.data for r in records if event_id_of(r.data) is None}:
        produced = sum(1 for r in records if r.data == data)
        named = sum(outcome.reported_unkeyed[n] for n in names.get(data, ()))
        assert found[data] <= produced + outcome.others[data] + named, (data, found[data], named, outcome.trace)


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


@settings(max_examples=int(300 * SCALE), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_partition_key_keeps_its_staging_order_whatever_fails(data: st.DataObject) -> None:
    """copier.ordering = partitionKey: the first copies of a key's events land in staging order through
    throttling, ambiguous puts, crashes, takeovers, reshards and configuration changes (hot keys: few keys,
    many events each)."""
    keys = data.draw(st.lists(st.sampled_from("KLM"), min_size=1, max_size=40), label="partition keys")
    times = arrivals(data, len(keys))
    records = [keyed_event(10 + i, f"e{i}", at, pk=key) for i, (key, at) in enumerate(zip(keys, times, strict=True))]
    driver = Driver(
        data, records, ordering="partitionKey", target_shards=data.draw(st.integers(1, 3), label="target shards")
    )
    outcome, _ = run(driver)
    check_keyed(outcome, records)
    firsts: dict[str, list[int]] = {}
    seen: set[str] = set()
    for pk, payload, _, _ in driver.world.streams.records.get("target", []):
        event_id = event_id_of(payload)
        if event_id is not None and event_id not in seen:
            seen.add(event_id)
            firsts.setdefault(pk, []).append(int(event_id[1:]))
    for key, order in firsts.items():
        if key != driver.stray_key:  # events written while staging ignored keys: Kinesis kept no order for them
            assert order == sorted(order), (key, order)
