"""The chaos suite's independent check (copier.chaos.check) fails a seed for what it must: it can say no.

Each test writes the target and dead-letter streams by hand through the
local backend, as a faulty copier might have left them, and runs the check
against what a producer wrote (event IDs typed as JSON: 7 and "7" are two
events). Every hole a sceptical review found in the check has a case here.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pytest

from copier.chaos.check import PAGE_RECORDS, Check, check, copier_events, off_their_shard, short_reads
from copier.chaos.producer import Output, Poison, alt_id
from copier.core.audit import Produced
from copier.core.audittypes import content_name
from copier.core.config import load_config, parse_dedup_key
from copier.core.identity import EventValue
from copier.core.limits import MAX_RECORD_BYTES
from copier.core.plan import PlanSettings, SourceRecord, dead_letter_envelope
from copier.core.positions import Position
from copier.core.shardmap import hash_key
from tests.conftest import Pipeline
from tests.support.backend import create_stream

STAGING_SHARD = "shardId-000000000000"
IDS: list[EventValue] = ["e1", "e2", "e3", 7, "7"]  # production order; 7 and "7" are two events
KEYS = {"e1": "k", "e2": "j", "e3": "k", 7: "k", "7": "j"}
REAL_DAEMON_LOG = Path(__file__).parent / "data" / "daemon-worker.log"  # a chaos worker's log, as the daemon wrote it


def body(event_id: EventValue) -> bytes:
    """An event as the producer writes it: the ID, its meta.alt twin, a payload."""
    return json.dumps({"eventId": event_id, "meta": {"alt": alt_id(event_id)}, "body": "x" * 20}).encode()


POISON_BYTES = {"not_json": b"\xff\xfe not json", "no_id": b'{"body": "no ID"}', "oversize": b"\x00" * MAX_RECORD_BYTES}


def produced(poison: Sequence[str] = ()) -> Output:
    """What the producer wrote: each of IDS once, at staging sequence numbers 1.., then poison records."""
    out = Output()
    for n, event_id in enumerate(IDS, 1):
        data = body(event_id)
        out.records.append(
            Produced(event_id, KEYS[event_id], hashlib.sha256(data).hexdigest(), (STAGING_SHARD, n, 0), None, len(data))
        )
    for n, kind in enumerate(poison, 100):
        data, key = POISON_BYTES[kind], f"poison-{kind}"
        sha, size = hashlib.sha256(data).hexdigest(), len(data) + len(key)
        reason = "oversize" if kind == "oversize" else "no_id"
        out.records.append(Produced(None, key, sha, (STAGING_SHARD, n, 0), reason, size))
        out.poison.append(Poison(kind, STAGING_SHARD, str(n), sha, size))
    return out


def record_at(out: Output, what: EventValue) -> SourceRecord:
    """The staging record of an event ID, or of a poison kind ("poison:no_id")."""
    for p in out.records:
        assert p.position is not None and p.partition_key is not None
        kind = p.partition_key.removeprefix("poison-")
        if p.event_id == what or (p.event_id is None and f"poison:{kind}" == what):
            data = POISON_BYTES[kind] if p.event_id is None else body(what)
            return SourceRecord(Position(p.position[1], p.position[2]), p.partition_key, data)
    raise KeyError(what)


def envelope(out: Output, what: EventValue, reason: str = "no event ID: not JSON") -> bytes:
    """The dead-letter envelope copier writes for the record of ``what``."""
    settings = PlanSettings(parse_dedup_key("json:eventId"), "deadletter", "dlq", "staging", STAGING_SHARD)
    return dead_letter_envelope(settings, record_at(out, what), reason)


def judge(
    p: Pipeline,
    target: Sequence[Any],
    dead_letter: Sequence[bytes] = (),
    logs: Sequence[str] = (),
    out: Output | None = None,
    unkeyed_forwarded: bool = False,
    redriven: Collection[str] | None = None,
    **copier: object,
) -> Check:
    """Write ``target`` (event IDs as produced, "poison:<kind>" for a poison record, or (key, bytes) for a
    record of one's own) and ``dead_letter`` (records' bytes), then check them against ``out``."""
    out = out or produced()
    for item in target:
        if isinstance(item, tuple):
            key, data = item
        elif isinstance(item, str) and item.startswith("poison:"):
            key, data = f"poison-{item[7:]}", POISON_BYTES[item[7:]]
        else:
            key, data = KEYS[item], body(item)
        p.kinesis.put_record(StreamName=p.target, PartitionKey=key, Data=data)
    copier["deadLetterStreamName"] = dlq = f"{p.target}-dlq"
    create_stream(p.kinesis, dlq, 1)
    for data in dead_letter:
        p.kinesis.put_record(StreamName=dlq, PartitionKey="k", Data=data)
    log = p.tmp / "worker-1.log"
    log.write_text("".join(f"{line}\n" for line in logs))
    config = load_config(p.write_properties(**copier))
    return check(config, out, [log], unkeyed_forwarded=unkeyed_forwarded, redriven=redriven)


def _report_event(*ids: EventValue, from_ms: int = 0, until_ms: int | None = None) -> dict[str, object]:
    event = {"event": "possible_duplicates", "event_ids": list(ids), "shard": STAGING_SHARD, "batch": 3}
    return event | {"window_from_ms": from_ms, "window_until_ms": until_ms}


def report(*ids: EventValue, from_ms: int = 0, until_ms: int | None = None) -> str:
    """A possible_duplicates line as the daemon writes it (wrapped), naming ``ids``."""
    event = _report_event(*ids, from_ms=from_ms, until_ms=until_ms)
    return (
        "2026-11-23 15:18:08,646 ERROR [multi-lang-daemon-0001] s.a.k.multilang.DrainChildSTDERRTask - "
        f"Received error line from subprocess [{json.dumps(event)}] for shard {STAGING_SHARD}"
    )


ALL = list(IDS)


def keys_on_one_shard(p: Pipeline, n: int) -> list[str]:
    """``n`` partition keys other than the produced ones that the target routes to its first shard."""
    first = p.kinesis.list_shards(StreamName=p.target)["Shards"][0]["HashKeyRange"]
    low, high = int(first["StartingHashKey"]), int(first["EndingHashKey"])
    found = [f"r{i}" for i in range(1000) if low <= hash_key(f"r{i}") <= high]
    return found[:n]


def test_a_clean_target_passes(pipeline: Pipeline) -> None:
    verdict = judge(pipeline, ALL)
    assert verdict.failures == [] and verdict.expected == 5 and verdict.lost == 0


def test_a_lost_event_fails_and_an_integer_id_is_not_its_string_twin(pipeline: Pipeline) -> None:
    """Only the integer 7, twice: the string "7" is lost and 7 duplicated (one ID to a checker that reads
    both as "7" would pass this)."""
    verdict = judge(pipeline, ["e1", "e2", "e3", 7, 7])
    assert verdict.lost == 1 and verdict.duplicated == 1
    assert any(f.startswith("lost 1: 7") for f in verdict.failures), verdict.failures


def _unexplained(verdict: Check) -> tuple[str, str]:
    """The failure for unexplained copies, split into its count and the copies it lists (whoever traces a
    failed seed reads there where each copy lies)."""
    (failure,) = verdict.failures
    head, _, copies = failure.partition("; their copies (shard@sequence arrival ms): ")
    return head, copies


def test_a_duplicate_the_copier_did_not_report_fails_and_says_where_each_copy_lies(pipeline: Pipeline) -> None:
    verdict = judge(pipeline, [*ALL, "e2"])
    head, copies = _unexplained(verdict)
    assert head == "1 extra copies no possible_duplicates report explains (of 1 duplicated IDs): e2"
    assert copies.startswith("e2: shardId-") and copies.count("shardId-") == 2, copies
    assert verdict.unexplained_examples == ("e2",)


def test_one_report_excuses_one_extra_copy_per_id_and_no_more(pipeline: Pipeline) -> None:
    """A report naming e2 and e3 excuses one extra copy of each: a third copy of e2 fails; counted."""
    verdict = judge(pipeline, [*ALL, "e2", "e2", "e3"], logs=[report("e2", "e3")])
    assert (verdict.extra_copies, verdict.explained_duplicates) == (3, 2)
    assert (verdict.possible_duplicate_reports, verdict.reported_ids) == (1, 2)
    head, copies = _unexplained(verdict)
    assert head == "1 extra copies no possible_duplicates report explains (of 2 duplicated IDs): e2"
    assert copies.startswith("e2: ") and copies.count("shardId-") == 3, copies


def test_reports_alike_but_for_their_time_each_excuse_a_copy(pipeline: Pipeline) -> None:
    """A processor that sends a chunk again after each of several ambiguous puts reports each time with the same
    shard, batch, IDs and window (smoke seed 8 on kinesis-mock: four such reports, four copies): each report
    excuses one copy; the daemon's raw echo of a wrapped line is still one report."""
    lines = []
    for stamp in ("2026-11-27T02:21:29.756743Z", "2026-11-27T02:21:30.816497Z"):
        event = {"event": "possible_duplicates", "event_ids": ["e2"], "shard": STAGING_SHARD, "batch": 3}
        event |= {"window_from_ms": 0, "timestamp": stamp}
        lines += [report("e2").replace(json.dumps(_report_event("e2")), json.dumps(event)), json.dumps(event)]
    verdict = judge(pipeline, [*ALL, "e2", "e2"], logs=lines)
    assert verdict.failures == [] and (verdict.possible_duplicate_reports, verdict.explained_duplicates) == (2, 2)


