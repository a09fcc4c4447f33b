"""The independent check after a chaos seed: every copy in the target and dead-letter streams against what was produced.

It does not ask the copier anything. It reads both streams to their ends
(``copier.adapters.streamreader.StreamReader``, in pages of :data:`PAGE_RECORDS` so that a
shard takes several) and judges them with the pure audit of ``copier.core.audit``
against the producer's own record of every user record it wrote
(``copier.chaos.producer``: event ID as read from its bytes, partition key,
SHA-256, staging position, and for poison the dead-letter reason it must
get). The event ID of a target record is read here, from its bytes, by the
producer's few lines (:func:`copier.chaos.producer.read_event_id`), not by
the copier's extraction, so one bug cannot hide in both. A seed passes only
if all of this holds:

* **Read to the end:** every shard of both streams, closed ones included (a
  target reshard closes its parents), was read to its end: for a closed
  shard, until a GetRecords answered without a NextShardIterator
  (:func:`short_reads`; its ``EndingSequenceNumber`` is no measure: moto,
  patched, gives the last record's number, kinesis-mock a constant).
* **Nothing lost:** every produced event ID has a copy in the target or a
  valid dead-letter envelope.
* **Per copy:** every copy of an ID, in the target and the dead-letter
  stream together, counts. A copy beyond the first is *explained* only by a
  ``possible_duplicates`` report of the copier that names the ID (under
  either dedup key a worker ran: ``eventId`` or ``meta.alt``), one copy per
  report, arriving within the window the report gives; any other extra copy
  fails the seed. The number of reports, the IDs they name and the copies
  they excused are counted.
* **Per byte:** every target copy has the partition key and the SHA-256 of
  a record produced under its ID (a record cut down, or rekeyed, fails).
* **Redriven:** a dead-letter record a redrive sent on to the target is no
  copy of its own (``copier.core.audit.was_redriven``): its target copy is the
  delivery, as ``copier verify`` and ``copier audit`` count it. What was
  redriven is the one thing read from the copier's state: the redrive state
  items' digest batches (``copier.commands.verify.redriven_record``). The suite
  never runs ``copier redrive``, so in a chaos run there is none; the check
  keeps the rule so that the three verdicts stay one.
* **Dead letters:** each dead-letter record must be an envelope pointing at
  a produced record (source shard, sequence and sub-sequence number), with
  its partition key and bytes (or their SHA-256 when too large to keep), a
  reason the record bears out, and the reason the producer wrote it for. A
  keyed event in the dead-letter stream fails: nothing in a chaos run sends
  one there.
* **Poison** (records without an event ID, and records too large for the
  target): when every worker ran ``unkeyedPolicy = deadletter``, each is in
  the dead-letter stream exactly once and nothing without an ID is in the
  target. When some worker ran ``forward``, a record without an ID may go to
  either stream under that worker: it must be somewhere, and a copy beyond
  the first (an unkeyed send whose put was ambiguous, or whose chunk was in
  flight, is sent again: it cannot be told apart from an identical record)
  passes only where a ``possible_duplicates`` report names the record (by
  its content digest, ``unkeyed_digests``), one copy per name and report,
  within the report's window, as for an event ID (``copier.core.audit``);
  such copies are counted (``unkeyed_copies``, ``unkeyed_explained``). An
  oversize record goes to the dead-letter stream under any policy. A poison
  record redriven is where the redrive put it: once, in the target.
* **No fatal line:** the copier's logs hold no ``fatal`` or
  ``unexpected_error`` event, read from the lines the daemon writes (its
  ``Received error line from subprocess [{...}] for shard ...`` wrapping, or
  the raw line it echoes).
* **Order:** with ``copier.ordering = partitionKey``, per partition key *as
  produced*, no event's first copy lands after a later-produced one's (the
  producer writes each key to one shard in production order). With ``none``
  such events are only counted. An event with a copy on a shard whose hash
  key range does not hold its partition key (a staging record, or a target
  record, put while that stream ignored keys: ``RecordDistributionStrategy =
  AUTO``, which the schedule switches on and off) is not judged for order:
  Kinesis keeps none for it. Such records are counted (``scattered_*``), the
  events left out too (``unordered``); their copies are judged as all others.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from copier.adapters.streamreader import Progress, StreamReader, make_client
from copier.chaos.producer import Output, alt_id, read_event_id
from copier.core.audit import audit, was_redriven
from copier.core.auditinputs import arrival_ms, log_event, read_envelope, report_of, sha256_hex
from copier.core.audittypes import AuditReport, DeadLetter, DuplicateReport, TargetRecord, content_name, show
from copier.core.config import Config
from copier.core.deadlettercheck import check_dead_letter
from copier.core.identity import EventValue
from copier.core.shardmap import hash_key

__all__ = ["PAGE_RECORDS", "Check", "check", "copier_events", "off_their_shard"]

PAGE_RECORDS = 500  # GetRecords page size of the check: a shard of the suite's size takes several pages
KinesisRecord = dict[str, Any]


@dataclass
class Check:
    """The verdict of one seed's streams and logs, every count from what was read."""

    expected: int = 0  # distinct keyed event IDs produced
    target_records: int = 0
    dead_letter_records: int = 0
    target_shards: int = 0  # every shard read, closed ones included
    target_shards_closed: int = 0
    pages: int = 0  # GetRecords pages that held records, both streams
    lost: int = 0
    duplicated: int = 0  # IDs with more than one copy
    extra_copies: int = 0
    explained_duplicates: int = 0  # extra copies a report excused
    changed: int = 0  # target copies whose key or bytes are not what was produced
    invalid_dead_letters: int = 0
    out_of_order: int = 0
    unkeyed_in_target: int = 0
    unkeyed_copies: int = 0  # copies of poison records beyond the first (unkeyedPolicy = forward)
    unkeyed_explained: int = 0  # of those, copies a report excused
    poison_expected: int = 0
    poison_delivered: int = 0
    possible_duplicate_reports: int = 0
    reported_ids: int = 0  # IDs the reports name, each report counted
    scattered_staging: int = 0  # produced records on a staging shard not holding their key
    scattered_target: int = 0  # target records on a shard not holding their key
    unordered: int = 0  # events left out of the order judgement for such a copy
    fatal_logs: int = 0
    unexplained_examples: tuple[EventValue, ...] = ()  # IDs with an extra copy no report explains (some)
    failures: list[str] = field(default_factory=list)


