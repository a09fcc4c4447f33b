"""What the audit is fed, read from raw input: records, dead-letter envelopes, manifests, log lines.

Each reader turns one raw thing into the audit's value types
(``copier.core.audittypes``), by the copier's own rules, so that the verdict
sees what the copier saw:

* a Kinesis record's event ID (as the copier extracts it), arrival time and
  the SHA-256 of its bytes;
* a dead-letter record as an envelope (``copier.core.plan.dead_letter_envelope``)
  or why it is not one;
* a manifest of produced events (``copier verify --manifest``), one a line;
* the copier's ``possible_duplicates`` log lines (``--reports``), raw or as
  the KCL MultiLangDaemon wraps them.

No AWS here: the streams are read by ``copier.adapters.streamreader``; the only I/O
is reading a manifest (a file or stdin) or a log file named on the command line.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable
from typing import Any, TextIO

from copier.core.audittypes import DeadLetter, DuplicateReport, Produced, content_name
from copier.core.config import DedupKey
from copier.core.envelope import read_envelope_bytes
from copier.core.errors import ConfigError
from copier.core.identity import EventId, EventValue, extract_event_id

__all__ = [
    "arrival_ms",
    "dead_letter_event_id",
    "duplicate_report",
    "event_id_in",
    "log_event",
    "manifest_entry",
    "read_envelope",
    "read_manifest",
    "read_reports",
    "record_event_id",
    "report_of",
    "sha256_hex",
]

KinesisRecord = dict[str, Any]  # a record as GetRecords returns it (copier.adapters.streamreader.KinesisRecord)


def event_id_in(key: DedupKey, partition_key: str, data: bytes) -> EventValue | None:
    """A record's event ID as the copier reads it (None: it has none)."""
    found = extract_event_id(key, partition_key, data)
    return found.value if isinstance(found, EventId) else None


def record_event_id(key: DedupKey, record: KinesisRecord) -> EventValue | None:
    """The record's event ID as the copier would see it, or None when it has none."""
    return event_id_in(key, record["PartitionKey"], bytes(record["Data"]))


def arrival_ms(record: KinesisRecord) -> int:
    """A record's ApproximateArrivalTimestamp in epoch milliseconds (botocore parses it to a datetime)."""
    stamp = record.get("ApproximateArrivalTimestamp")
    if stamp is None:
        return 0
    return int(stamp.timestamp() * 1000) if hasattr(stamp, "timestamp") else int(float(stamp) * 1000)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_envelope(key: DedupKey, shard_id: str, record: KinesisRecord) -> DeadLetter:
    """A dead-letter record as the audit judges it: the envelope's fields (copier.core.plan.dead_letter_envelope),
    or why it is not an envelope (``copier.core.envelope``). The original's SHA-256 is computed from its data, or
    taken from ``dataSha256`` when the data was too large to keep. ``content``: the dead-letter record's own
    content name (its key and envelope bytes: how a redrive names what it sent)."""
    where = {"shard_id": shard_id, "sequence_number": record["SequenceNumber"], "arrival_ms": arrival_ms(record)}
    envelope = read_envelope_bytes(bytes(record["Data"]))
    if envelope.problem is not None:
        return DeadLetter(**where, problem=envelope.problem)
    event_id: EventValue | None = None
    if envelope.data is not None:
        digest: str | None = sha256_hex(envelope.data)
        event_id = event_id_in(key, envelope.partition_key, envelope.data)
    else:
        digest = envelope.sha256
    return DeadLetter(
        **where,
        reason=envelope.reason,
        position=(envelope.shard_id, envelope.position.seq, envelope.position.subseq),
        partition_key=envelope.partition_key,
        sha256=digest,
        event_id=event_id,
        content=content_name(record["PartitionKey"], bytes(record["Data"])),
    )


