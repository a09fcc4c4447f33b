"""``copier verify``: reading streams within the Kinesis limits, the report, and runs on the local backend."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from copier.adapters.dynamo import DynamoStateStore
from copier.commands.verify import (
    GET_RECORDS_INTERVAL_S,
    Progress,
    StreamReader,
    VerifyResult,
    dead_letter_event_id,
    lineage_order,
    read_envelope,
    read_manifest,
    render_text,
)
from copier.core import kpl
from copier.core.audit import DeadLetter, TargetRecord, audit
from copier.core.audittypes import content_name
from copier.core.config import DedupKey, load_config
from copier.core.errors import FatalAwsError, TransientAwsError
from copier.core.plan import PlanSettings, SourceRecord, dead_letter_envelope
from copier.core.positions import Position
from copier.core.state import ShardState, shard_key
from tests.conftest import Pipeline
from tests.support.backend import DUMMY_ENV, ROOT, create_stream

JSON_KEY = DedupKey("json", ("eventId",))

# What the CLI does with a command's main (copier.commands.cli): ConfigError -> 2, any other CopierError -> 3.
HARNESS = """
import argparse, sys
from copier.core.errors import ConfigError, CopierError
from copier.commands.verify import add_arguments, main
parser = argparse.ArgumentParser(prog="copier verify")
add_arguments(parser)
try:
    sys.exit(main(parser.parse_args(sys.argv[1:])))
except ConfigError as exc:
    print(f"copier: {exc}", file=sys.stderr); sys.exit(2)
except CopierError as exc:
    print(f"copier: {exc}", file=sys.stderr); sys.exit(3)
"""


# -- a fake Kinesis with real AWS semantics (closed shards end with a null iterator) ----------------


def client_error(code: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError({"Error": {"Code": code, "Message": code}}, operation)


class FakeKinesis:
    """ListShards in pages of two, GetRecords in pages of ``page`` records, and injected failures."""

    def __init__(self, shards: list[dict[str, Any]], records: dict[str, list[str]], page: int = 2) -> None:
        self.shard_list = shards
        self.records = records  # shard ID -> event IDs in sequence order
        self.page = page
        self.fail: dict[str, list[str]] = {}  # operation -> error codes to raise, one per call
        self.calls: list[tuple[str, str]] = []

    def _maybe_fail(self, operation: str) -> None:
        if self.fail.get(operation):
            raise client_error(self.fail[operation].pop(0), operation)

    def _open(self, shard_id: str) -> bool:
        shard = next(s for s in self.shard_list if s["ShardId"] == shard_id)
        return "EndingSequenceNumber" not in shard["SequenceNumberRange"]

    def list_shards(self, **kwargs: Any) -> dict[str, Any]:
        self._maybe_fail("ListShards")
        assert ("StreamName" in kwargs) != ("NextToken" in kwargs)
        start = int(kwargs.get("NextToken", 0))
        page: dict[str, Any] = {"Shards": self.shard_list[start : start + 2]}
        if start + 2 < len(self.shard_list):
            page["NextToken"] = str(start + 2)
        return page

    def get_shard_iterator(self, **kwargs: Any) -> dict[str, Any]:
        self._maybe_fail("GetShardIterator")
        shard_id = kwargs["ShardId"]
        start = 0
        if kwargs["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER":
            start = int(kwargs["StartingSequenceNumber"].rsplit("-", 1)[1]) + 1  # "<shard ID>-<n>"
        return {"ShardIterator": f"{shard_id}|{start}"}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:  # noqa: N803 (boto3's names)
        shard_id, _, start_text = ShardIterator.partition("|")
        self.calls.append(("GetRecords", shard_id))
        self._maybe_fail("GetRecords")
        start = int(start_text)
        ids = self.records.get(shard_id, [])
        chunk = ids[start : start + min(Limit, self.page)]
        records = [
            {
                "SequenceNumber": f"{shard_id}-{start + n}",
                "PartitionKey": i,
                "Data": json.dumps({"eventId": i}).encode(),
            }
            for n, i in enumerate(chunk)
        ]
        end = start + len(chunk)
        if not self._open(shard_id) and end >= len(ids):
            return {"Records": records, "ChildShards": []}  # AWS: no NextShardIterator at a closed shard's end
        behind = 0 if end >= len(ids) else 1000
        return {"Records": records, "NextShardIterator": f"{shard_id}|{end}", "MillisBehindLatest": behind}


class FakeTime:
    """A clock that only sleeping advances."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def shard(shard_id: str, closed: bool = False, parent: str | None = None) -> dict[str, Any]:
    numbers = {"StartingSequenceNumber": "0", **({"EndingSequenceNumber": "9"} if closed else {})}
    return {"ShardId": shard_id, "SequenceNumberRange": numbers, **({"ParentShardId": parent} if parent else {})}


