"""``copier verify``: read what was produced and what the target holds, and audit exactly-once.

Read-only and safe against production: it lists shards and reads them from
TRIM_HORIZON with GetRecords, within the Kinesis read limits, and writes
nothing anywhere. The verdict itself is ``copier.audit``; this module reads
the streams, shows progress on stderr (a full read of a large stream takes
a while) and prints the one final report on stdout.

Produced IDs come from a manifest (one event ID per line, production order)
or, without one, from the staging stream itself: the staging stream holds
every event the producer wrote, duplicates included, so its distinct IDs are
exactly what the target must hold. Staging records are read as the KCL
MultiLangDaemon delivers them to the copier: KPL-aggregated records are
de-aggregated by the daemon's rules (``copier.kpl.as_daemon_delivers``), so
every event inside an aggregate is expected in the target. An aggregate
that cannot be decoded is a problem of its own and fails the audit: the
events it holds cannot be counted, so nothing can be said about them. Run
it once the copier has caught up: the target is read up to its tip, and
anything still in flight is "lost".

Memory grows with the number of records read (every event ID is held), which
is fine for an audit of millions of events; audit billions by manifest slices.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

import boto3
import botocore.config
import botocore.exceptions

from copier.audit import (
    DEFAULT_EXAMPLES,
    AuditReport,
    DeadLetter,
    DuplicateReport,
    Produced,
    TargetRecord,
    audit,
    show,
)
from copier.aws import convert_aws_error
from copier.config import Config, DedupKey, load_config
from copier.errors import AwsError, ConfigError
from copier.identity import EventId, EventValue, extract_event_id
from copier.kinesis import paged_shards
from copier.kpl import as_daemon_delivers
from copier.retry import backoff_ms
from copier.target import target_session

__all__ = [
    "Progress",
    "StreamReader",
    "VerifyResult",
    "add_arguments",
    "dead_letter_event_id",
    "lineage_order",
    "main",
    "manifest_entry",
    "read_envelope",
    "read_manifest",
    "read_reports",
    "render_json",
    "render_text",
    "run_verify",
]

T = TypeVar("T")
KinesisRecord = dict[str, Any]

PROGRESS_INTERVAL_S = 2.0
GET_RECORDS_INTERVAL_S = 0.2  # Kinesis allows 5 GetRecords per second per shard
GET_RECORDS_LIMIT = 10_000
MAX_ATTEMPTS = 10
MAX_BACKOFF_MS = 10_000
READ_WORKERS = 8
_EXPIRED = "ExpiredIteratorException"


class Progress:
    """Progress lines on stderr, at most one per interval: alive on long reads, quiet in logs."""

    def __init__(
        self,
        out: TextIO | None = None,
        interval: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out if out is not None else sys.stderr
        self._interval = interval
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()
        self._streams: dict[str, list[int]] = {}  # label -> [records, shards done, shards total]

    def start(self, label: str, shards: int) -> None:
        """A stream's read begins: its shard count is known."""
        with self._lock:
            self._streams[label] = [0, 0, shards]
            self._maybe_print()

    def records(self, label: str, count: int) -> None:
        """``count`` more records were read from the stream."""
        with self._lock:
            self._streams[label][0] += count
            self._maybe_print()

    def shard_done(self, label: str) -> None:
        """One more shard of the stream was read to its end."""
        with self._lock:
            self._streams[label][1] += 1
            self._maybe_print()

    def line(self) -> str:
        """The current state of every stream read so far, on one line."""
        parts = [
            f"{label} {n} records, {done}/{total} shards done" for label, (n, done, total) in self._streams.items()
        ]
        return "verify: reading: " + "; ".join(parts)

    def _maybe_print(self) -> None:
        now = self._clock()
        if now - self._last >= self._interval:
            self._last = now
            print(self.line(), file=self._out, flush=True)