def test_a_copy_arriving_outside_the_reports_window_is_not_excused(pipeline: Pipeline) -> None:
    """The report's window closed in 2001: a copy landing now is another duplicate."""
    verdict = judge(pipeline, [*ALL, "e2"], logs=[report("e2", until_ms=1_000_000_000_000)])
    assert verdict.explained_duplicates == 0 and len(verdict.failures) == 1


def test_a_report_under_the_nested_dedup_key_is_mapped_back_and_its_echo_counts_once(pipeline: Pipeline) -> None:
    """A worker running dedupKey = json:meta.alt reports alt IDs: the check maps them back to eventId; the
    daemon's raw echo of the same line is not a second report."""
    line = report(alt_id(7))
    echo = line[line.index("[") + 1 : line.rindex("]")]
    verdict = judge(pipeline, [*ALL, 7], logs=[line, echo])
    assert verdict.failures == [] and (verdict.explained_duplicates, verdict.possible_duplicate_reports) == (1, 1)


def test_a_bare_event_id_in_the_dead_letter_stream_is_no_delivery(pipeline: Pipeline) -> None:
    """{"eventId": "e3"} with no envelope: invalid, and e3 is lost."""
    verdict = judge(pipeline, ["e1", "e2", 7, "7"], dead_letter=[b'{"eventId": "e3"}'])
    assert verdict.lost == 1 and verdict.invalid_dead_letters == 1
    assert any("not a dead-letter envelope" in f for f in verdict.failures), verdict.failures