def copier_events(log_paths: Iterable[Path], names: set[str]) -> list[dict[str, Any]]:
    """The copier's log events named ``names`` in worker logs, each once: the daemon both wraps a processor's
    stderr line and echoes it raw, so the same event (the same JSON, timestamp included) counts once."""
    found: list[dict[str, Any]] = []
    for path in log_paths:
        seen: set[str] = set()
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                if not any(f'"{n}"' in line for n in names):
                    continue
                event = log_event(line)
                if event is None or event["event"] not in names:
                    continue
                text = json.dumps(event, sort_keys=True)
                if text not in seen:
                    seen.add(text)
                    found.append(event)
    return found


def short_reads(stream: str, shards: list[dict[str, Any]], last: dict[str, int], ended: Collection[str]) -> list[str]:
    """Closed shards whose read did not reach their end: no GetRecords answered it without a NextShardIterator
    (``ended``: the shards whose read did; ``last``: the last sequence number read of each, for the message).

    AWS documents the end of a closed shard by the null NextShardIterator ("the shard has been closed and the
    requested iterator does not return any more data", with ChildShards "only when the end of the current shard
    is reached"); of ``EndingSequenceNumber`` it says only that an open shard has none, nothing of how it
    relates to the records. The backends differ there: moto (patched) gives the last record's number,
    kinesis-mock 2^63-1, which is below its own 56-digit record numbers, so not even a bound. The null
    iterator is what proves a read complete, on every backend; on moto it comes only once the read has
    reached the last record (``copier.local.moto_patches.resharding``), so the rule says there what the old
    comparison with ``EndingSequenceNumber`` said."""
    out = []
    for shard in shards:
        if shard["SequenceNumberRange"].get("EndingSequenceNumber") is None:
            continue  # open: read to its tip (an empty page at MillisBehindLatest 0)
        shard_id = shard["ShardId"]
        if shard_id not in ended:
            stopped = last.get(shard_id)
            out.append(f"{stream} shard {shard_id} is closed and its read stopped at {stopped}, before its end")
    return out


