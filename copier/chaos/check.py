"""The independent check after a chaos seed: what the target and dead-letter streams hold against what was produced.

It does not ask the copier anything: it reads both streams to their ends
(``copier.verify.StreamReader``) and compares them with the producer's own
record (the manifest of keyed event IDs, and where each poison record sits
in staging) through the same pure audit as ``copier verify``. Events are
identified by ``eventId`` whatever dedup key each worker ran with (the
producer's ``alt`` field is one to one with it). Then:

* every shard of both streams, closed ones included (a reshard of the
  target closes its parents), must have been read to its last record: the
  local backend gives a closed shard's last record as its
  ``EndingSequenceNumber`` (``copier.local.moto_patches``), and a read that
  stopped short fails the seed;
* every produced event must be in the target or the dead-letter stream
  (lost: a failure);
* no event may be in the two streams more than once, unless the copier
  itself reported it as a possible duplicate (``possible_duplicates``, the
  documented limit of a process frozen past its lease mid-put; its IDs
  under either dedup key): an unexplained duplicate is a failure;
* every poison record (all are without an event ID) must be delivered:
  when every worker ran ``unkeyedPolicy = deadletter``, to the dead-letter
  stream exactly once, with nothing without an ID in the target. When some
  worker ran ``forward``, a poison record goes to the target under that
  worker and to the dead-letter stream under another, at least once (an
  unkeyed send whose put was ambiguous is sent again: it cannot be told
  apart from an identical record): it must be in one of the two, and its
  copies beyond the first are counted (``unkeyed_copies``), not failed. The
  "oversize" poison is no exception: a record of a megabyte that is not
  JSON, it is under the target's record limit (1 MiB, the same as staging's:
  staging could not hold a record the target refuses), so its policy sends
  it like the others; what is oversize is its dead-letter envelope, which
  keeps its SHA-256 instead of its bytes. A record without an ID in the
  target that is no poison record fails;
* the copier's logs must hold no ``fatal`` or ``unexpected_error``: nothing
  in a chaos run is a fault that should end a process;
* with ``copier.ordering = partitionKey`` (the default, and what the suite
  runs), each key's events must arrive in the order they were produced: an
  event whose first copy lands after a later-produced event of its key is a
  failure (the producer writes each key to one shard in production order, so
  production order is staging order). A duplicate's later copy is not
  counted again: it is judged as a duplicate above. With ``none`` such
  events are only counted.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from copier.audit import TargetRecord, audit, first_copies, order_violations, production_index
from copier.chaos.producer import Poison, Produced, original_id
from copier.config import Config, DedupKey
from copier.kinesis import paged_shards
from copier.verify import Progress, StreamReader, dead_letter_event_id, make_client, record_event_id

__all__ = ["Check", "check", "copier_events"]

KinesisRecord = dict[str, Any]


@dataclass
class Check:
    """The verdict of one seed's streams and logs."""

    expected: int = 0
    target_records: int = 0
    dead_letter_records: int = 0
    target_shards: int = 0  # every shard read, closed ones included
    target_shards_closed: int = 0
    lost: int = 0
    duplicated: int = 0
    explained_duplicates: int = 0
    out_of_order: int = 0
    unkeyed_in_target: int = 0
    unkeyed_copies: int = 0  # copies of poison records without an ID beyond the first (unkeyedPolicy = forward)
    poison_expected: int = 0
    poison_delivered: int = 0
    possible_duplicate_reports: int = 0
    fatal_logs: int = 0
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Read:
    """One stream as read: its records as (shard, record), and its shards as ListShards gives them."""

    records: list[tuple[str, KinesisRecord]]
    shards: list[dict[str, Any]]