def resharded() -> FakeKinesis:
    """Shard 0 split into 2 and 3 (listed before it); shard 1 open; records in parent and children."""
    shards = [shard("s-2", parent="s-0"), shard("s-3", parent="s-0"), shard("s-0", closed=True), shard("s-1")]
    records = {"s-0": ["a", "b", "c"], "s-1": ["d"], "s-2": ["e", "f", "g", "h", "i"], "s-3": []}
    return FakeKinesis(shards, records)


def reader_for(fake: FakeKinesis, time_: FakeTime, **kwargs: Any) -> StreamReader:
    return StreamReader(fake, Progress(io.StringIO()), sleep=time_.sleep, clock=time_.clock, workers=1, **kwargs)


def event_ids(reader: StreamReader) -> list[str]:
    return reader.read("s", "target", lambda _shard, r: str(r["PartitionKey"]))


def test_reader_reads_every_shard_parents_first_to_its_end() -> None:
    """A closed parent ends at its null iterator, open shards at an empty caught-up page; parents come first."""
    fake = resharded()
    assert event_ids(reader_for(fake, FakeTime())) == ["a", "b", "c", "e", "f", "g", "h", "i", "d"]


def test_reader_keeps_five_get_records_per_second_per_shard() -> None:
    """Successive GetRecords calls on one shard are at least 0.2 s apart."""
    fake, time_ = resharded(), FakeTime()
    stamps: list[tuple[str, float]] = []
    original = fake.get_records

    def timed(ShardIterator: str, Limit: int) -> dict[str, Any]:  # noqa: N803
        stamps.append((ShardIterator.partition("|")[0], time_.now))
        return original(ShardIterator=ShardIterator, Limit=Limit)

    fake.get_records = timed  # type: ignore[method-assign]
    event_ids(reader_for(fake, time_))
    for shard_id in {s for s, _ in stamps}:
        times = [t for s, t in stamps if s == shard_id]
        assert all(b - a >= GET_RECORDS_INTERVAL_S - 1e-9 for a, b in zip(times, times[1:], strict=False))


def test_reader_retries_throttling_and_renews_an_expired_iterator() -> None:
    """Throttled calls are retried with backoff; an expired iterator resumes after the last record read."""
    fake = resharded()
    fake.fail = {
        "ListShards": ["LimitExceededException"],
        "GetRecords": ["ProvisionedThroughputExceededException", "ExpiredIteratorException"],
    }
    assert event_ids(reader_for(fake, FakeTime())) == ["a", "b", "c", "e", "f", "g", "h", "i", "d"]


def test_reader_stops_at_once_on_a_fatal_error() -> None:
    """A missing stream is a FatalAwsError, not retried."""
    fake = resharded()
    fake.fail = {"ListShards": ["ResourceNotFoundException"] * 5}
    with pytest.raises(FatalAwsError, match="ResourceNotFoundException"):
        event_ids(reader_for(fake, FakeTime()))
    assert len(fake.fail["ListShards"]) == 4


def test_reader_gives_up_after_its_retry_budget() -> None:
    """Throttling that never ends is raised after max_attempts calls instead of hanging the audit."""
    fake = resharded()
    fake.fail = {"GetRecords": ["ProvisionedThroughputExceededException"] * 10}
    with pytest.raises(TransientAwsError, match="ProvisionedThroughputExceededException"):
        event_ids(reader_for(fake, FakeTime(), max_attempts=3))


def test_lineage_order_puts_parents_before_children() -> None:
    """Children listed before their parents (a merge has two) are moved after them."""
    shards = [shard("m", parent="p"), shard("x")]
    shards[0]["AdjacentParentShardId"] = "q"
    shards += [shard("q", closed=True, parent="r"), shard("p", closed=True), shard("r", closed=True)]
    assert [s["ShardId"] for s in lineage_order(shards)] == ["p", "r", "q", "m", "x"]