class _Reader:
    """Both streams, read in pages, with where each shard's read ended."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.client = make_client(config, target=True)
        self.reader = StreamReader(self.client, Progress(interval=30.0, terminal=False), page_records=PAGE_RECORDS)
        self.failures: list[str] = []
        self.pages = 0

    def read(self, stream: str, label: str, convert: Any) -> tuple[list[Any], list[dict[str, Any]]]:
        shards = self.reader.shards(stream)
        last: dict[str, int] = {}
        pages: Counter[str] = Counter()

        def noting(shard_id: str, r: KinesisRecord) -> Any:
            last[shard_id] = max(last.get(shard_id, 0), int(r["SequenceNumber"]))
            return convert(shard_id, r)

        records = self.reader.read(stream, label, noting, on_page=lambda shard_id: pages.update([shard_id]))
        self.pages += sum(pages.values())
        ended = {shard_id for name, shard_id in self.reader.closed_ends if name == stream}
        self.failures.extend(short_reads(stream, shards, last, ended))
        return records, shards


def off_their_shard(placed: Iterable[tuple[str, str]], shards: list[dict[str, Any]]) -> list[int]:
    """Which of (shard ID, partition key) pairs lie on a shard whose hash key range does not hold the key
    (their indexes): records Kinesis put there while the stream ignored keys. A shard ListShards no longer
    lists holds none (nothing can be said of it)."""
    ranges = {
        s["ShardId"]: (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in shards
    }
    out = []
    for n, (shard_id, key) in enumerate(placed):
        low, high = ranges.get(shard_id, (0, 2**128 - 1))
        if not low <= hash_key(key) <= high:
            out.append(n)
    return out


def _target_record(shard_id: str, r: KinesisRecord) -> TargetRecord:
    data = bytes(r["Data"])
    event_id, key = read_event_id(data), r["PartitionKey"]
    content = content_name(key, data) if event_id is None else None  # as a report names it
    return TargetRecord(event_id, key, shard_id, r["SequenceNumber"], sha256_hex(data), arrival_ms(r), content)


def _reports(log_paths: Iterable[Path], produced: Output) -> list[DuplicateReport]:
    """The copier's possible_duplicates reports, each once, with IDs reported under ``meta.alt`` mapped back.

    Once is per log line (:func:`copier_events`, its timestamp included), not per content: a processor that
    sends a chunk again after each of several ambiguous puts reports each time with the same shard, batch, IDs
    and window, and each report may excuse a copy."""
    back = {alt_id(i): i for i in produced.keyed_ids}
    out: list[DuplicateReport] = []
    for event in copier_events(log_paths, {"possible_duplicates"}):
        report = report_of(event)
        if report is not None:
            ids: tuple[EventValue, ...] = tuple(back.get(i, i) if isinstance(i, str) else i for i in report.event_ids)
            out.append(replace(report, event_ids=ids))
    return out


def check(
    config: Config,
    produced: Output,
    log_paths: list[Path],
    examples: int = 5,
    unkeyed_forwarded: bool = False,
    redriven: Collection[str] | None = None,
) -> Check:
    """Read the target and dead-letter streams and judge them; see the module docstring.

    ``config``: what the check reads with (its streams; the dead-letter envelopes' original IDs are taken
    from the producer's record of the position they point at); ``unkeyed_forwarded``: whether any worker
    ran with ``copier.unkeyedPolicy = forward``; ``redriven``: the names of what redrives sent (None: read from
    the redrive state items, as ``copier verify`` reads them).
    """
    from copier.commands.verify import redriven_letters

    reader = _Reader(config)
    if redriven is None:
        redriven = redriven_letters(config, reader.reader)
    target, target_shards = reader.read(config.target_stream_name, "target", _target_record)
    letters: list[DeadLetter] = []
    if config.dead_letter_stream_name:
        key = config.dedup_key
        letters, _ = reader.read(
            config.dead_letter_stream_name, "dead-letter", lambda shard, r: read_envelope(key, shard, r)
        )
    reports = _reports(log_paths, produced)
    keyed = [p for p in produced.records if p.event_id is not None and p.position and p.partition_key is not None]
    staging = off_their_shard(
        [(p.position[0], p.partition_key) for p in keyed],  # type: ignore[index,misc]
        reader.reader.shards(config.stream_name),
    )
    off_target = off_their_shard([(r.shard_id, r.partition_key) for r in target], target_shards)
    placed_off = [keyed[n].event_id for n in staging] + [target[n].event_id for n in off_target]
    unordered = {i for i in placed_off if i is not None}
    report = audit(
        produced.records,
        target,
        letters,
        reports,
        examples,
        keyed_dead_letters=False,
        unordered=unordered,
        redriven=redriven,
    )
    out = Check(
        expected=report.expected,
        target_records=report.found,
        dead_letter_records=report.dead_letter_records,
        target_shards=len(target_shards),
        target_shards_closed=sum(1 for s in target_shards if "EndingSequenceNumber" in s["SequenceNumberRange"]),
        pages=reader.pages,
        lost=report.lost,
        duplicated=report.duplicated,
        extra_copies=report.extra_copies,
        explained_duplicates=report.explained_copies,
        changed=report.changed,
        invalid_dead_letters=report.invalid_dead_letters,
        out_of_order=report.out_of_order,
        unkeyed_in_target=report.unkeyed,
        unkeyed_explained=report.unkeyed_explained,
        possible_duplicate_reports=report.reports,
        reported_ids=report.reported_ids,
        scattered_staging=len(staging),
        scattered_target=len(off_target),
        unordered=report.unordered,
    )
    out.failures.extend(reader.failures)
    out.unexplained_examples = report.unexplained_examples
    detail = _unkeyed_detail(produced, target, letters, reports) if report.unkeyed_unexplained else ""
    _judge_audit(out, report, config, examples, detail, _copies_detail(report.unexplained_examples, target, letters))
    _judge_poison(out, produced, target, letters, unkeyed_forwarded, redriven)
    _judge_logs(out, log_paths)
    return out


def _copies_detail(ids: Iterable[EventValue], target: list[TargetRecord], letters: list[DeadLetter]) -> str:
    """Where each copy of these IDs lies (stream, shard, sequence number, arrival), for whoever traces a failed
    seed: two copies in one target shard a moment apart are one request sent twice, in two shards a reshard."""
    wanted = set(ids)
    copies: dict[EventValue, list[str]] = {i: [] for i in ids}
    for r in target:
        if r.event_id in wanted:
            copies[r.event_id].append(f"{r.shard_id}@{r.sequence_number} {r.arrival_ms}")
    for d in letters:
        if d.problem is None and d.event_id in wanted:
            copies[d.event_id].append(f"dead-letter {d.shard_id}@{d.sequence_number} {d.arrival_ms}")
    return "; ".join(f"{show(i)}: {', '.join(where)}" for i, where in copies.items())


def _unkeyed_detail(
    produced: Output, target: list[TargetRecord], letters: list[DeadLetter], reports: list[DuplicateReport]
) -> str:
    """What an unexplained copy without an ID is weighed against, for whoever reads a failed seed: every such
    record produced (position, content), every copy (where, arrival, content) and every report naming one
    (shard, batch, window, names)."""
    made = [
        f"{p.position[0]}@{p.position[1]}" if p.position else "?"
        for p in produced.records
        if p.event_id is None and p.partition_key is not None
    ]
    copies = [f"{r.shard_id}@{r.sequence_number} {r.arrival_ms} {r.content}" for r in target if r.event_id is None]
    copies += [
        f"{d.shard_id}@{d.sequence_number} (dead-letter) {d.arrival_ms} {d.content}"
        for d in letters
        if d.problem is None and d.event_id is None
    ]
    named = [
        f"{r.shard_id}/{r.batch} from {r.from_ms} until {r.until_ms}: {list(r.unkeyed)}" for r in reports if r.unkeyed
    ]
    return f"detail of the copies without an ID: produced {made}; copies {copies}; reports {named}"


def _judge_audit(
    out: Check, report: AuditReport, config: Config, examples: int, unkeyed_detail: str = "", copies_detail: str = ""
) -> None:
    """The audit's findings as failures: lost, unexplained copies (of events and of records without an ID), changed
    copies, invalid dead letters, order."""
    if report.lost:
        out.failures.append(f"lost {report.lost}: {', '.join(show(i) for i in report.lost_examples)}")
    if report.unexplained_copies:
        shown = ", ".join(show(i) for i in report.unexplained_examples)
        out.failures.append(
            f"{report.unexplained_copies} extra copies no possible_duplicates report explains (of {report.duplicated}"
            f" duplicated IDs): {shown}"
            + (f"; their copies (shard@sequence arrival ms): {copies_detail}" if copies_detail else "")
        )
    if report.unkeyed_unexplained:
        shown = ", ".join(report.unkeyed_unexplained_examples)
        out.failures.append(
            f"{report.unkeyed_unexplained} extra copies of records without an event ID no possible_duplicates report "
            f"explains (of {report.unkeyed_extra_copies}): {shown}" + (f"; {unkeyed_detail}" if unkeyed_detail else "")
        )
    if report.changed:
        out.failures.append(f"{report.changed} target copies not as produced: {', '.join(report.changed_examples)}")
    if report.invalid_dead_letters:
        shown = "; ".join(report.invalid_dead_letter_examples)
        out.failures.append(f"{report.invalid_dead_letters} invalid dead-letter records: {shown}")
    if report.unexpected:
        shown = ", ".join(show(i) for i in report.unexpected_examples)
        out.failures.append(f"{report.unexpected} event IDs in the target that were never produced: {shown}")
    if report.out_of_order and config.ordering == "partitionKey":
        shown = ", ".join(
            f"{show(o.event_id)} after {show(o.after)} (key {o.partition_key})"
            for o in report.out_of_order_examples[:examples]
        )
        out.failures.append(f"{report.out_of_order} events out of order per partition key: {shown}")


def _judge_poison(
    out: Check,
    produced: Output,
    target: list[TargetRecord],
    letters: list[DeadLetter],
    forwarded: bool,
    redriven: Collection[str] = frozenset(),
) -> None:
    """Each poison record where its kind and the workers' unkeyed policies send it, or where a redrive sent it
    (see the module docstring)."""
    at = {p.position: p for p in produced.records if p.position is not None}
    valid = [
        (letter.position, letter)
        for letter in letters
        if letter.position is not None and check_dead_letter(letter, at, False, True) is None
    ]
    sent_on = {position for position, letter in valid if was_redriven(letter, None, redriven)}
    in_dlq = Counter(position for position, _ in valid if position not in sent_on)
    in_target = Counter((r.partition_key, r.sha256) for r in target if r.event_id is None)
    redriven_copies: Counter[tuple[str, str | None]] = Counter()
    out.poison_expected = len(produced.poison)
    for p in produced.poison:
        position = (p.shard_id, int(p.sequence_number), 0)
        dlq, tgt = in_dlq[position], in_target[(f"poison-{p.kind}", p.sha256)]
        where = f"poison {p.kind} at {p.shard_id}@{p.sequence_number}"
        if position in sent_on:  # a redrive's: delivered by its target copy, its dead-letter record no copy
            if tgt == 0:
                out.failures.append(f"{where}: redriven, and not in the target")
                continue
            redriven_copies[(f"poison-{p.kind}", p.sha256)] += tgt  # its further copies: the audit judges them
            out.unkeyed_copies += dlq + tgt - 1
        elif forwarded and p.kind != "oversize":
            if dlq + tgt == 0:
                out.failures.append(f"{where}: lost (in neither the target nor the dead-letter stream)")
                continue
            out.unkeyed_copies += dlq + tgt - 1
        elif (dlq, tgt) != (1, 0):
            out.failures.append(f"{where}: {dlq} copies in the dead-letter stream, {tgt} in the target")
            continue
        out.poison_delivered += 1
    known = {(f"poison-{p.kind}", p.sha256) for p in produced.poison}
    strays = sum(n for k, n in in_target.items() if k not in known)
    if strays:
        out.failures.append(f"{strays} records without an event ID in the target that are no poison record")
    elif in_target - redriven_copies and not forwarded:
        count = sum((in_target - redriven_copies).values())
        out.failures.append(f"{count} records without an event ID in the target (poison not dead-lettered)")


def _judge_logs(out: Check, log_paths: list[Path]) -> None:
    """No ``fatal`` or ``unexpected_error`` line: nothing in a chaos run should end a process."""
    fatal = copier_events(log_paths, {"fatal", "unexpected_error"})
    out.fatal_logs = len(fatal)
    if fatal:
        out.failures.append(f"{len(fatal)} fatal errors in the copier's logs: {fatal[0].get('error', fatal[0])}")