def dead_letter_event_id(key: DedupKey, partition_key: str, data: bytes) -> EventValue | None:
    """The event ID of the original record inside a dead-letter envelope (None: no envelope, or the data was
    too large to keep; the audit checks envelopes in full, see :func:`read_envelope`)."""
    letter = read_envelope(key, "", {"SequenceNumber": "", "Data": data, "PartitionKey": partition_key})
    return letter.event_id if letter.problem is None else None


def read_manifest(path: str, stdin: TextIO | None = None) -> list[Produced]:
    """Produced events in production order, one a line; blank lines ignored; '-' reads stdin.

    A line is an event ID (a string), or a JSON object: ``{"eventId": ID}``
    (an integer ID, or a string with characters a line cannot hold), with
    optionally ``"partitionKey"`` and ``"sha256"`` (hex of the record's
    bytes): then every target copy must have that key and those bytes. A
    record written without an event ID is ``{"eventId": null}`` with both
    ``"partitionKey"`` and ``"sha256"``: it must be delivered as often as it
    was written, copies beyond that explained by reports, as any event.
    """
    if path == "-":
        return _manifest_lines(stdin or sys.stdin, path)
    try:
        with open(path, encoding="utf-8") as f:
            return _manifest_lines(f, path)
    except OSError as exc:
        raise ConfigError(path, "--manifest", f"cannot read the file: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(path, "--manifest", "not UTF-8 text") from None


def _manifest_lines(lines: Iterable[str], path: str) -> list[Produced]:
    out: list[Produced] = []
    for number, raw in enumerate(lines, 1):
        try:
            entry = manifest_entry(raw, number)
        except ValueError as exc:
            raise ConfigError(path, "--manifest", str(exc)) from None
        if entry is not None:
            out.append(entry)
    return out


def manifest_entry(raw: str, number: int) -> Produced | None:
    """One manifest line (see :func:`read_manifest`); None for a blank one, ValueError for a bad one."""
    line = raw.strip()
    if not line:
        return None
    if not line.startswith("{"):
        return Produced(line)
    try:
        doc = json.loads(line)
        value = doc["eventId"]
        if value is None and not (isinstance(doc.get("partitionKey"), str) and isinstance(doc.get("sha256"), str)):
            raise ValueError("a record without an event ID (eventId null) needs its partitionKey and sha256")
        if isinstance(value, bool) or not isinstance(value, str | int | None):
            raise ValueError("eventId is not a string, an integer or null")
        return Produced(value, doc.get("partitionKey"), doc.get("sha256"))
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"line {number}: not an event ID nor a manifest object: {exc}") from None


def read_reports(path: str) -> list[DuplicateReport]:
    """``possible_duplicates`` lines from a copier journal (JSON log lines; other lines are skipped)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [r for r in (duplicate_report(line) for line in f) if r is not None]
    except OSError as exc:
        raise ConfigError(path, "--reports", f"cannot read the file: {exc.strerror or exc}") from None


def log_event(line: str) -> dict[str, Any] | None:
    """The copier's JSON event in a log line: the line itself, or the daemon's wrapping of it
    (``... Received error line from subprocess [{json}] for shard X``): the outermost object is taken."""
    start, end = line.find("{"), line.rfind("}")
    if start < 0 or end < start:
        return None
    try:
        event = json.loads(line[start : end + 1])
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("event"), str) else None


def duplicate_report(line: str) -> DuplicateReport | None:
    """A ``possible_duplicates`` log line (raw or wrapped by the daemon) as the audit uses it; None for any
    other line."""
    event = log_event(line)
    return report_of(event) if event is not None else None


def report_of(event: dict[str, Any]) -> DuplicateReport | None:
    """A ``possible_duplicates`` log event as the audit uses it; None for any other event."""
    if event.get("event") != "possible_duplicates":
        return None
    return DuplicateReport(
        tuple(event.get("event_ids", ())),
        int(event.get("window_from_ms", 0)),
        None if event.get("window_until_ms") is None else int(event["window_until_ms"]),
        str(event.get("shard", "")),
        int(event.get("batch", 0)),
        tuple(str(name) for name in event.get("unkeyed_digests", ())),
    )
