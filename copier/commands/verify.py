"""``copier verify``: read what was produced and what the target holds, and audit exactly-once.

Read-only and safe against production: it lists shards and reads them from
TRIM_HORIZON with GetRecords, within the Kinesis read limits, and writes
nothing anywhere. The verdict itself is ``copier.core.audit``; this module runs
the command: it reads the streams (``copier.adapters.streamreader``, which shows
progress on stderr: a full read of a large stream takes a while), turns
what it read into the audit's inputs (``copier.core.auditinputs``) and prints
the one final report on stdout (``copier.core.verifyreport``).

Produced IDs come from a manifest (one event ID per line, production order)
or, without one, from the staging stream itself: the staging stream holds
every event the producer wrote, duplicates included, so its distinct IDs are
exactly what the target must hold. Staging records are read as the KCL
MultiLangDaemon delivers them to the copier: KPL-aggregated records are
de-aggregated by the daemon's rules (``copier.core.kpl.as_daemon_delivers``), so
every event inside an aggregate is expected in the target. An aggregate
that cannot be decoded is a problem of its own and fails the audit: the
events it holds cannot be counted, so nothing can be said about them.

It may run while the copier is behind: it reads each staging shard's
committed position from the state table *before* it reads the target (an
event committed by then is in the target by then), and a missing event
whose every staging occurrence lies after its shard's committed position
is *pending*, not lost (under a manifest, staging is read for where the
missing IDs are, only when some are missing). Pending events do not fail
the audit; the verdict says ``PENDING`` until they are copied.

Memory grows with the number of records read (every event ID is held), which
is fine for an audit of millions of events; audit billions by manifest slices,
or with ``copier export`` and ``copier audit`` (Spark).

Progress goes to stderr (a bar on a terminal, a line every few seconds in a
log). With ``--spool DIR`` every page read is kept in DIR as it comes
(``copier.adapters.shardfiles``): a verify interrupted (Ctrl-C, a kill, a
lost session) and run again with the same DIR reads back what it kept and
reads the streams on from there (an open shard, also one read to its end
before, is read on for what arrived since); the verdict is made afresh from
everything, with committed positions read anew. DIR is kept for the next
run: delete it to read from the start.

The reader, input and report names this module held before they had modules
of their own are still importable from here.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.adapters.localkeys import command_config
from copier.adapters.shardfiles import ShardFiles
from copier.adapters.streamreader import GET_RECORDS_INTERVAL_S as GET_RECORDS_INTERVAL_S
from copier.adapters.streamreader import GET_RECORDS_LIMIT as GET_RECORDS_LIMIT
from copier.adapters.streamreader import MAX_ATTEMPTS as MAX_ATTEMPTS
from copier.adapters.streamreader import MAX_BACKOFF_MS as MAX_BACKOFF_MS
from copier.adapters.streamreader import PROGRESS_INTERVAL_S as PROGRESS_INTERVAL_S
from copier.adapters.streamreader import READ_WORKERS as READ_WORKERS
from copier.adapters.streamreader import KinesisRecord, Progress, StreamReader, lineage_order
from copier.adapters.streamreader import make_client as make_client
from copier.core.audit import PAST_THE_END, audit
from copier.core.auditinputs import arrival_ms as arrival_ms
from copier.core.auditinputs import dead_letter_event_id, manifest_entry, read_envelope, read_manifest, read_reports
from copier.core.auditinputs import duplicate_report as duplicate_report
from copier.core.auditinputs import event_id_in as event_id_in
from copier.core.auditinputs import log_event as log_event
from copier.core.auditinputs import record_event_id as record_event_id
from copier.core.auditinputs import report_of as report_of
from copier.core.auditinputs import sha256_hex as sha256_hex
from copier.core.audittypes import DEFAULT_EXAMPLES, DeadLetter, DuplicateReport, Produced, TargetRecord, content_name
from copier.core.config import Config
from copier.core.errors import CopierError
from copier.core.identity import EventValue
from copier.core.kpl import as_daemon_delivers
from copier.core.limits import record_size
from copier.core.positions import Position
from copier.core.startpoint import before_start
from copier.core.state import shard_key
from copier.core.verifyreport import VerifyResult, render_json, render_text

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
    "redriven_letters",
    "redriven_record",
    "render_json",
    "render_text",
    "run_verify",
]


@dataclass(frozen=True)
class StagedRecord:
    """One staging record: the event IDs its producer wrote into it (None: no ID), and how the daemon reads it."""

    shard_id: str
    sequence_number: str
    events: list[Produced]
    aggregated: bool
    problem: str | None
    arrival_ms: int = 0

    @property
    def event_ids(self) -> list[EventValue | None]:
        return [e.event_id for e in self.events]


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
        "event ID, and of each record without an ID, it names that arrived within its window",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the text report")
    parser.add_argument(
        "--spool",
        metavar="DIR",
        help="keep every page read in DIR, and read on from what DIR holds: a verify interrupted goes on when run "
        "again with the same DIR",
    )


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
                size=record_size(pk, data),
            )
            for n, (pk, data) in enumerate(view.written)
        ]
        return StagedRecord(shard_id, r["SequenceNumber"], events, view.aggregated, view.problem, arrival_ms(r))

    return reader.read(config.stream_name, "staging", staged)


def _after_start(records: Sequence[StagedRecord], start_ms: int | None) -> tuple[list[Produced], int]:
    """The staged events the application owes its target, and how many it does not: with a start
    (``initialPositionInStreamExtended``), an event whose first staging copy arrived before it is never forwarded,
    nor is a retry of it within the window (``copier.core.startpoint``), so it is neither lost nor expected."""
    events = [(record.arrival_ms, event) for record in records for event in record.events]
    if start_ms is None:
        return [event for _, event in events], 0
    first: dict[EventValue, int] = {}
    for at, event in events:
        if event.event_id is not None:
            first[event.event_id] = min(first.get(event.event_id, at), at)
    kept = [e for at, e in events if not before_start(at if e.event_id is None else first[e.event_id], start_ms)]
    return kept, len(events) - len(kept)


Committed = Callable[[Sequence[str]], Mapping[str, Position]]


def committed_positions(config: Config) -> Committed:
    """Reads each staging shard's committed position from the state table (a closed shard: past its end)."""

    def read(shard_ids: Sequence[str]) -> Mapping[str, Position]:
        from copier.adapters.dynamo import DynamoStateStore

        keys = {shard_key(config.stream_name, s): s for s in shard_ids}
        out: dict[str, Position] = {}
        for key, state in DynamoStateStore(config).get_many(keys).items():
            if state.closed:
                out[keys[key]] = PAST_THE_END
            elif state.position is not None:
                out[keys[key]] = state.position
        return out

    return read