def test_progress_prints_at_most_one_line_per_interval() -> None:
    """Progress goes to its stream no more than once per two seconds, with records and shards per stream."""
    out, time_ = io.StringIO(), FakeTime()
    progress = Progress(out, clock=time_.clock)
    progress.start("staging", 2)
    for _ in range(100):
        progress.records("staging", 10)
        time_.now += 0.1
    progress.shard_done("staging")
    lines = out.getvalue().splitlines()
    assert 4 <= len(lines) <= 5
    assert lines[-1].startswith("verify: reading: staging ") and "/2 shards done" in lines[-1]


def settings() -> PlanSettings:
    return PlanSettings(JSON_KEY, "deadletter", "dlq", "staging", "shardId-000000000000")


def test_dead_letter_envelopes_give_back_the_original_event_id() -> None:
    """The ID inside an envelope is found; a truncated envelope, an unkeyed one, or a record that is not an
    envelope at all has none."""
    keyed = SourceRecord(Position(1, 0), "pk", b'{"eventId": "e-1"}')
    envelope = dead_letter_envelope(settings(), keyed, "record exceeds the target's size limit")
    assert dead_letter_event_id(JSON_KEY, "pk", envelope) == "e-1"
    assert dead_letter_event_id(DedupKey("partitionKey"), "pk", envelope) == "pk"
    huge = SourceRecord(Position(2, 0), "pk", json.dumps({"eventId": "e-2", "pad": "x" * 1_100_000}).encode())
    assert dead_letter_event_id(JSON_KEY, "pk", dead_letter_envelope(settings(), huge, "too large")) is None
    unkeyed = SourceRecord(Position(3, 0), "pk", b"not json")
    assert dead_letter_event_id(JSON_KEY, "pk", dead_letter_envelope(settings(), unkeyed, "no event ID")) is None
    assert dead_letter_event_id(JSON_KEY, "pk", b'{"eventId": "raw"}') is None


def test_manifest_ignores_blank_lines_and_reads_stdin() -> None:
    """One ID a line, surrounding blanks dropped; '-' reads standard input; a JSON object line gives a typed ID
    and the record's key and SHA-256."""
    ids = [p.event_id for p in read_manifest("-", io.StringIO("a\n\n b \r\n\nc"))]
    assert ids == ["a", "b", "c"]
    (typed,) = read_manifest("-", io.StringIO('{"eventId": 7, "partitionKey": "k", "sha256": "ab"}\n'))
    assert (typed.event_id, typed.partition_key, typed.sha256) == (7, "k", "ab")


def test_text_report_format() -> None:
    """The report: the count lines, one line of examples per problem, then the verdict naming what failed."""
    letter = DeadLetter("s", "1", reason="no event ID: x", event_id="c")
    report = audit(["a", "b", "c", 1], [TargetRecord(1, "k", "s")], [letter], examples=5)
    result = VerifyResult(report, "manifest", 4, 0, "t", "dlq")
    assert render_text(result) == (
        "verify: produced 4 distinct events (4 manifest lines)\n"
        "target: 1 records; dead-letter: 1 records\n"
        "lost: 2, pending: 0 (in staging after the copier's committed position), duplicated: 0 "
        "(0 unexplained copies), changed: 0, unexpected: 0, out of order (per partition key): 0\n"
        "without an event ID: 0 produced, 0 lost, 0 pending, 0 extra copies (0 unexplained); in the target without an "
        "ID: 0 (0 never produced)\n"
        "dead-letter stream: 1 events delivered there, 0 invalid records; possible_duplicates reports: 0 naming 0 "
        "IDs and 0 records without an ID\n"
        "  lost: a, b\n"
        "  dead-lettered (1, delivered there): c\n"
        "verify: FAILED (lost 2)"
    )


def test_a_lone_surrogate_in_an_event_id_or_a_key_prints_as_its_escape() -> None:
    """JSON can carry an event ID "\\ud800x", which has no UTF-8 form: the text report printed it as is and the
    print failed (UnicodeEncodeError) after the whole audit had run. It shows the escape instead."""
    report = audit(["\ud800x"], [TargetRecord(None, "k\udc00", "s", "9")], examples=5)
    text = render_text(VerifyResult(report, "manifest", 1, 0, "t", None))
    text.encode("utf-8")
    assert "lost: \\ud800x" in text and "partition key k\\udc00" in text