def test_an_envelope_with_an_invented_reason_or_position_is_invalid(pipeline: Pipeline) -> None:
    out = produced(["not_json"])
    made_up = json.loads(envelope(out, "poison:not_json"))
    wrong_reason = json.dumps(made_up | {"reason": "because"}).encode()
    wrong_place = json.dumps(made_up | {"sequenceNumber": "99"}).encode()
    verdict = judge(pipeline, ALL, dead_letter=[wrong_reason, wrong_place], out=out)
    assert verdict.invalid_dead_letters == 2
    assert any("unknown reason" in f and "points at no produced record" in f for f in verdict.failures)


def test_a_keyed_event_in_the_dead_letter_stream_fails_even_in_a_valid_envelope(pipeline: Pipeline) -> None:
    """No rule of a chaos run dead-letters a keyed event: e3 there (and not in the target) fails."""
    out = produced()
    verdict = judge(pipeline, ["e1", "e2", 7, "7"], dead_letter=[envelope(out, "e3", "no event ID: x")], out=out)
    assert verdict.invalid_dead_letters == 1 and verdict.lost == 1


def test_a_target_copy_cut_down_or_rekeyed_is_changed(pipeline: Pipeline) -> None:
    """e1 with its payload cut to the ID, e2 under another key: both fail, though every ID is there once."""
    target = [("k", json.dumps({"eventId": "e1"}).encode()), ("other", body("e2")), "e3", 7, "7"]
    verdict = judge(pipeline, target)
    assert verdict.changed == 2 and verdict.lost == 0 and verdict.duplicated == 0
    assert verdict.failures[0].startswith("2 target copies not as produced")


def test_a_reorder_with_rewritten_keys_is_judged_on_the_produced_keys(pipeline: Pipeline) -> None:
    """e3 before e1 (both produced under key k), each under a key of its own in the target (on one shard, so
    the target's order between them is defined): out of order, judged by the produced key k."""
    x, y = keys_on_one_shard(pipeline, 2)
    target = [(x, body("e3")), "e2", (y, body("e1")), 7, "7"]
    verdict = judge(pipeline, target)
    assert verdict.out_of_order == 1
    assert any("out of order" in f for f in verdict.failures)


