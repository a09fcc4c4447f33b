"""The chaos suite's independent check (copier.chaos.check) fails a seed for what it must: it can say no.

Each test writes a target stream by hand through the local backend, as a
faulty copier might have left it, and runs the check against a manifest.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Sequence
from typing import Any

from copier.chaos.check import Check, _Read, _short_reads, check
from copier.chaos.producer import Poison, Produced
from copier.config import load_config
from tests.conftest import Pipeline
from tests.support.backend import create_stream

MANIFEST = ["e1", "e2", "e3", "e4"]  # production order; keys below
KEYS = {"e1": "k", "e2": "j", "e3": "k", "e4": "k"}


POISON = b"\xff\xfe not json"  # a poison record: no event ID


def _judge(
    p: Pipeline,
    target: list[str],
    logs: Sequence[dict[str, object]] = (),
    dead_letter: Sequence[str] = (),
    poison: Sequence[Poison] = (),
    unkeyed_forwarded: bool = False,
    **copier: object,
) -> Check:
    """Put ``target`` (event IDs, in this order; "poison" for POISON) into the target stream and ``dead_letter``
    into a dead-letter stream (as envelopes; "poison" for POISON's), then check both against MANIFEST."""
    for event_id in target:
        data = POISON if event_id == "poison" else json.dumps({"eventId": event_id}).encode()
        p.kinesis.put_record(StreamName=p.target, PartitionKey=KEYS.get(event_id, "k"), Data=data)
    if dead_letter:
        copier["deadLetterStreamName"] = dlq = f"{p.target}-dlq"
        create_stream(p.kinesis, dlq, 1)
        for event_id in dead_letter:
            p.kinesis.put_record(StreamName=dlq, PartitionKey="k", Data=json.dumps(_envelope(event_id)).encode())
    log = p.tmp / "worker-1.log"
    log.write_text("".join(f"[stderr] {json.dumps(e)}\n" for e in logs))
    config = load_config(p.write_properties(**copier))
    produced = Produced(manifest=list(MANIFEST), poison=list(poison))
    return check(config, produced, [log], unkeyed_forwarded=unkeyed_forwarded)


def _envelope(event_id: str) -> dict[str, Any]:
    """A dead-letter envelope as copier writes one (copier.plan): the original record and where it was in staging."""
    data = POISON if event_id == "poison" else json.dumps({"eventId": event_id}).encode()
    where = ("shardId-000000000000", "7") if event_id == "poison" else ("shardId-000000000000", "1")
    return {
        "reason": "test",
        "partitionKey": "k",
        "data": base64.b64encode(data).decode(),
        "shardId": where[0],
        "sequenceNumber": where[1],
    }


THE_POISON = Poison("not_json", "shardId-000000000000", "7", hashlib.sha256(POISON).hexdigest())


def test_a_clean_target_passes(pipeline: Pipeline) -> None:
    """Each event once, each key in production order: no failure."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4"])
    assert verdict.failures == [] and (verdict.lost, verdict.duplicated, verdict.out_of_order) == (0, 0, 0)


def test_a_lost_event_fails(pipeline: Pipeline) -> None:
    """An event produced and in neither stream fails the seed, named."""
    verdict = _judge(pipeline, ["e1", "e2", "e4"])
    assert verdict.lost == 1 and verdict.failures == ["lost 1: e3"]


def test_a_duplicate_the_copier_did_not_report_fails(pipeline: Pipeline) -> None:
    """An extra copy with no ``possible_duplicates`` report naming it fails the seed."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "e2"])
    assert verdict.duplicated == 1
    assert verdict.failures == ["duplicated 1 without a possible_duplicates report: ['e2']"]


def test_a_reported_late_copy_is_a_duplicate_not_an_order_violation(pipeline: Pipeline) -> None:
    """A zombie's late copy of e1 after e3 and e4: explained by the report, and the first copies kept order."""
    report = {"event": "possible_duplicates", "event_ids": ["e1"]}
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "e1"], logs=[report])
    assert verdict.failures == []
    assert (verdict.duplicated, verdict.explained_duplicates, verdict.out_of_order) == (1, 1, 0)


def test_a_key_out_of_order_fails_with_partition_key_ordering(pipeline: Pipeline) -> None:
    """e4 before e3 (same key k) breaks the order that copier.ordering = partitionKey promises."""
    verdict = _judge(pipeline, ["e1", "e2", "e4", "e3"])
    assert verdict.out_of_order == 1
    assert verdict.failures == ["1 events out of order per partition key: e3 after e4 (key k)"]


def test_out_of_order_is_only_counted_with_ordering_none(pipeline: Pipeline) -> None:
    """With copier.ordering = none, Kinesis keeps no order across retries: disorder is counted, not failed."""
    verdict = _judge(pipeline, ["e1", "e2", "e4", "e3"], ordering="none")
    assert verdict.out_of_order == 1 and verdict.failures == []