def copier_events(log_paths: Iterable[Path], names: set[str]) -> list[dict[str, Any]]:
    """The copier's JSON log events named ``names`` in worker logs (the daemon relays each stderr line)."""
    found: list[dict[str, Any]] = []
    for path in log_paths:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                start = line.find('{"')
                if start < 0 or not any(f'"event": "{n}"' in line for n in names):
                    continue
                try:
                    event = json.loads(line[start:])
                except ValueError:
                    continue
                if event.get("event") in names:
                    found.append(event)
    return found


def _read(reader: StreamReader, client: Any, stream: str, label: str) -> _Read:
    records = reader.read(stream, label, lambda shard_id, r: (shard_id, r))
    return _Read(records, paged_shards(client.list_shards, stream))


def _short_reads(stream: str, read: _Read) -> list[str]:
    """Closed shards whose read stopped before their last record (``EndingSequenceNumber`` on the local backend)."""
    last: dict[str, int] = {}
    for shard_id, record in read.records:
        last[shard_id] = max(last.get(shard_id, 0), int(record["SequenceNumber"]))
    out = []
    for shard in read.shards:
        numbers = shard["SequenceNumberRange"]
        end = numbers.get("EndingSequenceNumber")
        if end is None or end == numbers["StartingSequenceNumber"]:
            continue  # open, or closed without a record
        read_to = last.get(shard["ShardId"])
        if read_to != int(end):
            out.append(f"{stream} shard {shard['ShardId']} read to {read_to}, its last record is {end}")
    return out


def _target_records(key: DedupKey, read: _Read) -> tuple[list[TargetRecord], Counter[str]]:
    """The target's records for the audit, and the SHA-256 of each record without an event ID, counted."""
    records, unkeyed = [], Counter[str]()
    for shard_id, r in read.records:
        event_id = record_event_id(key, r)
        records.append(TargetRecord(event_id, r["PartitionKey"], shard_id, r["SequenceNumber"]))
        if event_id is None:
            unkeyed[hashlib.sha256(bytes(r["Data"])).hexdigest()] += 1
    return records, unkeyed


def _dead_letters(key: DedupKey, read: _Read) -> tuple[list[str | None], Counter[tuple[str, str]]]:
    """The event ID in each dead-letter record (None without one), and the envelopes counted by staging position."""
    ids: list[str | None] = []
    letters: Counter[tuple[str, str]] = Counter()
    for _, r in read.records:
        data = bytes(r["Data"])
        ids.append(dead_letter_event_id(key, r["PartitionKey"], data))
        try:
            envelope = json.loads(data)
        except ValueError:
            continue
        if isinstance(envelope, dict) and "reason" in envelope:
            letters[(str(envelope.get("shardId")), str(envelope.get("sequenceNumber")))] += 1
    return ids, letters


def _duplicates(target: list[TargetRecord], dead_letter: list[str | None]) -> list[str]:
    """Event IDs with more than one copy in the two streams together (exactly once holds across both)."""
    copies = Counter(r.event_id for r in target if r.event_id is not None)
    copies.update(i for i in dead_letter if i is not None)
    return [i for i, n in copies.items() if n > 1]


def _judge_poison(
    out: Check, poison: list[Poison], letters: Counter[tuple[str, str]], unkeyed: Counter[str], forwarded: bool
) -> None:
    """Each poison record where its kind and the workers' unkeyed policies send it (see the module docstring)."""
    out.poison_expected = len(poison)
    for p in poison:
        in_dlq, in_target = letters[(p.shard_id, p.sequence_number)], unkeyed[p.sha256]
        where = f"poison {p.kind} at {p.shard_id}@{p.sequence_number}"
        if forwarded:
            if in_dlq + in_target == 0:
                out.failures.append(f"{where}: lost (in neither the target nor the dead-letter stream)")
                continue
            out.unkeyed_copies += in_dlq + in_target - 1
        elif (in_dlq, in_target) != (1, 0):
            out.failures.append(f"{where}: {in_dlq} copies in the dead-letter stream, {in_target} in the target")
            continue
        out.poison_delivered += 1
    known = {p.sha256 for p in poison}
    strays = sum(n for sha, n in unkeyed.items() if sha not in known)
    if strays:
        out.failures.append(f"{strays} records without an event ID in the target that are no poison record")
    elif unkeyed and not forwarded:
        count = sum(unkeyed.values())
        out.failures.append(f"{count} records without an event ID in the target (poison not dead-lettered)")