def test_with_deadletter_only_a_poison_record_must_be_dead_lettered_exactly_once(pipeline: Pipeline) -> None:
    """No worker ran forward: a poison record twice in the dead-letter stream, or in the target, fails."""
    out = produced(["not_json", "no_id"])
    twice = [envelope(out, "poison:not_json")] * 2
    verdict = judge(pipeline, [*ALL, "poison:no_id"], dead_letter=twice, out=out)
    assert verdict.failures[-3:] == [
        f"poison not_json at {STAGING_SHARD}@100: 2 copies in the dead-letter stream, 0 in the target",
        f"poison no_id at {STAGING_SHARD}@101: 0 copies in the dead-letter stream, 1 in the target",
        "1 records without an event ID in the target (poison not dead-lettered)",
    ]


def test_with_forward_a_poison_records_further_copies_pass_only_where_reports_name_it(pipeline: Pipeline) -> None:
    """A worker ran forward: a poison record in the dead-letter stream and twice in the target is delivered,
    and its two further copies fail the seed (before: counted, and passed) unless possible_duplicates lines
    name it (its content digest), one copy per name."""
    out = produced(["not_json"])
    target = ["e1", "poison:not_json", "e2", "e3", 7, "7", "poison:not_json"]
    letters = [envelope(out, "poison:not_json")]
    bare = judge(pipeline, target, dead_letter=letters, out=out, unkeyed_forwarded=True)
    assert (bare.poison_delivered, bare.unkeyed_copies, bare.unkeyed_explained) == (1, 2, 0)
    assert len(bare.failures) == 1, bare.failures
    assert bare.failures[0].startswith("2 extra copies of records without an event ID no possible_duplicates report")
    name = content_name("poison-not_json", POISON_BYTES["not_json"])
    event = {"event": "possible_duplicates", "event_ids": [], "unkeyed_digests": [name, name], "window_from_ms": 0}
    log = pipeline.tmp / "worker-1.log"
    log.write_text(json.dumps(event) + "\n")
    named = check(load_config(pipeline.properties), out, [log], unkeyed_forwarded=True)  # the same streams
    assert named.failures == [] and (named.poison_delivered, named.unkeyed_copies, named.unkeyed_explained) == (1, 2, 2)


def test_a_redriven_poison_record_counts_by_its_target_copy_as_verify_and_audit_count_it(pipeline: Pipeline) -> None:
    """A poison record dead-lettered, then sent on to the target by copier redrive: its dead-letter record is no
    copy of its own where the redrive recorded it (the same rule as copier verify's and copier audit's), so the
    seed passes; not recorded, it is in both streams and fails; recorded and missing from the target, lost."""
    out = produced(["no_id"])
    letter = envelope(out, "poison:no_id")
    sent = content_name("k", letter)  # how the redrive names the dead-letter record it sent (key "k": judge's)
    verdict = judge(pipeline, [*ALL, "poison:no_id"], dead_letter=[letter], out=out, redriven={sent})
    assert verdict.failures == [] and verdict.poison_delivered == 1
    assert verdict.dead_letter_records == 1 and verdict.unkeyed_in_target == 1


def test_a_poison_record_in_both_streams_that_no_redrive_sent_fails(pipeline: Pipeline) -> None:
    out = produced(["no_id"])
    verdict = judge(pipeline, [*ALL, "poison:no_id"], dead_letter=[envelope(out, "poison:no_id")], out=out)
    assert f"poison no_id at {STAGING_SHARD}@100: 1 copies in the dead-letter stream, 1 in the target" in (
        verdict.failures
    )


def test_a_redriven_poison_record_missing_from_the_target_fails(pipeline: Pipeline) -> None:
    out = produced(["no_id"])
    letter = envelope(out, "poison:no_id")
    verdict = judge(pipeline, ALL, dead_letter=[letter], out=out, redriven={content_name("k", letter)})
    assert verdict.failures == [f"poison no_id at {STAGING_SHARD}@100: redriven, and not in the target"]


def test_with_forward_a_poison_record_in_neither_stream_is_lost(pipeline: Pipeline) -> None:
    verdict = judge(pipeline, ALL, out=produced(["not_json"]), unkeyed_forwarded=True)
    assert f"poison not_json at {STAGING_SHARD}@100: lost (in neither the target nor the dead-letter stream)" in (
        verdict.failures
    )