def test_an_envelope_nested_too_deep_to_read_is_no_envelope() -> None:
    """A dead-letter record of JSON nested past Python's recursion limit is judged, not an error that ends the
    audit."""
    deep = b"[" * 100_000 + b"]" * 100_000
    letter = read_envelope(DedupKey("json", ("eventId",)), "s", {"SequenceNumber": "1", "Data": deep})
    assert letter.problem is not None and "not JSON" in letter.problem


# -- against the local backend, through a process, as an operator runs it ---------------------------


def verify(pipeline: Pipeline, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", HARNESS, "--properties", str(pipeline.properties), *args],
        capture_output=True,
        text=True,
        input=stdin,
        cwd=ROOT,
        env={**os.environ, **DUMMY_ENV},
        timeout=120,
    )


def put(pipeline: Pipeline, stream: str, event_ids: Iterable[str], key: str | None = None) -> None:
    """Events as the producer writes them: JSON with an eventId, partition key k<n> unless given."""
    entries = [
        {"PartitionKey": key or f"k{int(i.split('-')[1]) % 3}", "Data": json.dumps({"eventId": i}).encode()}
        for i in event_ids
    ]
    for start in range(0, len(entries), 500):
        answer = pipeline.kinesis.put_records(StreamName=stream, Records=entries[start : start + 500])
        assert answer["FailedRecordCount"] == 0


def copier_passed_everything(pipeline: Pipeline, staging: str | None = None) -> None:
    """The copier's state as after a run that passed every staging record: each staging shard committed at
    its last record, the last event of an aggregate included (a missing event is then lost, not pending)."""
    stream = staging or pipeline.staging
    store = DynamoStateStore(load_config(pipeline.properties))
    for shard in pipeline.kinesis.list_shards(StreamName=stream)["Shards"]:
        last = last_sequence(pipeline, stream, shard["ShardId"])
        if last is not None:
            key = shard_key(stream, shard["ShardId"])
            done = ShardState(position=Position(int(last), 2**31), version=1)
            store.replace_if_unchanged(key, store.get(key), done)


def last_sequence(pipeline: Pipeline, stream: str, shard_id: str) -> str | None:
    iterator = pipeline.kinesis.get_shard_iterator(
        StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    last = None
    while iterator:
        page = pipeline.kinesis.get_records(ShardIterator=iterator, Limit=10000)
        if not page["Records"]:
            break
        last = page["Records"][-1]["SequenceNumber"]
        iterator = page.get("NextShardIterator")
    return last


def events(n: int, start: int = 0) -> list[str]:
    return [f"e-{i}" for i in range(start, start + n)]


def test_a_clean_copy_verifies_ok(pipeline: Pipeline) -> None:
    """Staging with producer retries and a target holding each event once: status 0 and all zeros."""
    put(pipeline, pipeline.staging, events(20) + ["e-3", "e-7"])
    put(pipeline, pipeline.target, events(20))
    result = verify(pipeline)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        "verify: produced 20 distinct events (22 records in staging)\n"
        "target: 20 records; dead-letter: none configured\n"
        "lost: 0, pending: 0 (in staging after the copier's committed position), duplicated: 0 "
        "(0 unexplained copies), changed: 0, unexpected: 0, out of order (per partition key): 0\n"
        "without an event ID: 0 produced, 0 lost, 0 pending, 0 extra copies (0 unexplained); in the target without an "
        "ID: 0 (0 never produced)\n"
        "dead-letter stream: 0 events delivered there, 0 invalid records; possible_duplicates reports: 0 naming 0 "
        "IDs and 0 records without an ID\n"
        "verify: OK\n"
    )