def check(
    config: Config, produced: Produced, log_paths: list[Path], examples: int = 5, unkeyed_forwarded: bool = False
) -> Check:
    """Read the target and dead-letter streams and judge them; see the module docstring.

    ``config``: the one the check reads with (its dedup key names ``eventId``); ``unkeyed_forwarded``:
    whether any worker ran with ``copier.unkeyedPolicy = forward``.
    """
    client = make_client(config, target=True)
    reader = StreamReader(client, Progress(interval=30.0))
    key = config.dedup_key
    target_read = _read(reader, client, config.target_stream_name, "target")
    target, unkeyed = _target_records(key, target_read)
    out = Check(target_shards=len(target_read.shards))
    out.target_shards_closed = sum(1 for s in target_read.shards if "EndingSequenceNumber" in s["SequenceNumberRange"])
    out.failures.extend(_short_reads(config.target_stream_name, target_read))
    dead_letter: list[str | None] = []
    letters: Counter[tuple[str, str]] = Counter()
    if config.dead_letter_stream_name:
        dlq_read = _read(reader, client, config.dead_letter_stream_name, "dead-letter")
        out.failures.extend(_short_reads(config.dead_letter_stream_name, dlq_read))
        dead_letter, letters = _dead_letters(key, dlq_read)
    report = audit(produced.manifest, target, dead_letter, examples=examples)
    out.expected, out.target_records, out.dead_letter_records = report.expected, report.found, len(dead_letter)
    out.lost, out.unkeyed_in_target = report.lost, report.unkeyed
    if report.lost:
        out.failures.append(f"lost {report.lost}: {', '.join(report.lost_examples[:examples])}")
    _judge_duplicates(out, _duplicates(target, dead_letter), log_paths, examples)
    _judge_order(out, config, produced, target, examples)
    _judge_poison(out, produced.poison, letters, unkeyed, unkeyed_forwarded)
    return out


def _judge_duplicates(out: Check, duplicated: list[str], log_paths: list[Path], examples: int) -> None:
    """Duplicates must each be named by a ``possible_duplicates`` report; no ``fatal`` line may be logged."""
    reports = copier_events(log_paths, {"possible_duplicates", "fatal", "unexpected_error"})
    reported = {original_id(i) for e in reports if e["event"] == "possible_duplicates" for i in e.get("event_ids", [])}
    out.possible_duplicate_reports = sum(1 for e in reports if e["event"] == "possible_duplicates")
    unexplained = [i for i in duplicated if i not in reported]
    out.duplicated, out.explained_duplicates = len(duplicated), len(duplicated) - len(unexplained)
    if unexplained:
        out.failures.append(
            f"duplicated {len(unexplained)} without a possible_duplicates report: {unexplained[:examples]}"
        )
    fatal = [e for e in reports if e["event"] in ("fatal", "unexpected_error")]
    out.fatal_logs = len(fatal)
    if fatal:
        out.failures.append(f"{len(fatal)} fatal errors in the copier's logs: {fatal[0].get('error', fatal[0])}")


def _judge_order(out: Check, config: Config, produced: Produced, target: list[TargetRecord], examples: int) -> None:
    """Each key's first copies in production order (a failure under ``copier.ordering = partitionKey``)."""
    index, _ = production_index(produced.manifest)
    out.out_of_order, disorder_examples = order_violations(first_copies(target), index, examples)
    if out.out_of_order and config.ordering == "partitionKey":
        shown = ", ".join(f"{o.event_id} after {o.after} (key {o.partition_key})" for o in disorder_examples)
        out.failures.append(f"{out.out_of_order} events out of order per partition key: {shown}")