def test_an_oversize_record_must_be_dead_lettered_as_oversize_under_any_policy(pipeline: Pipeline) -> None:
    """Too large for the target: only the dead-letter stream can hold it, with a reason that says so and its
    true size; an envelope calling it "no event ID" is invalid, and then it is missing."""
    out = produced(["oversize"])
    size = MAX_RECORD_BYTES + len("poison-oversize")
    right = envelope(out, "poison:oversize", f"record of {size} bytes exceeds the target's limit of 1048576 bytes")
    assert judge(pipeline, ALL, dead_letter=[right], out=out, unkeyed_forwarded=True).failures == []


def test_an_oversize_record_called_something_else_fails(pipeline: Pipeline) -> None:
    out = produced(["oversize"])
    verdict = judge(pipeline, ALL, dead_letter=[envelope(out, "poison:oversize", "no event ID: x")], out=out)
    assert verdict.invalid_dead_letters == 1 and verdict.poison_delivered == 0


def test_a_record_without_an_id_that_is_no_poison_record_fails_even_under_forward(pipeline: Pipeline) -> None:
    verdict = judge(pipeline, [*ALL, ("k", b"stray")], unkeyed_forwarded=True)
    assert "1 records without an event ID in the target that are no poison record" in verdict.failures


def test_an_id_in_the_target_that_was_never_produced_fails(pipeline: Pipeline) -> None:
    verdict = judge(pipeline, [*ALL, ("k", body("ghost"))])
    assert "1 event IDs in the target that were never produced: ghost" in verdict.failures


# -- the daemon's real log ----------------------------------------------------------------------------


def _real_log(tmp_path: Path, keep: str) -> Path:
    """The real daemon log, with both forms of each processor line, only the wrapped, or only the raw."""
    lines = REAL_DAEMON_LOG.read_text().splitlines()
    if keep == "wrapped":
        lines = [line for line in lines if not line.startswith("{")]
    elif keep == "raw":
        lines = [line for line in lines if "Received error line" not in line]
    path = tmp_path / f"{keep}.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("keep", ["both", "wrapped", "raw"])
def test_events_are_read_from_a_real_daemon_log_once_each_in_any_form(tmp_path: Path, keep: str) -> None:
    """The daemon wraps each processor line (``Received error line from subprocess [{...}] for shard X``) and
    echoes it raw: either form alone, or both, gives each event once."""
    events = copier_events([_real_log(tmp_path, keep)], {"took_over", "released", "lease_lost"})
    assert sorted(e["event"] for e in events) == ["lease_lost", "released", "took_over"]
    assert events[0]["shard"] == "shardId-000000000001"


@pytest.mark.parametrize("keep", ["wrapped", "raw"])
def test_a_fatal_line_in_a_real_daemon_log_fails_the_seed(pipeline: Pipeline, keep: str) -> None:
    """A ``fatal`` event in the daemon's own format (a real line, its event renamed) fails the seed."""
    path = _real_log(pipeline.tmp, keep)
    lines = path.read_text().replace('"event": "released"', '"event": "fatal", "error": "boom"').splitlines()
    verdict = judge(pipeline, ALL, logs=lines)
    assert verdict.failures == ["1 fatal errors in the copier's logs: boom"]


# -- reading -----------------------------------------------------------------------------------------


def test_closed_target_shards_and_many_pages_are_read_to_their_end(pipeline: Pipeline) -> None:
    """After a split, the closed parent and its children are all read, a shard of several pages in full."""
    p = pipeline
    filler = [{"PartitionKey": "k", "Data": json.dumps({"n": n}).encode()} for n in range(2 * PAGE_RECORDS + 10)]
    for start in range(0, len(filler), 500):
        p.kinesis.put_records(StreamName=p.target, Records=filler[start : start + 500])
    p.kinesis.put_record(StreamName=p.target, PartitionKey="k", Data=body("e1"))
    shards = p.kinesis.list_shards(StreamName=p.target)["Shards"]
    first = shards[0]["HashKeyRange"]
    middle = (int(first["StartingHashKey"]) + int(first["EndingHashKey"])) // 2
    p.kinesis.split_shard(StreamName=p.target, ShardToSplit=shards[0]["ShardId"], NewStartingHashKey=str(middle))
    p.kinesis.get_waiter("stream_exists").wait(StreamName=p.target, WaiterConfig={"Delay": 0.2})
    verdict = judge(p, ["e2", "e3", 7, "7"], unkeyed_forwarded=True)
    assert verdict.lost == 0 and verdict.pages >= 3
    assert (verdict.target_shards, verdict.target_shards_closed) == (4, 1)
    assert verdict.failures == [
        f"{2 * PAGE_RECORDS + 10} records without an event ID in the target that are no poison record"
    ]