def test_a_lost_and_a_duplicated_event_fail_with_examples(pipeline: Pipeline) -> None:
    """One event missing and one twice in the target: status 1, both named as examples."""
    put(pipeline, pipeline.staging, events(10))
    put(pipeline, pipeline.target, [i for i in events(10) if i != "e-4"] + ["e-6"])
    copier_passed_everything(pipeline)
    result = verify(pipeline)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "target: 10 records; dead-letter: none configured"
    assert lines[2].startswith("lost: 1, pending: 0 (in staging after the copier's committed position), duplicated: 1 ")
    assert "  lost: e-4" in lines
    assert "  duplicated (1 extra copies, 0 reported): e-6 x2" in lines
    assert lines[-1] == "verify: FAILED (lost 1, unexplained copies 1)"


def test_an_event_without_an_id_three_times_in_the_target_fails_unless_reports_name_it(pipeline: Pipeline) -> None:
    """Staging holds a record without an event ID once; the target three times. Before, verify counted two extra
    copies and said OK; now they fail it unless possible_duplicates lines name the record (its content digest,
    as the copier logs it), one copy a name, within their windows."""
    put(pipeline, pipeline.staging, events(5))
    put(pipeline, pipeline.target, events(5))
    pipeline.kinesis.put_record(StreamName=pipeline.staging, PartitionKey="hb", Data=b"heartbeat")
    for _ in range(3):
        pipeline.kinesis.put_record(StreamName=pipeline.target, PartitionKey="hb", Data=b"heartbeat")
    copier_passed_everything(pipeline)
    bare = verify(pipeline)
    assert bare.returncode == 1, bare.stderr
    lines = bare.stdout.splitlines()
    assert lines[3].startswith("without an event ID: 1 produced, 0 lost, 0 pending, 2 extra copies (2 unexplained)")
    assert lines[-1] == "verify: FAILED (unexplained copies without an ID 2)"
    name = content_name("hb", b"heartbeat")
    line = {"event": "possible_duplicates", "event_ids": [], "unkeyed_digests": [name], "window_from_ms": 0}
    reports = pipeline.tmp / "journal.log"
    reports.write_text(json.dumps(line) + "\n")
    once = verify(pipeline, "--reports", str(reports), "--json")
    assert once.returncode == 1, once.stderr
    counted = json.loads(once.stdout)
    assert (counted["explained_copies_without_id"], counted["unexplained_copies_without_id"]) == (1, 1)
    reports.write_text(f"{json.dumps(line)}\nnot a log line\n{json.dumps(line)}\n")
    twice = verify(pipeline, "--reports", str(reports))
    assert twice.returncode == 0, twice.stdout + twice.stderr
    assert twice.stdout.splitlines()[-1] == "verify: OK"


def test_a_manifest_replaces_the_staging_stream(pipeline: Pipeline) -> None:
    """Produced IDs come from the manifest file (blank lines ignored) or stdin, not from staging."""
    put(pipeline, pipeline.staging, ["e-99"])  # would be lost if staging were read
    put(pipeline, pipeline.target, events(5))
    manifest = pipeline.tmp / "manifest.txt"
    manifest.write_text("\n".join(events(5)) + "\n\ne-2\n")
    copier_passed_everything(pipeline)
    result = verify(pipeline, "--manifest", str(manifest))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "verify: produced 5 distinct events (6 manifest lines)"
    from_stdin = verify(pipeline, "--manifest", "-", "--examples", "1", stdin="e-0\ne-1\ne-7\ne-8\n")
    assert from_stdin.returncode == 1
    assert "  lost: e-7" in from_stdin.stdout.splitlines()