def redriven_record(config: Config, reader: StreamReader) -> set[str] | None:
    """What redrives sent from the dead-letter stream, from their state items (``copier redrive``): the digest
    names the audit counts a dead-letter record by (``copier.core.audit.was_redriven``). Empty when there is no
    dead-letter stream; None when the state table or the stream's shards cannot be read. ``copier export`` of
    the dead-letter stream keeps it for ``copier audit`` (:data:`copier.adapters.shardfiles.REDRIVEN`)."""
    if not config.dead_letter_stream_name:
        return set()
    from copier.adapters.dynamo import DynamoStateStore
    from copier.commands.redrive import redriven_names

    try:
        shards = [s["ShardId"] for s in reader.shards(config.dead_letter_stream_name)]
        return redriven_names(config, DynamoStateStore(config), shards)
    except CopierError:
        return None


def redriven_letters(config: Config, reader: StreamReader) -> set[str]:
    """:func:`redriven_record`, nothing when it cannot be read (then a redriven event counts twice)."""
    return redriven_record(config, reader) or set()


def _positions(
    committed: Committed | None, reader: StreamReader, stream: str
) -> tuple[Mapping[str, Position] | None, str | None]:
    """The committed positions, or None and why they could not be read."""
    if committed is None:
        return None, "not asked for"
    try:
        return committed([s["ShardId"] for s in reader.shards(stream)]), None
    except CopierError as exc:
        return None, str(exc)


