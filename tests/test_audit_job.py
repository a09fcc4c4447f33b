"""``copier export`` and ``copier audit`` (Spark, local mode) against ``copier verify`` on the same data.

The target is built by hand on the local backend with one of each problem:
a lost event, a duplicate, an unexpected event, a record without an ID, two
events of one partition key out of production order, an event that went to
the dead-letter stream, and one that went there and was sent on to the target
by a real ``copier redrive``. verify reads the streams; audit reads what
export wrote from them (and, as Firehose would deliver it, the bare records):
the reports must agree, count for count and example for example.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from copier.core.audittypes import content_name
from copier.core.config import parse_dedup_key
from copier.core.plan import PlanSettings, SourceRecord, dead_letter_envelope
from copier.core.positions import Position
from copier.local.backend import DUMMY_ENV
from copier.local.multilang import COPIER
from tests.support.backend import client, create_stream, local_backend
from tests.support.props import write_properties

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]
SETTINGS = PlanSettings(
    parse_dedup_key("json:eventId"), "forward", "audit-dlq", "audit-staging", "shardId-000000000000"
)
OVERSIZE = "record of 1048577 bytes exceeds the target's limit of 1048576 bytes"

REPORT_KEYS = (
    "expected_events",
    "produced_events",
    "target_records",
    "dead_letter_stream_records",
    "redriven_dead_letter_records",
    "lost",
    "duplicated",
    "extra_copies",
    "unexpected",
    "target_records_without_id",
    "dead_lettered_events",
    "invalid_dead_letter_records",
    "changed",
    "explained_copies",
    "unexplained_copies",
    "out_of_order",
    "produced_without_id",
    "lost_without_id",
    "extra_copies_without_id",
    "explained_copies_without_id",
    "unexplained_copies_without_id",
    "unexpected_without_id",
    "reported_without_id",
    "examples",
    "ok",
)


def _run(*args: str) -> tuple[int, str, str]:
    env = {**os.environ, **DUMMY_ENV, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run([COPIER, *args], capture_output=True, text=True, env=env, timeout=500)
    return done.returncode, done.stdout, done.stderr


def _event(event_id: str) -> bytes:
    return json.dumps({"eventId": event_id, "v": 1}).encode()


def _build(endpoint: str, tmp_path: Path) -> tuple[Path, Path]:
    kinesis = client("kinesis", endpoint)
    create_stream(kinesis, "audit-target", 2)
    create_stream(kinesis, "audit-dlq", 1)
    create_stream(kinesis, "audit-staging", 1)  # empty: the manifest says what was produced
    produced = [f"e{n}" for n in range(60)] + ["e3"]  # a producer retry of e3: one event
    landed: list[tuple[str, bytes]] = [(f"k{n}", _event(f"e{n}")) for n in range(60) if n not in (5, 30, 31, 40, 41)]
    landed += [("k7", _event("e7")), ("kx", _event("x1")), ("ku", b"not json")]  # duplicate, unexpected, no ID
    landed += [("hot", _event("e31")), ("hot", _event("e30"))]  # one key, produced 30 then 31: out of order
    for key, data in landed:
        kinesis.put_record(StreamName="audit-target", PartitionKey=key, Data=data)
    original = SourceRecord(Position(40), "k40", _event("e40"))
    envelope = dead_letter_envelope(SETTINGS, original, OVERSIZE)
    kinesis.put_record(StreamName="audit-dlq", PartitionKey="k40", Data=envelope)
    # e41, dead-lettered from another staging shard, is what the redrive below sends on (--shard selects it).
    elsewhere = replace(SETTINGS, shard_id="shardId-000000000001")
    late = dead_letter_envelope(elsewhere, SourceRecord(Position(41), "k41", _event("e41")), OVERSIZE)
    kinesis.put_record(StreamName="audit-dlq", PartitionKey="k41", Data=late)
    # Not an envelope: it delivers nothing (e31's copy stands; e5 stays lost), and fails both reports.
    kinesis.put_record(StreamName="audit-dlq", PartitionKey="k5", Data=json.dumps({"eventId": "e5"}).encode())
    manifest = tmp_path / "manifest" / "ids-000.txt"
    manifest.parent.mkdir()
    manifest.write_text("".join(f"{i}\n" for i in produced))
    props = write_properties(
        tmp_path / "p.properties",
        endpoint,
        "audit-staging",
        "audit-target",
        "audit-state",
        deadLetterStreamName="audit-dlq",
    )
    for command in (["init"], ["redrive", "--shard", "shardId-000000000001"]):
        status, out, err = _run(*command, "--properties", str(props))
        assert status == 0, out + err[-3000:]
    return props, manifest.parent


def _report(stdout: str) -> dict[str, Any]:
    data = json.loads(stdout)
    return {k: data[k] for k in REPORT_KEYS}


def test_audit_and_verify_report_the_same_on_the_same_data(tmp_path: Path) -> None:
    with local_backend() as endpoint:
        props, manifest = _build(endpoint, tmp_path)
        status, out, err = _run(
            "verify", "--properties", str(props), "--manifest", str(manifest / "ids-000.txt"), "--json"
        )
        assert status == 1, err
        verified = _report(out)
        for stream, where in (("target", "target"), ("deadletter", "dlq")):
            status, _, err = _run(
                "export", "--properties", str(props), "--stream", stream, "--out", str(tmp_path / where), "--gzip"
            )
            assert status == 0, err
    counts = ("lost", "duplicated", "unexpected", "target_records_without_id")
    assert tuple(verified[k] for k in counts) == (1, 1, 1, 1)
    counts = ("out_of_order", "dead_lettered_events", "invalid_dead_letter_records")
    assert tuple(verified[k] for k in counts) == (1, 1, 1)
    assert verified["redriven_dead_letter_records"] == 1, "e41: its target copy counts, not its dead-letter record"
    assert verified["examples"]["duplicated"] == [{"event_id": "e7", "copies": 2}], verified["examples"]
    assert (tmp_path / "dlq" / "_redriven.txt").read_text().count("\n") == 2, "e41's record, and its ID"

    audit = ["audit", "--properties", str(props), "--manifest", str(manifest), "--json"]
    status, out, err = _run(*audit, "--target", str(tmp_path / "target"), "--dead-letter", str(tmp_path / "dlq"))
    assert status == 1, err[-3000:]
    assert _report(out) == verified
    assert "[Stage" not in err, "stderr is no terminal: whole lines, not Spark's carriage-return bar"

    # The same records as a Firehose delivery writes them: each record alone on its line, gzip.
    firehose = tmp_path / "firehose"
    firehose.mkdir()
    for source, name in ((tmp_path / "target", "target"), (tmp_path / "dlq", "dlq")):
        files = [f for f in sorted(source.iterdir()) if not f.name.startswith("_")]  # the records, not _redriven.txt
        lines = [json.loads(line) for f in files for line in gzip.open(f, "rt")]
        with gzip.open(firehose / f"{name}.gz", "wt") as out_file:
            out_file.writelines(base64.b64decode(line["data"]).decode(errors="replace") + "\n" for line in lines)
    status, out, err = _run(
        *audit,
        "--format",
        "firehose",
        "--target",
        str(firehose / "target.gz"),
        "--dead-letter",
        str(firehose / "dlq.gz"),
        "--redriven",
        str(tmp_path / "dlq" / "_redriven.txt"),  # Firehose delivers no such record: the export's
    )
    assert status == 1, err[-3000:]
    bare = _report(out)
    keys = ("expected_events", "produced_events", "target_records", "lost", "duplicated", "extra_copies")
    for key in (
        *keys,
        "redriven_dead_letter_records",
        "unexpected",
        "target_records_without_id",
        "invalid_dead_letter_records",
        "dead_lettered_events",
    ):
        assert bare[key] == verified[key], key
    assert bare["out_of_order"] == 0, "Firehose files carry no partition key: order is not measured"
    assert bare["examples"]["lost"] == verified["examples"]["lost"]


def test_an_event_without_an_id_three_times_fails_verify_and_audit_alike_unless_reports_name_it(
    tmp_path: Path,
) -> None:
    """A record written once without an event ID (in the manifest by its key and bytes) is in the target three
    times: verify and audit both fail on the two extra copies, count for count; with the copier's
    possible_duplicates lines naming it twice (its content digest), both pass."""
    heartbeat = b"heartbeat"
    name = content_name("hb", heartbeat)
    line = {"event": "possible_duplicates", "event_ids": [], "unkeyed_digests": [name], "window_from_ms": 0}
    reports = tmp_path / "journal.log"
    reports.write_text(f"{json.dumps(line)}\n{json.dumps(line)}\n")
    manifest = tmp_path / "manifest" / "ids-000.txt"
    manifest.parent.mkdir()
    entry = {"eventId": None, "partitionKey": "hb", "sha256": hashlib.sha256(heartbeat).hexdigest()}
    manifest.write_text("".join(f"e{n}\n" for n in range(5)) + json.dumps(entry) + "\n")
    with local_backend() as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "thrice-target", 2)
        for key, data in [(f"k{n}", _event(f"e{n}")) for n in range(5)] + [("hb", heartbeat)] * 3:
            kinesis.put_record(StreamName="thrice-target", PartitionKey=key, Data=data)
        props = write_properties(tmp_path / "p.properties", endpoint, "thrice-staging", "thrice-target", "t-state")
        verify = ["verify", "--properties", str(props), "--manifest", str(manifest), "--json"]
        verified = [_run(*verify), _run(*verify, "--reports", str(reports))]
        status, _, err = _run("export", "--properties", str(props), "--out", str(tmp_path / "target"))
        assert status == 0, err
    audit = ["audit", "--properties", str(props), "--manifest", str(manifest.parent), "--json"]
    audited = [
        _run(*audit, "--target", str(tmp_path / "target")),
        _run(*audit, "--target", str(tmp_path / "target"), "--reports", str(reports)),
    ]
    for (v_status, v_out, v_err), (a_status, a_out, a_err), wanted in zip(verified, audited, (1, 0), strict=True):
        assert (v_status, a_status) == (wanted, wanted), v_err + a_err[-3000:]
        assert _report(a_out) == _report(v_out)
    bare, named = (_report(out) for _, out, _ in verified)
    counts = ("produced_without_id", "extra_copies_without_id", "unexplained_copies_without_id", "ok")
    assert tuple(bare[k] for k in counts) == (1, 2, 2, False)
    assert tuple(named[k] for k in counts) == (1, 2, 0, True)
    assert named["explained_copies_without_id"] == named["reported_without_id"] == 2


def test_export_keeps_a_time_range_and_numbers_records_in_read_order(tmp_path: Path) -> None:
    """--since/--until keep the records that arrived in [since, until); order runs across shards."""
    import time

    with local_backend() as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "range-target", 2)
        for n in range(3):
            kinesis.put_record(StreamName="range-target", PartitionKey=f"early{n}", Data=_event(f"a{n}"))
        time.sleep(1.5)
        middle = time.time()
        time.sleep(1.5)
        for n in range(4):
            kinesis.put_record(StreamName="range-target", PartitionKey=f"late{n}", Data=_event(f"b{n}"))
        props = write_properties(tmp_path / "p.properties", endpoint, "range-staging", "range-target", "range-state")
        since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(middle))
        status, _, err = _run("export", "--properties", str(props), "--out", str(tmp_path / "late"), "--since", since)
        assert status == 0, err
        status, _, err = _run("export", "--properties", str(props), "--out", str(tmp_path / "early"), "--until", since)
        assert status == 0, err
    late = [json.loads(line) for f in sorted((tmp_path / "late").iterdir()) for line in f.open()]
    early = [json.loads(line) for f in sorted((tmp_path / "early").iterdir()) for line in f.open()]
    assert sorted(json.loads(base64.b64decode(r["data"]))["eventId"] for r in late) == ["b0", "b1", "b2", "b3"]
    assert sorted(json.loads(base64.b64decode(r["data"]))["eventId"] for r in early) == ["a0", "a1", "a2"]
    assert [r["order"] for r in late] == list(range(4)), "one numbering across the shards' files"