def test_an_event_in_the_dead_letter_stream_counts_as_delivered(pipeline: Pipeline) -> None:
    """An event dead-lettered in a valid envelope instead of forwarded is not lost: here a user record of a
    non-KPL aggregate with an empty partition key (which Kinesis refuses), pointing at its staging position."""
    dlq = f"{pipeline.target}-dlq"
    create_stream(pipeline.kinesis, dlq, 1)
    pipeline.write_properties(deadLetterStreamName=dlq)
    put(pipeline, pipeline.staging, events(5))
    odd = json.dumps({"eventId": "e-5"}).encode()
    (packed,) = kpl.aggregate([("k1", json.dumps({"eventId": "e-6"}).encode()), ("", odd)])
    answer = pipeline.kinesis.put_record(
        StreamName=pipeline.staging, PartitionKey="k1", Data=packed.data, ExplicitHashKey=packed.explicit_hash_key
    )
    put(pipeline, pipeline.target, events(5))
    put(pipeline, pipeline.target, ["e-6"], key="k1")
    original = SourceRecord(Position(int(answer["SequenceNumber"]), 1), "", odd)
    envelope = dead_letter_envelope(settings(), original, "partition key is empty")
    pipeline.kinesis.put_record(StreamName=dlq, PartitionKey="copier-x", Data=envelope)
    copier_passed_everything(pipeline)
    result = verify(pipeline, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    counts = ("lost", "dead_lettered_events", "dead_letter_stream_records", "invalid_dead_letter_records")
    assert tuple(doc[name] for name in counts) == (0, 1, 1, 0)
    assert doc["examples"]["dead_lettered_events"] == ["e-5"] and doc["dead_letter_stream"] == dlq


def test_a_record_in_the_dead_letter_stream_that_is_no_valid_envelope_fails(pipeline: Pipeline) -> None:
    """A bare {"eventId": ...}, or an envelope pointing at no staging record, delivers nothing: the event is
    lost and the record invalid (status 1)."""
    dlq = f"{pipeline.target}-dlq"
    create_stream(pipeline.kinesis, dlq, 1)
    pipeline.write_properties(deadLetterStreamName=dlq)
    put(pipeline, pipeline.staging, events(3))
    put(pipeline, pipeline.target, events(1))
    pipeline.kinesis.put_record(StreamName=dlq, PartitionKey="k1", Data=json.dumps({"eventId": "e-1"}).encode())
    invented = dead_letter_envelope(
        settings(), SourceRecord(Position(12345, 0), "k2", json.dumps({"eventId": "e-2"}).encode()), "no event ID: x"
    )
    pipeline.kinesis.put_record(StreamName=dlq, PartitionKey="k2", Data=invented)
    copier_passed_everything(pipeline)
    result = verify(pipeline, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert (doc["lost"], doc["invalid_dead_letter_records"]) == (2, 2)


def test_every_shard_of_a_resharded_target_is_read(pipeline: Pipeline) -> None:
    """A target of several shards, one split (closed parent, two children), is read to the end of each."""
    target = f"{pipeline.target}-resharded"
    create_stream(pipeline.kinesis, target, 3)
    pipeline.write_properties(targetStreamName=target)
    put(pipeline, pipeline.staging, events(300))
    put(pipeline, target, events(150))
    parent = pipeline.kinesis.list_shards(StreamName=target)["Shards"][0]
    low, high = int(parent["HashKeyRange"]["StartingHashKey"]), int(parent["HashKeyRange"]["EndingHashKey"])
    pipeline.kinesis.split_shard(
        StreamName=target, ShardToSplit=parent["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    put(pipeline, target, events(150, start=150))
    shards = pipeline.kinesis.list_shards(StreamName=target)["Shards"]
    assert len(shards) == 5 and "EndingSequenceNumber" in shards[0]["SequenceNumberRange"]
    copier_passed_everything(pipeline)
    result = verify(pipeline, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["target_records"], doc["expected_events"], doc["lost"], doc["out_of_order"]) == (300, 300, 0, 0)


def test_a_bad_properties_file_is_status_2_and_a_missing_stream_status_3(pipeline: Pipeline) -> None:
    """A malformed file stops before any AWS call; a target that does not exist is fatal."""
    bad = pipeline.tmp / "bad.properties"
    bad.write_text(Path(pipeline.properties).read_text().replace("json:eventId", "body"))
    result = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-c", HARNESS, "--properties", str(bad)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **DUMMY_ENV},
        timeout=60,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert re.match(rf"copier: {re.escape(str(bad))}:\d+: copier\.dedupKey: ", result.stderr)  # the value's line
    pipeline.write_properties(targetStreamName="no-such-stream")
    missing = verify(pipeline)
    assert missing.returncode == 3 and missing.stdout == ""
    assert "ResourceNotFoundException" in missing.stderr


# -- KPL aggregates in staging: read as the daemon delivers them ---------------------------------------


def aggregate_of(event_ids: list[str], explicit_hash_key: str | None = None) -> kpl.KinesisRecord:
    (record,) = kpl.aggregate([(i, json.dumps({"eventId": i}).encode()) for i in event_ids], explicit_hash_key)
    return record


def test_events_inside_an_aggregate_that_never_reached_the_target_are_lost(pipeline: Pipeline) -> None:
    """The case that said OK: one aggregate of 3 events and one plain event in staging, only the plain one copied."""
    record = aggregate_of(["agg-1", "agg-2", "agg-3"])
    pipeline.kinesis.put_record(
        StreamName=pipeline.staging,
        PartitionKey=record.partition_key,
        Data=record.data,
        ExplicitHashKey=record.explicit_hash_key,
    )
    put(pipeline, pipeline.staging, ["e-1"])
    put(pipeline, pipeline.target, ["e-1"])
    copier_passed_everything(pipeline)
    result = verify(pipeline)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "verify: produced 4 distinct events (2 records in staging, 1 of them KPL aggregates, 4 events in all)"
    )
    assert lines[2].startswith("lost: 3, pending: 0 (in staging after the copier's committed position), duplicated: 0 ")
    assert "  lost: agg-1, agg-2, agg-3" in lines
    assert lines[-1] == "verify: FAILED (lost 3)"


def test_an_aggregate_that_cannot_be_decoded_fails_the_audit(pipeline: Pipeline) -> None:
    """Magic bytes and a good MD5 around a broken protobuf: the daemon passes it through opaque, so the events
    inside cannot be counted; verify names the record and fails even though nothing else is wrong."""
    body = b"\x1a\x05\x08"  # a Record field that claims 5 bytes and holds 1
    broken = kpl.MAGIC + body + hashlib.md5(body).digest()
    pipeline.kinesis.put_record(StreamName=pipeline.staging, PartitionKey="x", Data=broken)
    put(pipeline, pipeline.staging, ["e-1"])
    put(pipeline, pipeline.target, ["e-1"])
    result = verify(pipeline, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert (doc["lost"], doc["duplicated"], doc["undecodable_aggregates"], doc["ok"]) == (0, 0, 1, False)
    assert doc["undecodable_examples"][0].startswith("shardId-000000000000@")


def test_an_aggregate_the_daemon_drops_is_reported_and_its_events_are_lost(pipeline: Pipeline) -> None:
    """A user record whose hash key lies outside the shard's range makes the KCL drop the whole aggregate."""
    two = f"{pipeline.staging}-two"
    create_stream(pipeline.kinesis, two, 2)
    pipeline.properties.write_text(pipeline.properties.read_text().replace(f"= {pipeline.staging}\n", f"= {two}\n"))
    shards = pipeline.kinesis.list_shards(StreamName=two)["Shards"]
    in_second = shards[1]["HashKeyRange"]["StartingHashKey"]
    # Routed to the first shard by its own explicit hash key, but its user records claim the second shard's range.
    message = aggregate_of(["d-1", "d-2"], explicit_hash_key=in_second)
    pipeline.kinesis.put_record(StreamName=two, PartitionKey="d", Data=message.data, ExplicitHashKey="0")
    copier_passed_everything(pipeline, two)
    result = verify(pipeline, "--json")
    doc = json.loads(result.stdout)
    assert (doc["dropped_aggregates"], doc["lost"], doc["examples"]["lost"]) == (1, 2, ["d-1", "d-2"])
    assert result.returncode == 1


def test_the_daemons_rules_for_aggregates() -> None:
    """Clean aggregates de-aggregate; broken ones pass through flagged; out-of-range ones are dropped whole."""
    record = aggregate_of(["a", "b"])
    view = kpl.as_daemon_delivers(record.data, record.partition_key, (0, 2**128 - 1))
    assert (view.aggregated, view.problem, [pk for pk, _ in view.records]) == (True, None, ["a", "b"])
    assert kpl.as_daemon_delivers(b'{"eventId": "p"}', "p").records == [("p", b'{"eventId": "p"}')]
    bad_md5 = kpl.MAGIC + b"\x0a\x01a" + b"\x00" * 16
    assert kpl.as_daemon_delivers(bad_md5, "k").problem == "undecodable"
    outside = kpl.as_daemon_delivers(record.data, record.partition_key, (0, 0))
    assert (outside.records, outside.problem) == ([], "out_of_range")


# -- run while the copier is behind: pending, not lost ------------------------------------------------


def commit_at(pipeline: Pipeline, event_id: str) -> None:
    """The copier's state as when it has committed up to ``event_id`` (a staging record of the one shard)."""
    shard = pipeline.kinesis.list_shards(StreamName=pipeline.staging)["Shards"][0]["ShardId"]
    iterator = pipeline.kinesis.get_shard_iterator(
        StreamName=pipeline.staging, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    records = pipeline.kinesis.get_records(ShardIterator=iterator, Limit=10000)["Records"]
    (seq,) = [r["SequenceNumber"] for r in records if json.loads(r["Data"])["eventId"] == event_id]
    store = DynamoStateStore(load_config(pipeline.properties))
    key = shard_key(pipeline.staging, shard)
    store.replace_if_unchanged(key, store.get(key), ShardState(position=Position.parse(seq), version=1))


def test_events_the_copier_has_not_reached_are_pending_and_a_passed_one_is_lost(pipeline: Pipeline) -> None:
    """Committed at e-5: e-6..e-9 missing from the target are pending; e-2, before it and missing, is lost."""
    put(pipeline, pipeline.staging, events(10))
    put(pipeline, pipeline.target, [i for i in events(6) if i != "e-2"])
    commit_at(pipeline, "e-5")
    for args in ((), ("--manifest", "-")):
        result = verify(pipeline, *args, stdin="\n".join(events(10)))
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[2].startswith("lost: 1, pending: 4 (in staging after the copier's committed position)"), lines
        assert "  lost: e-2" in lines and "  pending: e-6, e-7, e-8, e-9" in lines
        assert lines[-1] == "verify: FAILED (lost 1)"


def test_nothing_lost_and_some_pending_is_not_a_failure_and_says_so(pipeline: Pipeline) -> None:
    put(pipeline, pipeline.staging, events(10) + ["e-1"])
    put(pipeline, pipeline.target, events(6))
    commit_at(pipeline, "e-5")
    result = verify(pipeline)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == (
        "verify: PENDING (4 events not copied yet: in staging after the copier's committed position; nothing "
        "lost or duplicated so far; run it again once the copier has caught up)"
    )
    doc = json.loads(verify(pipeline, "--json").stdout)
    assert (doc["ok"], doc["complete"], doc["lost"], doc["pending"]) == (True, False, 0, 4)
    assert doc["examples"]["pending"] == ["e-6", "e-7", "e-8", "e-9"]


def test_a_shard_the_copier_never_started_is_all_pending(pipeline: Pipeline) -> None:
    put(pipeline, pipeline.staging, events(3))
    doc = json.loads(verify(pipeline, "--json").stdout)
    assert (doc["lost"], doc["pending"], doc["ok"], doc["complete"]) == (0, 3, True, False)


def test_without_the_copiers_positions_every_missing_event_is_lost_and_the_report_says_why(
    pipeline: Pipeline,
) -> None:
    put(pipeline, pipeline.staging, events(3))
    pipeline.dynamodb.delete_table(TableName=pipeline.table)
    result = verify(pipeline)
    assert result.returncode == 1
    assert "the copier's committed positions could not be read (" in result.stdout
    assert pipeline.table in result.stdout, "the report names the table it could not read"
    assert result.stdout.splitlines()[-1] == "verify: FAILED (lost 3)"


def test_the_audit_draws_pending_from_every_occurrence() -> None:
    """An ID with one occurrence the copier passed is lost even if another occurrence is still ahead; a
    closed shard has nothing ahead; a record without an ID ahead of the copier is pending too."""
    from copier.core.audit import PAST_THE_END, Produced

    def at(event_id: str | None, shard: str, seq: int) -> Produced:
        return Produced(event_id, "k", None, (shard, seq, 0))

    produced = [at("a", "s1", 5), at("a", "s2", 9), at("b", "s2", 9), at("c", "s3", 1), at(None, "s2", 10)]
    committed = {"s1": Position(7), "s2": Position(8), "s3": PAST_THE_END}
    r = audit(produced, [], committed=committed)
    assert (r.lost, r.pending, r.unkeyed_lost, r.unkeyed_pending) == (2, 1, 0, 1)
    assert r.lost_examples == ("a", "c") and r.pending_examples == ("b",)
    assert (r.ok, r.complete) == (False, False)
    assert (audit(produced, []).lost, audit(produced, []).pending) == (3, 0), "no positions: every missing one lost"