def test_a_closed_shard_read_short_of_its_end_fails_whatever_its_ending_sequence_number() -> None:
    """A closed shard's read must end at a null NextShardIterator (AWS's sign of its end), whatever its
    EndingSequenceNumber says: moto's last record (s0) or kinesis-mock's 2^63-1, below its own record numbers
    (s3), pass when read to the end and fail when the read stopped before it; open shards pass."""
    emulator_end, record = str(2**63 - 1), 49680600778417853723861038117283401164352545383392477202
    shards = [
        {"ShardId": "s0", "SequenceNumberRange": {"StartingSequenceNumber": "1", "EndingSequenceNumber": "9"}},
        {"ShardId": "s1", "SequenceNumberRange": {"StartingSequenceNumber": "2", "EndingSequenceNumber": "2"}},
        {"ShardId": "s2", "SequenceNumberRange": {"StartingSequenceNumber": "3"}},
        {"ShardId": "s3", "SequenceNumberRange": {"StartingSequenceNumber": "4", "EndingSequenceNumber": emulator_end}},
    ]
    everything = {"s0", "s1", "s3"}
    assert short_reads("t", shards, {"s0": 9, "s2": 8, "s3": record}, everything) == []
    assert short_reads("t", shards, {"s0": 9, "s3": record}, {"s1", "s3"}) == [
        "t shard s0 is closed and its read stopped at 9, before its end"
    ]
    assert short_reads("t", shards, {"s3": record}, {"s0", "s1"}) == [
        f"t shard s3 is closed and its read stopped at {record}, before its end"
    ]


def _target_auto(p: Pipeline) -> None:
    arn = p.kinesis.describe_stream_summary(StreamName=p.target)["StreamDescriptionSummary"]["StreamARN"]
    p.kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy="AUTO")


def test_events_kinesis_put_off_their_keys_shard_are_not_judged_for_order_but_counted(pipeline: Pipeline) -> None:
    """e3 before e1 (both key k): out of order on k's shard; with the target ignoring keys (AUTO: the two land
    on different shards, one of them not k's) Kinesis kept no order, so the check leaves the pair out, and
    says how many records lay off their key's shard and how many events it did not judge."""
    target = ["e3", "e2", "e1", 7, "7"]
    _target_auto(pipeline)
    verdict = judge(pipeline, target)
    assert not any("out of order" in f for f in verdict.failures), verdict.failures
    assert verdict.scattered_target >= 1 and verdict.unordered >= 1 and verdict.scattered_staging == 0
    assert (verdict.lost, verdict.duplicated) == (0, 0)


def test_the_same_reorder_on_the_keys_own_shard_fails(pipeline: Pipeline) -> None:
    """The counterpart: routed by key, e3 before e1 is a reorder the check fails."""
    verdict = judge(pipeline, ["e3", "e2", "e1", 7, "7"])
    assert verdict.out_of_order == 1 and verdict.scattered_target == verdict.unordered == 0
    assert any("out of order" in f for f in verdict.failures)


def test_a_staging_record_off_its_keys_shard_exempts_its_event_from_order() -> None:
    """off_their_shard: a (shard, key) pair whose shard's range does not hold the key's hash; an unlisted
    shard holds any key (nothing can be said of it)."""
    shards = [
        {"ShardId": "s0", "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**127 - 1)}},
        {"ShardId": "s1", "HashKeyRange": {"StartingHashKey": str(2**127), "EndingHashKey": str(2**128 - 1)}},
    ]
    low = next(f"k{i}" for i in range(100) if hash_key(f"k{i}") < 2**127)
    high = next(f"k{i}" for i in range(100) if hash_key(f"k{i}") >= 2**127)
    placed = [("s0", low), ("s0", high), ("s1", low), ("s1", high), ("gone", low)]
    assert off_their_shard(placed, shards) == [1, 2]
