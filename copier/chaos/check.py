"""The independent check after a chaos seed: what the target and dead-letter streams hold against what was produced.

It does not ask the copier anything: it reads both streams to their ends
(``copier.verify.StreamReader``) and compares them with the producer's own
record (the manifest of keyed event IDs, and where each poison record sits
in staging) through the same pure audit as ``copier verify``. Then:

* every produced event must be in the target or the dead-letter stream
  (lost: a failure);
* no event may be in the target twice, unless the copier itself reported
  it as a possible duplicate (``possible_duplicates``, the documented limit
  of a process frozen past its lease mid-put): an unexplained duplicate is
  a failure;
* every poison record must be in the dead-letter stream exactly once, and
  nothing without an ID in the target;
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

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from copier.audit import TargetRecord, audit, first_copies, order_violations, production_index
from copier.chaos.producer import Produced
from copier.config import Config
from copier.verify import Progress, StreamReader, dead_letter_event_id, make_client, record_event_id

__all__ = ["Check", "check", "copier_events"]


@dataclass
class Check:
    """The verdict of one seed's streams and logs."""

    expected: int = 0
    target_records: int = 0
    dead_letter_records: int = 0
    lost: int = 0
    duplicated: int = 0
    explained_duplicates: int = 0
    out_of_order: int = 0
    unkeyed_in_target: int = 0
    poison_expected: int = 0
    poison_delivered_once: int = 0
    possible_duplicate_reports: int = 0
    fatal_logs: int = 0
    failures: list[str] = field(default_factory=list)


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


def check(config: Config, produced: Produced, log_paths: list[Path], examples: int = 5) -> Check:
    """Read the target and dead-letter streams and judge them; see the module docstring."""
    progress = Progress(interval=30.0)
    reader = StreamReader(make_client(config, target=True), progress)
    key = config.dedup_key
    target = reader.read(
        config.target_stream_name,
        "target",
        lambda shard_id, r: TargetRecord(record_event_id(key, r), r["PartitionKey"], shard_id, r["SequenceNumber"]),
    )
    envelopes: list[dict[str, Any]] = []
    dead_letter: list[str | None] = []
    if config.dead_letter_stream_name:
        for r in reader.read(config.dead_letter_stream_name, "dead-letter", lambda _s, r: r):
            data = bytes(r["Data"])
            dead_letter.append(dead_letter_event_id(key, r["PartitionKey"], data))
            try:
                envelopes.append(json.loads(data))
            except ValueError:
                pass
    report = audit(produced.manifest, target, dead_letter, examples=10**9)
    out = Check(
        expected=report.expected,
        target_records=report.found,
        dead_letter_records=report.dead_letter_records,
        lost=report.lost,
        duplicated=report.duplicated,
        unkeyed_in_target=report.unkeyed,
    )
    if report.lost:
        out.failures.append(f"lost {report.lost}: {', '.join(report.lost_examples[:examples])}")
    reports = copier_events(log_paths, {"possible_duplicates", "fatal", "unexpected_error"})
    reported = {i for e in reports if e["event"] == "possible_duplicates" for i in e.get("event_ids", [])}
    out.possible_duplicate_reports = sum(1 for e in reports if e["event"] == "possible_duplicates")
    unexplained = [i for i, _ in report.duplicated_examples if i not in reported]
    out.explained_duplicates = report.duplicated - len(unexplained)
    if unexplained:
        out.failures.append(
            f"duplicated {len(unexplained)} without a possible_duplicates report: {unexplained[:examples]}"
        )
    index, _ = production_index(produced.manifest)
    out.out_of_order, disorder_examples = order_violations(first_copies(target), index, examples)
    if out.out_of_order and config.ordering == "partitionKey":
        shown = ", ".join(f"{o.event_id} after {o.after} (key {o.partition_key})" for o in disorder_examples)
        out.failures.append(f"{out.out_of_order} events out of order per partition key: {shown}")
    if report.unkeyed:
        out.failures.append(f"{report.unkeyed} records without an event ID in the target (poison not dead-lettered)")
    fatal = [e for e in reports if e["event"] in ("fatal", "unexpected_error")]
    out.fatal_logs = len(fatal)
    if fatal:
        out.failures.append(f"{len(fatal)} fatal errors in the copier's logs: {fatal[0].get('error', fatal[0])}")
    letters = Counter((e.get("shardId"), e.get("sequenceNumber")) for e in envelopes if "reason" in e)
    out.poison_expected = len(produced.poison)
    for poison in produced.poison:
        copies = letters[(poison.shard_id, poison.sequence_number)]
        if copies == 1:
            out.poison_delivered_once += 1
        else:
            out.failures.append(f"poison {poison.kind} at {poison.shard_id}@{poison.sequence_number}: {copies} copies")
    return out
