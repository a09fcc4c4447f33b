"""``copier audit`` (the Spark job) on redriven dead-letter records, without Spark: the rows it reads.

A dead-letter record a redrive sent on to the target is no copy of its own
(``copier.core.audit.was_redriven``, the rule ``copier verify`` and the chaos
check judge by); the job reads which were sent from the names ``copier
export`` keeps beside the dead-letter files (``_redriven.txt``) or from
``--redriven``. The whole job on a real redrive: tests/test_audit_job.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from copier.adapters.shardfiles import record_line, write_redriven
from copier.core.audittypes import content_name, digest_name
from copier.core.config import parse_dedup_key
from copier.core.identity import id_digest
from copier.core.plan import PlanSettings, SourceRecord, dead_letter_envelope
from copier.core.positions import Position
from copier.spark.audit import redriven_names

KEY = parse_dedup_key("json:eventId")
SETTINGS = PlanSettings(KEY, "forward", "dlq", "staging", "shardId-000000000000")
OVERSIZE = "record of 1048577 bytes exceeds the target's limit of 1048576 bytes"


def _line(partition_key: str, data: bytes) -> str:
    record = {"SequenceNumber": "1", "PartitionKey": partition_key, "Data": data}
    return json.dumps({"order": 0, **record_line("shardId-000000000000", record)})


def _sent(line: str, redriven: set[str]) -> bool:
    """The job's row for this dead-letter line: was it sent on by a redrive (its last column)?"""
    from copier.spark.audit import _records

    (row,) = list(_records(iter([(line, 0)]), KEY, "export", True, redriven))
    assert isinstance(row[-1], bool)
    return row[-1]


def test_a_dead_letter_record_a_redrive_sent_is_marked_by_its_own_name_or_its_events_id() -> None:
    envelope = dead_letter_envelope(SETTINGS, SourceRecord(Position(7), "k7", b'{"eventId": "e7"}'), OVERSIZE)
    line = _line("k7", envelope)
    assert _sent(line, {content_name("k7", envelope)})
    assert _sent(line, {digest_name(id_digest("e7"))})
    assert not _sent(line, set()), "still only in the dead-letter stream: dead-lettered, not sent"
    assert not _sent(line, {digest_name(id_digest("e8"))})


def test_a_record_that_is_no_envelope_is_never_taken_as_redriven() -> None:
    data = b'{"eventId": "e5"}'
    assert not _sent(_line("k5", data), {content_name("k5", data), digest_name(id_digest("e5"))})


def test_the_names_are_read_from_an_exports_directory_and_from_files(tmp_path: Path) -> None:
    dlq = tmp_path / "dlq"
    dlq.mkdir()
    write_redriven(dlq, ["b", "a"])
    extra = tmp_path / "more.txt"
    extra.write_text("c\n\n")
    assert redriven_names([str(dlq), "s3://bucket/dlq"], [str(extra)]) == {"a", "b", "c"}
    assert redriven_names([str(tmp_path)], []) == set(), "a directory without the file: nothing was redriven"