def test_a_fatal_log_line_fails(pipeline: Pipeline) -> None:
    """Nothing in a chaos run should end a process: a ``fatal`` line in a worker's log fails the seed."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4"], logs=[{"event": "fatal", "error": "boom"}])
    assert verdict.failures == ["1 fatal errors in the copier's logs: boom"]


def test_a_duplicate_reported_under_the_other_dedup_key_is_explained(pipeline: Pipeline) -> None:
    """A worker running dedupKey = json:alt reports "a-e2": the check maps it back to e2."""
    report = {"event": "possible_duplicates", "event_ids": ["a-e2"]}
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "e2"], logs=[report])
    assert verdict.failures == [] and (verdict.duplicated, verdict.explained_duplicates) == (1, 1)


def test_an_event_in_both_the_target_and_the_dead_letter_stream_is_a_duplicate(pipeline: Pipeline) -> None:
    """Exactly once holds across the two streams: a keyed event in both, unreported, fails."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4"], dead_letter=["e2"])
    assert verdict.failures == ["duplicated 1 without a possible_duplicates report: ['e2']"]


def test_with_deadletter_only_a_poison_record_must_be_dead_lettered_exactly_once(pipeline: Pipeline) -> None:
    """No worker ran unkeyedPolicy = forward: the poison record in the target instead fails the seed."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "poison"], dead_letter=["poison"], poison=[THE_POISON])
    assert verdict.failures == [
        "poison not_json at shardId-000000000000@7: 1 copies in the dead-letter stream, 1 in the target",
        "1 records without an event ID in the target (poison not dead-lettered)",
    ]


def test_with_forward_a_poison_record_is_delivered_at_least_once_and_its_copies_counted(pipeline: Pipeline) -> None:
    """Under forward (for some worker) a record without an ID may be in either stream, more than once: counted."""
    target = ["e1", "poison", "e2", "e3", "e4", "poison"]
    verdict = _judge(pipeline, target, dead_letter=["poison"], poison=[THE_POISON], unkeyed_forwarded=True)
    assert verdict.failures == [] and (verdict.poison_delivered, verdict.unkeyed_copies) == (1, 2)


def test_with_forward_a_poison_record_in_neither_stream_is_lost(pipeline: Pipeline) -> None:
    """At least once still means once: a poison record nowhere fails the seed."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4"], poison=[THE_POISON], unkeyed_forwarded=True)
    assert verdict.failures == [
        "poison not_json at shardId-000000000000@7: lost (in neither the target nor the dead-letter stream)"
    ]


def test_a_record_without_an_id_that_is_no_poison_record_fails_even_under_forward(pipeline: Pipeline) -> None:
    """The producer writes nothing else without an ID: such a record in the target is unexplained."""
    verdict = _judge(pipeline, ["e1", "e2", "e3", "e4", "poison"], unkeyed_forwarded=True)
    assert verdict.failures == ["1 records without an event ID in the target that are no poison record"]


def test_closed_target_shards_are_read_to_their_last_record(pipeline: Pipeline) -> None:
    """After a split, the closed parent and its children are all read: nothing lost, the parent counted as closed."""
    p = pipeline
    for event_id in ["e1", "e2"]:
        data = json.dumps({"eventId": event_id}).encode()
        p.kinesis.put_record(StreamName=p.target, PartitionKey=KEYS[event_id], Data=data)
    shards = p.kinesis.list_shards(StreamName=p.target)["Shards"]
    first = shards[0]["HashKeyRange"]
    middle = (int(first["StartingHashKey"]) + int(first["EndingHashKey"])) // 2
    p.kinesis.split_shard(StreamName=p.target, ShardToSplit=shards[0]["ShardId"], NewStartingHashKey=str(middle))
    p.kinesis.get_waiter("stream_exists").wait(StreamName=p.target, WaiterConfig={"Delay": 0.2})
    verdict = _judge(p, ["e3", "e4"])
    assert verdict.failures == [] and verdict.lost == 0
    assert (verdict.target_shards, verdict.target_shards_closed) == (4, 1)


def test_a_closed_shard_read_short_of_its_last_record_fails() -> None:
    """A read that stopped before a closed shard's EndingSequenceNumber is named; open and empty shards pass."""
    shards = [
        {"ShardId": "s0", "SequenceNumberRange": {"StartingSequenceNumber": "1", "EndingSequenceNumber": "9"}},
        {"ShardId": "s1", "SequenceNumberRange": {"StartingSequenceNumber": "2", "EndingSequenceNumber": "2"}},
        {"ShardId": "s2", "SequenceNumberRange": {"StartingSequenceNumber": "3"}},
    ]
    read = _Read([("s0", {"SequenceNumber": "5"}), ("s2", {"SequenceNumber": "8"})], shards)
    assert _short_reads("t", read) == ["t shard s0 read to 5, its last record is 9"]
    whole = _Read([("s0", {"SequenceNumber": "5"}), ("s0", {"SequenceNumber": "9"})], shards)
    assert _short_reads("t", whole) == []