def lineage_order(shards: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Shards with every parent before its children, otherwise in ListShards order.

    Records of one partition key move from a parent to a child at a split or
    merge; reading parents first keeps their production order intact.
    """
    by_id = {s["ShardId"]: s for s in shards}
    ordered: list[dict[str, Any]] = []
    placed: set[str] = set()

    def place(shard: dict[str, Any]) -> None:
        if shard["ShardId"] in placed:
            return
        placed.add(shard["ShardId"])
        for parent in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")):
            if parent in by_id:
                place(by_id[parent])
        ordered.append(shard)

    for shard in shards:
        place(shard)
    return ordered


def make_client(config: Config, target: bool = False) -> Any:
    """A Kinesis client for reads of staging, or of the target side (target and dead-letter streams).

    botocore may retry reads itself: a read cannot duplicate anything. The
    target side is read in its own region and, if one is configured, as the
    role copier assumes to reach it.
    """
    session = target_session(config) if target else boto3.session.Session(region_name=config.region)
    return session.client(
        "kinesis",
        endpoint_url=config.target_endpoint if target else config.kinesis_endpoint,
        config=botocore.config.Config(retries={"mode": "standard"}, connect_timeout=5, read_timeout=30),
    )


class StreamReader:
    """Reads whole streams within the Kinesis read limits, shards in parallel, each in order.

    Every botocore error leaves as a CopierError: transient ones (throttling,
    5xx) are retried with jittered backoff up to ``max_attempts`` times, fatal
    ones (missing stream, denied access) at once.
    """

    def __init__(
        self,
        client: Any,
        progress: Progress,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        workers: int = READ_WORKERS,
        max_attempts: int = MAX_ATTEMPTS,
        max_backoff_ms: int = MAX_BACKOFF_MS,
        page_records: int = GET_RECORDS_LIMIT,
    ) -> None:
        self._client = client
        self._page_records = page_records
        self._progress = progress
        self._sleep = sleep
        self._clock = clock
        self._workers = workers
        self._max_attempts = max_attempts
        self._max_backoff_ms = max_backoff_ms
        self._stop = threading.Event()

    def _call(self, operation: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        """One API call, retried while its error is transient (an expired iterator is the caller's)."""
        attempt = 0
        while True:
            try:
                return fn(**kwargs)
            except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
                error = convert_aws_error(operation, exc)
                attempt += 1
                if not error.retryable or error.code == _EXPIRED or attempt >= self._max_attempts:
                    raise error from exc
                self._sleep(backoff_ms(attempt, self._max_backoff_ms) / 1000)

    def shards(self, stream: str) -> list[dict[str, Any]]:
        """Every shard of the stream (open, and closed within retention), parents first."""
        listed = paged_shards(lambda **kw: self._call("ListShards", self._client.list_shards, **kw), stream)
        return lineage_order(listed)

    def _iterator(self, stream: str, shard_id: str, after: str | None) -> str | None:
        """An iterator at the shard's start, or just after the last record read (when one expired)."""
        kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard_id}
        if after is None:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"
        else:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER", StartingSequenceNumber=after)
        answer = self._call("GetShardIterator", self._client.get_shard_iterator, **kwargs)
        iterator: str | None = answer.get("ShardIterator")
        return iterator

    def pages(self, stream: str, shard_id: str) -> Iterator[list[KinesisRecord]]:
        """The shard's records page by page, from TRIM_HORIZON to its end.

        A closed shard ends when NextShardIterator is null; any shard ends at
        an empty page with MillisBehindLatest 0, which is the end of an open
        shard (and of a closed parent on backends that never null its iterator).
        """
        iterator = self._iterator(stream, shard_id, None)
        last_sequence: str | None = None
        previous_call = float("-inf")
        while iterator and not self._stop.is_set():
            self._sleep(max(0.0, previous_call + GET_RECORDS_INTERVAL_S - self._clock()))
            previous_call = self._clock()
            try:
                page = self._call(
                    "GetRecords", self._client.get_records, ShardIterator=iterator, Limit=self._page_records
                )
            except AwsError as exc:
                if exc.code != _EXPIRED:
                    raise
                iterator = self._iterator(stream, shard_id, last_sequence)
                continue
            records: list[KinesisRecord] = page.get("Records", [])
            if records:
                last_sequence = records[-1]["SequenceNumber"]
                yield records
            iterator = page.get("NextShardIterator")
            if not records and page.get("MillisBehindLatest") == 0:
                return

    def _read_shard(
        self,
        stream: str,
        label: str,
        shard_id: str,
        convert: Callable[[str, KinesisRecord], T],
        on_page: Callable[[str], None] | None = None,
    ) -> list[T]:
        out: list[T] = []
        for records in self.pages(stream, shard_id):
            if on_page is not None:
                on_page(shard_id)
            out.extend(convert(shard_id, r) for r in records)
            self._progress.records(label, len(records))
        self._progress.shard_done(label)
        return out

    def read(
        self,
        stream: str,
        label: str,
        convert: Callable[[str, KinesisRecord], T],
        on_page: Callable[[str], None] | None = None,
    ) -> list[T]:
        """Every record of the stream, converted, shard by shard in lineage order, each in sequence order
        (``on_page``: told the shard of each page that held records, from the reading threads)."""
        shards = self.shards(stream)
        self._progress.start(label, len(shards))
        if not shards:
            return []
        self._stop.clear()
        with ThreadPoolExecutor(max_workers=min(self._workers, len(shards))) as pool:
            futures: list[Future[list[T]]] = [
                pool.submit(self._read_shard, stream, label, s["ShardId"], convert, on_page) for s in shards
            ]
            try:
                return [record for future in futures for record in future.result()]
            finally:
                self._stop.set()  # on an error, the other shards' reads end at their next page
                for future in futures:
                    future.cancel()


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


_ENVELOPE_FIELDS = ("reason", "stream", "shardId", "sequenceNumber", "subSequenceNumber", "partitionKey")


def read_envelope(key: DedupKey, shard_id: str, record: KinesisRecord) -> DeadLetter:
    """A dead-letter record as the audit judges it: the envelope's fields (copier.plan.dead_letter_envelope),
    or why it is not an envelope. The original's SHA-256 is computed from its data, or taken from
    ``dataSha256`` when the data was too large to keep."""
    where = {"shard_id": shard_id, "sequence_number": record["SequenceNumber"], "arrival_ms": arrival_ms(record)}
    try:
        body = json.loads(bytes(record["Data"]))
    except (ValueError, UnicodeDecodeError):
        return DeadLetter(**where, problem="not a dead-letter envelope (not JSON)")
    if not isinstance(body, dict):
        return DeadLetter(**where, problem="not a dead-letter envelope (not a JSON object)")
    missing = [f for f in _ENVELOPE_FIELDS if f not in body]
    if missing:
        return DeadLetter(**where, problem=f"not a dead-letter envelope (no {', '.join(missing)})")
    try:
        position = (str(body["shardId"]), int(body["sequenceNumber"]), int(body["subSequenceNumber"]))
    except (TypeError, ValueError):
        return DeadLetter(**where, problem="its source position is not a position")
    encoded = body.get("data")
    event_id: EventValue | None = None
    if isinstance(encoded, str):
        try:
            original = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            return DeadLetter(**where, problem="its data is not base64")
        digest: str | None = sha256_hex(original)
        event_id = event_id_in(key, str(body["partitionKey"]), original)
    elif body.get("dataTruncated") and isinstance(body.get("dataSha256"), str):
        digest = body["dataSha256"]
    else:
        return DeadLetter(**where, problem="neither data nor dataSha256")
    return DeadLetter(
        **where,
        reason=str(body["reason"]),
        position=position,
        partition_key=str(body["partitionKey"]),
        sha256=digest,
        event_id=event_id,
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
    bytes): then every target copy must have that key and those bytes.
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
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError("eventId is not a string or an integer")
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
    )


