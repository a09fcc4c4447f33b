"""``copier process`` driven over its pipes as the MultiLangDaemon drives it, against the local backend.

Every scenario ends by reading the whole target stream and asserting that
it holds every expected event exactly once and nothing else.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from copier.core import kpl
from copier.core.plan import replacement_key
from copier.local.multilang import Processor, Rec, event
from tests.conftest import Pipeline
from tests.support.backend import read_stream
from tests.support.records import check_outcome

pytestmark = pytest.mark.protocol

SHARD = "shardId-000000000000"


def target_ids(p: Pipeline, stream: str | None = None) -> Counter[str]:
    """Event IDs in the target (``body:<body>`` for records without one, ``raw:<bytes>`` for non-JSON)."""
    out: Counter[str] = Counter()
    for record in read_stream(p.kinesis, stream or p.target):
        data = bytes(record["Data"])
        try:
            doc = json.loads(data)
        except ValueError:
            out[f"raw:{data.decode(errors='replace')}"] += 1
            continue
        key = doc.get("eventId") if isinstance(doc, dict) else None
        out[key if isinstance(key, str) else f"body:{json.dumps(doc, sort_keys=True)}"] += 1
    return out


def exactly_once(ids: list[str]) -> Counter[str]:
    return Counter({i: 1 for i in ids})


def test_duplicates_inside_one_batch_are_forwarded_once(pipeline: Pipeline, processors: Any) -> None:
    """The same event ID three times in one batch reaches the target once."""
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process([event(1, "a"), event(2, "b"), event(3, "a"), event(4, "c"), event(5, "a")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c"])
    assert proc.last_checkpoint() == ("5", 0)
    assert proc.close() == 0


def test_same_event_id_under_a_new_sequence_number_in_a_later_batch_is_dropped(
    pipeline: Pipeline, processors: Any
) -> None:
    """A producer retry (same ID, new sequence number, later batch) is recognised by the window."""
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process([event(10, "a"), event(11, "b")])
    proc.process([event(12, "b", body="retried"), event(13, "c"), event(14, "a", body="retried")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c"])
    committed = proc.wait_for("committed", 2)[-1]
    assert committed["duplicates"] == 2


def test_sequence_numbers_compare_as_numbers(pipeline: Pipeline, processors: Any) -> None:
    """Sequence number 10 comes after 9 although "10" < "9" as text."""
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process([event(8, "a"), event(9, "b")])
    proc.process([event(10, "c"), event(11, "d")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c", "d"])
    assert proc.last_checkpoint() == ("11", 0)


def test_replay_of_a_committed_range_after_a_restart_forwards_nothing_again(
    pipeline: Pipeline, processors: Any
) -> None:
    """After a restart the daemon replays from an old checkpoint; committed records are skipped."""
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    batch1 = [event(100 + i, f"e{i}") for i in range(5)]
    batch2 = [event(200 + i, f"f{i}") for i in range(5)]
    first.process(batch1)
    first.process(batch2)
    first.shutdown_requested()
    assert first.close() == 0
    second = processors(pipeline, "second")
    second.initialize(SHARD, seq="104")  # an older checkpoint than the committed position
    second.process(batch2 + [event(300, "g")])
    ids = [f"e{i}" for i in range(5)] + [f"f{i}" for i in range(5)] + ["g"]
    assert target_ids(pipeline) == exactly_once(ids)
    assert second.wait_for("committed")[-1]["replays"] == 5
    # the first processor released its lease on shutdown: no grace sleep for the second
    assert not second.events("waiting_for_lease")


def big_batch(start_seq: int, prefix: str, count: int) -> tuple[list[Rec], list[str]]:
    """``count`` events, every tenth repeating an earlier ID (a producer retry)."""
    records, ids = [], []
    for i in range(count):
        if i % 10 == 9:
            records.append(event(start_seq + i, f"{prefix}-{i - 5}", body="retry"))
        else:
            records.append(event(start_seq + i, f"{prefix}-{i}"))
            ids.append(f"{prefix}-{i}")
    return records, ids


def resume_after(records: list[Rec], checkpoint: tuple[str | None, int | None] | None) -> list[Rec]:
    if checkpoint is None:
        return records
    seq, sub = int(checkpoint[0] or 0), int(checkpoint[1] or 0)
    return [r for r in records if (r.seq, r.subseq) > (seq, sub)]


KILL_POINTS = [
    ("batch_recorded", 1),
    ("put_request", 1),
    ("put_request", 2),
    ("put_request", 4),
    ("put_done", 1),
    ("committed", 1),
    ("batch_recorded", 2),
    ("put_request", 6),
]


@pytest.mark.parametrize("point,count", KILL_POINTS, ids=[f"{p}-{c}" for p, c in KILL_POINTS])
def test_sigkill_during_a_large_batch_then_a_new_processor_from_the_last_checkpoint(
    pipeline: Pipeline, processors: Any, point: str, count: int
) -> None:
    """SIGKILL at a point of the record/put/commit sequence; the successor verifies and completes."""
    pipeline.write_properties(putTimeoutMillis=500, clockSkewMillis=100)
    first_half, ids1 = big_batch(1000, "a", 1600)
    second_half, ids2 = big_batch(5000, "b", 1600)
    victim = processors(pipeline, "victim")
    victim.initialize(SHARD)
    victim.send_process(first_half)
    sent_second = False
    deadline = time.monotonic() + 60
    while len(victim.events(point)) < count:
        assert time.monotonic() < deadline, f"never reached {point} #{count}"
        if victim.next_status(0.001) == "processRecords" and not sent_second:
            victim.send_process(second_half)  # the daemon sends the next batch once one is acknowledged
            sent_second = True
    victim.kill()

    successor = processors(pipeline, "successor")
    checkpoint = victim.last_checkpoint()
    successor.initialize(SHARD, seq=checkpoint[0] if checkpoint else "TRIM_HORIZON")
    successor.process(resume_after(first_half + second_half, checkpoint)[:2500])
    successor.process(resume_after(first_half + second_half, checkpoint)[2500:])
    assert target_ids(pipeline) == exactly_once(ids1 + ids2)
    if successor.events("verified_pending"):  # killed between its digest batch and its commit
        verified = successor.events("verified_pending")[0]
        assert verified["landed"] + verified["to_redo"] > 0
        assert verified["shards_read"] <= 2 and verified["records_read"] <= 2 * 3200
    assert successor.close() == 0


def test_takeover_while_the_first_processor_still_gets_records(pipeline: Pipeline, processors: Any) -> None:
    """Once a successor announces itself, the owner's next commit is fenced: the chunk it put under its
    lease is verified by the successor, not resent; after that it forwards nothing and keeps answering.

    The lease (15 s) outlasts starting the successor on a loaded machine: with 3 s, a successor that took
    2 s to start found the owner's lease due for renewal, and the owner was fenced before putting c and d."""
    pipeline.write_properties(leaseMillis=15_000)
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    first.process([event(1, "a"), event(2, "b")])
    checkpoint = first.last_checkpoint()
    assert checkpoint == ("2", 0)

    second = processors(pipeline, "second")
    done = threading.Event()

    def take_over() -> None:
        second.initialize(SHARD, seq=checkpoint[0] or "")
        done.set()

    thread = threading.Thread(target=take_over)
    thread.start()
    deadline = time.monotonic() + 30
    while not second.events("waiting_for_lease"):
        assert time.monotonic() < deadline, "successor never started waiting"
        time.sleep(0.02)

    late = [event(3, "c"), event(4, "d")]
    first.process(late)  # put under its still valid lease; the commit finds the announcement: fenced
    first.wait_for("fenced")
    thread.join(timeout=30)
    assert done.is_set()
    first.process([event(5, "e")])
    checkpoints_before = list(first.checkpoints)
    first.shutdown_requested()
    assert first.checkpoints == checkpoints_before, "a fenced processor must not checkpoint"
    assert first.proc.poll() is None, "a fenced processor keeps running until the daemon ends it"
    assert target_ids(pipeline) == exactly_once(["a", "b", "c", "d"]), "nothing after the fenced commit"

    second.process(late + [event(5, "e")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c", "d", "e"])
    verified = second.wait_for("verified_pending")[0]
    assert (verified["landed"], verified["to_redo"]) == (2, 0)
    first.lease_lost()
    assert first.close() == 0


def test_a_processor_told_its_lease_moved_releases_it_to_the_successor_waiting_for_it(
    pipeline: Pipeline, processors: Any
) -> None:
    """A lease move without the KCL's handoff: the new owner's processor starts first, announces itself and
    waits; the old one gets leaseLost, releases copier's lease under that announcement, and the new one
    takes over at its next look, long before the lease (60 s here: most of it is left when the successor
    starts, however slow the machine) would have run out."""
    pipeline.write_properties(leaseMillis=60_000)
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    first.process([event(1, "a"), event(2, "b")])
    second = processors(pipeline, "second")
    thread = threading.Thread(target=lambda: second.initialize(SHARD, seq="2"))
    thread.start()
    (waiting,) = second.wait_for("waiting_for_lease", timeout=30)
    assert waiting["wait_ms"] > 30_000, "the successor started while most of the lease was left"
    first.lease_lost()
    (released,) = first.wait_for("released")
    assert released["why"] == "lease_lost" and released["successor"] is not None, released
    thread.join(timeout=30)
    (took_over,) = second.wait_for("took_over")
    assert took_over["epoch"] == 2
    waited_s = _at(took_over) - _at(waiting)
    assert waited_s * 1000 < waiting["wait_ms"] / 2, f"took over {waited_s:.1f} s after it began to wait"
    second.process([event(3, "c")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c"])
    assert first.close() == 0 and second.close() == 0


def _at(entry: dict[str, Any]) -> float:
    """A log line's timestamp, in seconds."""
    return datetime.fromisoformat(str(entry["timestamp"]).replace("Z", "+00:00")).timestamp()


def test_a_fenced_processor_asked_to_end_the_shard_takes_it_back_and_checkpoints(
    pipeline: Pipeline, processors: Any
) -> None:
    """Chaos seed 36 over the real protocol: a rival took copier's lease, then its daemon lost the shard.

    The first processor, fenced, is asked for the shard's end (the daemon asks once). It must not answer
    until the shard is done: it waits for the rival's lease to end (released here), takes the shard back,
    forwards what it held, and checkpoints with no arguments. (Before: it answered without a checkpoint, and
    the daemon held the lease with no processor behind it, forever.)
    """
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    first.process([event(1, "a")])
    rival = processors(pipeline, "rival")
    rival.initialize(SHARD, seq="1")  # sleeps out the first's lease, takes over
    rival.lease_lost()  # releases copier's lease and stops: first, fenced, need not sleep it out
    first.process([event(2, "b")])
    first.wait_for("fenced")
    checkpoints_before = list(first.checkpoints)
    first.shard_ended()
    assert first.checkpoints[len(checkpoints_before) :] == [(None, None)], "SHARD_END, no arguments"
    assert [e["held"] for e in first.events("took_back")] == [1]
    assert target_ids(pipeline) == exactly_once(["a", "b"])
    assert rival.close() == 0 and first.close() == 0


def test_kpl_aggregated_records_and_a_replay_from_the_middle_of_one(pipeline: Pipeline, processors: Any) -> None:
    """Sub-records of one aggregated record are separate events; a replay may start inside one."""
    aggregated = [event(500, f"k{i}", subseq=i) for i in range(8)] + [event(500, "k2", body="dup", subseq=8)]
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    first.process([event(499, "before")] + aggregated[:5])
    assert first.last_checkpoint() == ("500", 4)
    first.kill()

    second = processors(pipeline, "second")
    second.initialize(SHARD, seq="500", subseq=2)  # an older checkpoint, inside the aggregated record
    second.process(aggregated[3:] + [event(501, "after")])
    ids = ["before"] + [f"k{i}" for i in range(8)] + ["after"]
    assert target_ids(pipeline) == exactly_once(ids)
    assert second.last_checkpoint() == ("501", 0)


def test_events_without_an_id_and_non_json_payloads_are_forwarded_and_logged(
    pipeline: Pipeline, processors: Any
) -> None:
    """Under unkeyedPolicy=forward, unkeyed records go through as is, each logged with its position."""
    proc = processors(pipeline)
    proc.initialize(SHARD)
    records = [
        event(1, "a"),
        event(2, None, body="no-id"),
        Rec(3, b"\xff\xfenot json", "raw"),
        Rec(4, b'{"eventId": {"nested": 1}}', "obj"),
        event(5, "b"),
    ]
    proc.process(records)
    ids = target_ids(pipeline)
    assert ids == exactly_once(
        ["a", "b", 'body:{"body": "no-id"}', "raw:\ufffd\ufffdnot json", 'body:{"eventId": {"nested": 1}}']
    )
    logged = {(e["sequence_number"], e["reason"]) for e in proc.wait_for("unkeyed_event", 3)}
    assert logged == {
        ("2", "field eventId is missing"),
        ("3", "payload is not JSON"),
        ("4", "field eventId is dict, not a string or integer"),
    }


def test_unkeyed_events_go_to_the_dead_letter_stream_with_the_reason(pipeline: Pipeline, processors: Any) -> None:
    """Under unkeyedPolicy=deadletter, an unkeyed record lands in the DLQ, wrapped with why and where from."""
    dlq = pipeline.target + "-dlq"
    pipeline.kinesis.create_stream(StreamName=dlq, ShardCount=1)
    pipeline.write_properties(unkeyedPolicy="deadletter", deadLetterStreamName=dlq)
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process([event(1, "a"), Rec(2, b"garbage", "g"), event(3, "b")])
    assert target_ids(pipeline) == exactly_once(["a", "b"])
    letters = [json.loads(r["Data"]) for r in read_stream(pipeline.kinesis, dlq)]
    assert len(letters) == 1
    assert letters[0]["reason"] == "no event ID: payload is not JSON"
    assert letters[0]["sequenceNumber"] == "2" and letters[0]["shardId"] == SHARD
    assert base64.b64decode(letters[0]["data"]) == b"garbage"


def test_a_child_shard_after_a_split_drops_a_duplicate_of_a_parent_event(pipeline: Pipeline, processors: Any) -> None:
    """The child inherits its parent's window: a retry of a parent's event landing on the child is dropped."""
    k = pipeline.kinesis
    shard = k.list_shards(StreamName=pipeline.staging)["Shards"][0]
    middle = (int(shard["HashKeyRange"]["StartingHashKey"]) + int(shard["HashKeyRange"]["EndingHashKey"])) // 2
    k.split_shard(StreamName=pipeline.staging, ShardToSplit=shard["ShardId"], NewStartingHashKey=str(middle))
    children = [s["ShardId"] for s in k.list_shards(StreamName=pipeline.staging)["Shards"] if s.get("ParentShardId")]
    assert children

    parent = processors(pipeline, "parent")
    parent.initialize(shard["ShardId"])
    parent.process([event(1, "a"), event(2, "b")])
    parent.shard_ended()
    assert parent.last_checkpoint() == (None, None), "shard_ended checkpoints with no arguments"
    assert parent.close() == 0

    child = processors(pipeline, "child")
    child.initialize(children[0])
    child.process([event(10, "a", body="retried on the child"), event(11, "c")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c"])
    loaded = child.wait_for("window_loaded")[0]
    assert loaded["parents"] == [shard["ShardId"]] and loaded["parent_batches"] == 1


def test_the_shards_end_is_checkpointed_through_lease_table_failures(pipeline: Pipeline, processors: Any) -> None:
    """The daemon asks for a shard's end once: a checkpoint that fails is retried until it passes.

    (Before, a failure other than throttling, or a sixth throttle, ended the attempt: the processor answered
    without the checkpoint and the daemon held the lease of a shard, and of its children, that no one read.)
    """
    proc = processors(pipeline, "ending")
    proc.initialize(SHARD)
    proc.process([event(1, "a")])
    before = len(proc.checkpoints)
    failures: list[str | None] = ["KinesisClientLibDependencyException", "InvalidStateException"]
    failures += ["ThrottlingException"] * 6
    proc.shard_ended(checkpoint_error=[*failures, None])
    assert proc.checkpoints[before:] == [(None, None)] * (len(failures) + 1)
    assert [e["error"] for e in proc.events("checkpoint_failed")] == failures
    assert proc.close() == 0


def test_a_lost_lease_at_the_shards_end_is_not_retried(pipeline: Pipeline, processors: Any) -> None:
    """ShutdownException: another worker has the shard and checkpoints its end; this processor answers."""
    proc = processors(pipeline, "ending")
    proc.initialize(SHARD)
    proc.process([event(1, "a")])
    before = len(proc.checkpoints)
    proc.shard_ended(checkpoint_error=["ShutdownException", None])
    assert proc.checkpoints[before:] == [(None, None)]
    assert proc.close() == 0


def test_a_processor_whose_daemon_goes_away_gives_its_lease_up(pipeline: Pipeline, processors: Any) -> None:
    """End of input without shutdown_requested (the daemon exited or died): the processor releases its lease
    on the way out, and a successor takes over without sleeping it out."""
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    first.process([event(1, "a"), event(2, "b")])
    assert first.close() == 0
    released = first.wait_for("released")
    assert released[-1]["position"] == "2/0"
    second = processors(pipeline, "second")
    second.initialize(SHARD, seq="1")
    assert not second.events("waiting_for_lease"), "no lease left to sleep out"
    second.process([event(2, "b"), event(3, "c")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c"])


# -- no record's key, bytes or arrival ends the process ----------------------------------------------------------

EMOJI = "\U0001f600"


def _hostile_records() -> list[Rec]:
    """One delivery of what records can hold: keys with a lone surrogate, empty, of 256 and 257 code points and
    of 400 UTF-16 units, a NUL; bytes that are not UTF-8 or not JSON, JSON that is not an object, event IDs of
    every JSON type; the user records of an aggregate whose keys were written as bytes that are not UTF-8 (as the
    daemon de-aggregates them); arrival times 0, negative, the largest long and none."""
    ids: list[object] = ["s1", 7, -(2**70), 1.5, None, True, [1], {"a": 1}, "\ud800x", ""]
    records = [
        Rec(1, b"not json", "k\ud800", 0, 0),
        Rec(2, b'{"eventId": "lone"}', "\udc00", 0, -1),
        Rec(3, b'{"eventId": "emoji 200"}', EMOJI * 200, 0, 2**63 - 1),
        Rec(4, b'{"eventId": "emoji 257"}', EMOJI * 257, 0, -(2**63)),
        Rec(5, b"\xff\xfe\x00", "", 0, None),
        Rec(6, b"[1, 2]", "\xe9" * 256, 0, 1_700_000_000_000),
        Rec(7, b'"text"', "x" * 257, 0, 1_700_000_000_000),
        Rec(8, b"", "a\x00b", 0, 1_700_000_000_000),
    ]
    records += [Rec(10 + i, json.dumps({"eventId": v}).encode(), f"id{i}", 0) for i, v in enumerate(ids)]
    parts = [kpl._delimited(1, k) for k in (b"k\xff", b"k\xed\xa0\x80", "\xe9".encode() * 256)]
    for i in range(3):
        parts.append(
            kpl._delimited(3, b"\x08" + bytes([i]) + kpl._delimited(3, json.dumps({"eventId": f"u{i}"}).encode()))
        )
    message = b"".join(parts)
    view = kpl.as_daemon_delivers(kpl.MAGIC + message + hashlib.md5(message).digest(), "outer", (0, 2**128 - 1))
    assert view.aggregated and len(view.records) == 3
    records += [Rec(30, data, key, i) for i, (key, data) in enumerate(view.records)]
    return records


@pytest.mark.parametrize("dead_letter", [False, True], ids=["replacement keys", "dead-letter stream"])
def test_no_record_ends_copier_process_and_each_is_forwarded_or_dead_lettered_once(
    pipeline: Pipeline, processors: Any, dead_letter: bool
) -> None:
    """The records of ``_hostile_records`` over the pipes (the JSON escapes a lone surrogate as the daemon would
    if it did not write it as "?"): the process acknowledges the delivery and stays up, and every record is in the
    target (a key Kinesis takes as it is, any other under the replacement key) or the dead-letter stream, once.
    Before, the first record's key ended the process with exit status 3, on every delivery."""
    if dead_letter:
        pipeline.kinesis.create_stream(StreamName=pipeline.target + "-dlq", ShardCount=1)
        pipeline.write_properties(deadLetterStreamName=pipeline.target + "-dlq", unkeyedPolicy="deadletter")
    records = _hostile_records()
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process_json(
        json.dumps({"action": "processRecords", "records": [r.to_json() for r in records], "millisBehindLatest": 0})
    )
    assert proc.proc.poll() is None
    target = [(r["PartitionKey"], bytes(r["Data"])) for r in read_stream(pipeline.kinesis, pipeline.target)]
    letters = [bytes(r["Data"]) for r in read_stream(pipeline.kinesis, pipeline.target + "-dlq")] if dead_letter else []
    check_outcome(records, target, letters)
    assert proc.close() == 0


def test_the_daemons_utf8_is_read_as_utf8_whatever_the_processors_locale(pipeline: Pipeline, processors: Any) -> None:
    """A processor whose locale decodes stdin as Latin-1 (``PYTHONIOENCODING`` stands for such a locale) read the
    key "é" as "Ã©" and forwarded it under that key: it reads UTF-8, what the daemon writes. And a byte that is
    not UTF-8 in a key (a daemon writing another charset) is a key Kinesis would refuse, forwarded under the
    replacement key, not an error that ends the process."""
    proc = Processor(pipeline.properties, "latin-1 locale", env={"PYTHONIOENCODING": "latin-1"})
    try:
        proc.initialize(SHARD)
        records = [Rec(1, b'{"eventId": "e"}', "\xe9", 0), Rec(2, b'{"eventId": "k"}', "k", 0)]
        line = json.dumps(
            {"action": "processRecords", "records": [r.to_json() for r in records], "millisBehindLatest": 0},
            ensure_ascii=False,
        )
        proc.process_bytes(line.encode("utf-8").replace(b'"k"', b'"k\xff"', 1))
        target = {bytes(r["Data"]): r["PartitionKey"] for r in read_stream(pipeline.kinesis, pipeline.target)}
        assert target[b'{"eventId": "e"}'] == "\xe9"
        assert target[b'{"eventId": "k"}'] == replacement_key("k\udcff")
        assert proc.close() == 0
    finally:
        proc.kill()