def run_verify(
    config: Config,
    manifest: list[Produced] | None,
    examples: int,
    reader: StreamReader,
    target_reader: StreamReader | None = None,
    reports: Sequence[DuplicateReport] = (),
    committed: Committed | None = None,
    redriven: Collection[str] = frozenset(),
    staged_out: list[StagedRecord] | None = None,
) -> VerifyResult:
    """Audit the target (and dead-letter stream) against the manifest, or the staging stream without one.

    ``reader`` reads staging; ``target_reader`` (default: the same) the target and dead-letter streams;
    ``reports``: the copier's ``possible_duplicates`` lines, which may excuse one extra copy each;
    ``committed``: reads the copier's committed positions (None: every missing event is lost);
    ``redriven``: what redrives sent from the dead-letter stream (``copier.commands.redrive.redriven_names``);
    ``staged_out``: given, the staging records read are added to it (``copier repair`` puts from them).
    """
    key = config.dedup_key
    target_side = target_reader or reader
    counts: dict[str, Any] = {}
    # Before the target is read: what was committed then is in the target then.
    positions, unknown = _positions(committed, reader, config.stream_name)
    if manifest is not None:
        produced = manifest
        source, source_records, source_unkeyed = "manifest", len(produced), 0
    else:
        records = read_staging(config, reader)
        if staged_out is not None:
            staged_out.extend(records)
        produced, before = _after_start(records, config.start_ms)
        keyed = sum(1 for p in produced if p.event_id is not None)
        source, source_records, source_unkeyed = "staging", len(records), len(produced) - keyed
        undecodable = [f"{r.shard_id}@{r.sequence_number}" for r in records if r.problem == "undecodable"]
        dropped = [f"{r.shard_id}@{r.sequence_number}" for r in records if r.problem in ("out_of_range", "bad_index")]
        counts = {
            "before_start": before,
            "source_events": len(produced),
            "source_aggregates": sum(1 for r in records if r.aggregated),
            "undecodable": len(undecodable),
            "undecodable_examples": tuple(undecodable[:examples]),
            "dropped": len(dropped),
            "dropped_examples": tuple(dropped[:examples]),
        }

    def target_record(shard_id: str, r: KinesisRecord) -> TargetRecord:
        data = bytes(r["Data"])
        event_id = event_id_in(key, r["PartitionKey"], data)
        return TargetRecord(
            event_id,
            r["PartitionKey"],
            shard_id,
            r["SequenceNumber"],
            sha256_hex(data),
            arrival_ms(r),
            content_name(r["PartitionKey"], data) if event_id is None else None,
        )

    target = target_side.read(config.target_stream_name, "target", target_record)
    dead_letter: list[DeadLetter] = []
    if config.dead_letter_stream_name:
        dead_letter = target_side.read(
            config.dead_letter_stream_name, "dead-letter", lambda shard, r: read_envelope(key, shard, r)
        )
    report = audit(produced, target, dead_letter, reports, examples, committed=positions, redriven=redriven)
    if manifest is not None and positions is not None and report.lost:
        # Where the missing IDs are in staging, to tell the ones the copier has not reached yet.
        missing = {p.event_id for p in manifest} - {t.event_id for t in target} - {d.event_id for d in dead_letter}
        staged: dict[EventValue, list[tuple[str, int, int]]] = {}
        for record in read_staging(config, reader):
            for event in record.events:
                if event.event_id is not None and event.event_id in missing and event.position is not None:
                    staged.setdefault(event.event_id, []).append(event.position)
        report = audit(
            produced, target, dead_letter, reports, examples, committed=positions, staged=staged, redriven=redriven
        )
    return VerifyResult(
        report=report,
        positions_unknown=unknown,
        source=source,
        source_records=source_records,
        source_unkeyed=source_unkeyed,
        target_stream=config.target_stream_name,
        dead_letter_stream=config.dead_letter_stream_name,
        **counts,
    )


def main(args: argparse.Namespace) -> int:
    """``copier verify``: 0 exactly once so far (events still to be copied are reported as pending), 1 lost or
    duplicated events (or staging aggregates it cannot decode).

    A bad properties file raises ConfigError (status 2 from the CLI), an AWS
    error that retrying cannot fix raises an AwsError (status 3).
    """
    config = command_config(args.properties)
    manifest = read_manifest(args.manifest) if args.manifest is not None else None  # before any AWS call
    reports = read_reports(args.reports) if args.reports else []
    progress = Progress()
    files = None
    if args.spool:
        streams = [config.stream_name, config.target_stream_name, config.dead_letter_stream_name]
        files = ShardFiles(Path(args.spool), {"verify": streams})
    reader = StreamReader(make_client(config), progress, files=files)
    target_reader = StreamReader(make_client(config, True), progress, files=files)
    redriven = redriven_letters(config, target_reader)
    try:
        result = run_verify(
            config, manifest, args.examples, reader, target_reader, reports, committed_positions(config), redriven
        )
    except KeyboardInterrupt:
        progress.finish()
        kept = f"the same command again goes on from what {args.spool} holds" if args.spool else "nothing kept"
        print(f"verify: interrupted; {kept} (--spool DIR keeps what is read)", file=sys.stderr)
        raise
    progress.finish()
    print(render_json(result) if args.json else render_text(result), flush=True)
    return 0 if result.ok else 1