@dataclass(frozen=True)
class StagedRecord:
    """One staging record: the event IDs its producer wrote into it (None: no ID), and how the daemon reads it."""

    shard_id: str
    sequence_number: str
    events: list[Produced]
    aggregated: bool
    problem: str | None

    @property
    def event_ids(self) -> list[EventValue | None]:
        return [e.event_id for e in self.events]


@dataclass(frozen=True)
class VerifyResult:
    """The audit and what it was run on, for the report."""

    report: AuditReport
    source: str  # "staging" or "manifest"
    source_records: int  # staging records read, or non-blank manifest lines
    source_unkeyed: int  # staged events without an event ID (never expected in the target)
    target_stream: str
    dead_letter_stream: str | None
    source_events: int = 0  # staged events once aggregates are de-aggregated
    source_aggregates: int = 0  # staging records that are KPL aggregates
    undecodable: int = 0  # records that start like an aggregate but cannot be decoded
    undecodable_examples: tuple[str, ...] = ()  # shard@sequence number
    dropped: int = 0  # aggregates the daemon drops or truncates (hash key out of range, bad index)
    dropped_examples: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing duplicated, and nothing in staging that could not be counted."""
        return self.report.ok and self.undecodable == 0


def _ids(ids: Iterable[EventValue]) -> str:
    return ", ".join(show(i) for i in ids)


def _example_lines(r: AuditReport) -> list[str]:
    lines: list[str] = []
    if r.lost_examples:
        lines.append("  lost: " + _ids(r.lost_examples))
    if r.duplicated_examples:
        copies = ", ".join(f"{show(i)} x{n}" for i, n in r.duplicated_examples)
        lines.append(f"  duplicated ({r.extra_copies} extra copies, {r.explained_copies} reported): {copies}")
    if r.unexplained_examples:
        lines.append("  unexplained copies of: " + _ids(r.unexplained_examples))
    if r.changed_examples:
        lines.append("  changed (key or bytes not as produced): " + ", ".join(r.changed_examples))
    if r.unexpected_examples:
        lines.append("  unexpected: " + _ids(r.unexpected_examples))
    if r.unkeyed_examples:
        where = ", ".join(
            f"{u.shard_id}@{u.sequence_number} (partition key {u.partition_key})" for u in r.unkeyed_examples
        )
        lines.append("  without an event ID in the target: " + where)
    if r.unkeyed_lost_examples:
        lines.append("  lost without an event ID (staging position): " + ", ".join(r.unkeyed_lost_examples))
    if r.out_of_order_examples:
        wrong = ", ".join(
            f"{show(o.event_id)} after {show(o.after)} (partition key {o.partition_key})"
            for o in r.out_of_order_examples
        )
        lines.append("  out of order: " + wrong)
    if r.dead_lettered_examples:
        lines.append(f"  dead-lettered ({r.dead_lettered}, delivered there): " + _ids(r.dead_lettered_examples))
    if r.invalid_dead_letter_examples:
        lines.append("  invalid dead-letter records: " + "; ".join(r.invalid_dead_letter_examples))
    return lines


def _source_line(result: VerifyResult) -> str:
    r = result.report
    if result.source != "staging":
        return f"verify: produced {r.expected} distinct events ({result.source_records} manifest lines)"
    parts = [f"{result.source_records} records in staging"]
    if result.source_aggregates:
        parts.append(f"{result.source_aggregates} of them KPL aggregates, {result.source_events} events in all")
    if result.source_unkeyed:
        parts.append(f"{result.source_unkeyed} events without an event ID")
    return f"verify: produced {r.expected} distinct events ({', '.join(parts)})"


def render_text(result: VerifyResult) -> str:
    """The human report: counts, examples of each problem, and the verdict."""
    r = result.report
    dead_letter = f"{r.dead_letter_records} records" if result.dead_letter_stream else "none configured"
    lines = [
        _source_line(result),
        f"target: {r.found} records; dead-letter: {dead_letter}",
        f"lost: {r.lost}, duplicated: {r.duplicated} ({r.unexplained_copies} unexplained copies), "
        f"changed: {r.changed}, unexpected: {r.unexpected}, out of order (per partition key): {r.out_of_order}",
        f"without an event ID: {r.unkeyed_expected} produced, {r.unkeyed_lost} lost, "
        f"{r.unkeyed_extra_copies} extra copies; in the target without an ID: {r.unkeyed}",
        f"dead-letter stream: {r.dead_lettered} events delivered there, {r.invalid_dead_letters} invalid records; "
        f"possible_duplicates reports: {r.reports} naming {r.reported_ids} IDs",
        *_example_lines(r),
    ]
    if result.undecodable:
        lines.append(
            f"undecodable KPL aggregates in staging: {result.undecodable} (the events inside cannot be counted): "
            + ", ".join(result.undecodable_examples)
        )
    if result.dropped:
        lines.append(
            f"KPL aggregates the daemon drops whole or in part (a user record's hash key outside its shard, "
            f"or a bad key index): {result.dropped}: " + ", ".join(result.dropped_examples)
        )
    if result.ok:
        lines.append("verify: OK")
    else:
        problems = [
            f"{name} {n}"
            for name, n in (
                ("lost", r.lost),
                ("unexplained copies", r.unexplained_copies),
                ("changed", r.changed),
                ("invalid dead letters", r.invalid_dead_letters),
                ("lost without an ID", r.unkeyed_lost),
                ("undecodable aggregates", result.undecodable),
            )
            if n
        ]
        lines.append(f"verify: FAILED ({', '.join(problems)})")
    return "\n".join(lines)


def render_json(result: VerifyResult) -> str:
    """The report as one JSON object, for scripts and alerting."""
    return json.dumps(
        {
            "source": result.source,
            "source_records": result.source_records,
            "source_events": result.source_events,
            "source_aggregates": result.source_aggregates,
            "source_unkeyed": result.source_unkeyed,
            "undecodable_aggregates": result.undecodable,
            "undecodable_examples": list(result.undecodable_examples),
            "dropped_aggregates": result.dropped,
            "dropped_examples": list(result.dropped_examples),
            "target_stream": result.target_stream,
            "dead_letter_stream": result.dead_letter_stream,
            **result.report.to_json(),
            "ok": result.ok,
        }
    )


def _non_negative(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {number}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``copier verify``."""
    parser.add_argument("--properties", required=True, metavar="FILE", help="the copier's properties file")
    parser.add_argument(
        "--manifest",
        metavar="FILE",
        help="produced event IDs, one a line in production order ('-' = stdin); default: read the staging stream",
    )
    parser.add_argument(
        "--examples",
        type=_non_negative,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"example IDs shown per problem (default {DEFAULT_EXAMPLES})",
    )
    parser.add_argument(
        "--reports",
        metavar="FILE",
        help="the copier's log lines (journal JSON): each possible_duplicates line excuses one extra copy of each "
        "event ID it names that arrived within its window",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")


def read_staging(config: Config, reader: StreamReader) -> list[StagedRecord]:
    """Every staging record, de-aggregated by the daemon's rules for the shard it was read from, each user
    record with its key, the SHA-256 of its bytes and its position (what a copy must match)."""
    key = config.dedup_key
    ranges = {
        s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in reader.shards(config.stream_name)
        if "HashKeyRange" in s
    }

    def staged(shard_id: str, r: KinesisRecord) -> StagedRecord:
        view = as_daemon_delivers(bytes(r["Data"]), r["PartitionKey"], ranges.get(shard_id))
        seq = int(r["SequenceNumber"])
        events = [  # what the daemon drops is lost
            Produced(
                event_id_in(key, pk, data),
                pk,
                sha256_hex(data),
                (shard_id, seq, n if view.aggregated else 0),
                size=len(data) + len(pk.encode("utf-8")),
            )
            for n, (pk, data) in enumerate(view.written)
        ]
        return StagedRecord(shard_id, r["SequenceNumber"], events, view.aggregated, view.problem)

    return reader.read(config.stream_name, "staging", staged)


def event_id_in(key: DedupKey, partition_key: str, data: bytes) -> EventValue | None:
    """A record's event ID as the copier reads it (None: it has none)."""
    found = extract_event_id(key, partition_key, data)
    return found.value if isinstance(found, EventId) else None


def run_verify(
    config: Config,
    manifest: list[Produced] | None,
    examples: int,
    reader: StreamReader,
    target_reader: StreamReader | None = None,
    reports: Sequence[DuplicateReport] = (),
) -> VerifyResult:
    """Audit the target (and dead-letter stream) against the manifest, or the staging stream without one.

    ``reader`` reads staging; ``target_reader`` (default: the same) the target and dead-letter streams;
    ``reports``: the copier's ``possible_duplicates`` lines, which may excuse one extra copy each.
    """
    key = config.dedup_key
    target_side = target_reader or reader
    counts: dict[str, Any] = {}
    if manifest is not None:
        produced = manifest
        source, source_records, source_unkeyed = "manifest", len(produced), 0
    else:
        records = read_staging(config, reader)
        produced = [event for record in records for event in record.events]
        keyed = sum(1 for p in produced if p.event_id is not None)
        source, source_records, source_unkeyed = "staging", len(records), len(produced) - keyed
        undecodable = [f"{r.shard_id}@{r.sequence_number}" for r in records if r.problem == "undecodable"]
        dropped = [f"{r.shard_id}@{r.sequence_number}" for r in records if r.problem in ("out_of_range", "bad_index")]
        counts = {
            "source_events": len(produced),
            "source_aggregates": sum(1 for r in records if r.aggregated),
            "undecodable": len(undecodable),
            "undecodable_examples": tuple(undecodable[:examples]),
            "dropped": len(dropped),
            "dropped_examples": tuple(dropped[:examples]),
        }

    def target_record(shard_id: str, r: KinesisRecord) -> TargetRecord:
        data = bytes(r["Data"])
        return TargetRecord(
            event_id_in(key, r["PartitionKey"], data),
            r["PartitionKey"],
            shard_id,
            r["SequenceNumber"],
            sha256_hex(data),
            arrival_ms(r),
        )

    target = target_side.read(config.target_stream_name, "target", target_record)
    dead_letter: list[DeadLetter] = []
    if config.dead_letter_stream_name:
        dead_letter = target_side.read(
            config.dead_letter_stream_name, "dead-letter", lambda shard, r: read_envelope(key, shard, r)
        )
    return VerifyResult(
        report=audit(produced, target, dead_letter, reports, examples),
        source=source,
        source_records=source_records,
        source_unkeyed=source_unkeyed,
        target_stream=config.target_stream_name,
        dead_letter_stream=config.dead_letter_stream_name,
        **counts,
    )


def main(args: argparse.Namespace) -> int:
    """``copier verify``: 0 exactly once, 1 lost or duplicated events (or staging aggregates it cannot decode).

    A bad properties file raises ConfigError (status 2 from the CLI), an AWS
    error that retrying cannot fix raises an AwsError (status 3).
    """
    config = load_config(args.properties)
    manifest = read_manifest(args.manifest) if args.manifest is not None else None  # before any AWS call
    reports = read_reports(args.reports) if args.reports else []
    progress = Progress()
    reader = StreamReader(make_client(config), progress)
    target_reader = StreamReader(make_client(config, True), progress)
    result = run_verify(config, manifest, args.examples, reader, target_reader, reports)
    print(render_json(result) if args.json else render_text(result), flush=True)
    return 0 if result.ok else 1
