"""Processor CPU per event, through the real MultiLang protocol: copier against a plain at-least-once copier.

Each case (payload size, batch size) is run by both processors, driven
over their pipes exactly as the KCL daemon drives them (``copier.local.
multilang``), against the same local backend: ``initialize``, one warm-up
batch, then ``events`` events in batches. What is measured is the
processor process's own user + system CPU time (``/proc/<pid>/stat``)
across the measured batches, divided by the events: the protocol parsing,
de-serialisation and PutRecords that both pay, and what copier adds
(event IDs, digests, the window, its state writes). Runs alternate between
the two processors and repeat; the median is kept, and the ratio is taken
within a repetition, so a noisy machine moves both alike.
"""

from __future__ import annotations

import json
import statistics
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.local.multilang import Processor, records_message

__all__ = ["CpuCase", "CpuResult", "messages", "payload", "run_case"]


@dataclass(frozen=True)
class CpuCase:
    payload_bytes: int
    batch: int
    events: int


@dataclass(frozen=True)
class CpuResult:
    case: CpuCase
    plain_us: float  # median CPU microseconds per event
    copier_us: float
    ratio: float  # median of the per-repetition ratios copier / plain
    repeats: int

    @property
    def copier_events_per_core_s(self) -> float:
        return 1e6 / self.copier_us

    def to_json(self) -> dict[str, Any]:
        return {
            "payload_bytes": self.case.payload_bytes,
            "batch": self.case.batch,
            "events": self.case.events,
            "plain_us_per_event": round(self.plain_us, 2),
            "copier_us_per_event": round(self.copier_us, 2),
            "ratio": round(self.ratio, 3),
            "copier_events_per_core_s": round(self.copier_events_per_core_s),
            "repeats": self.repeats,
        }


def payload(n: int, size: int, run: str) -> tuple[str, bytes]:
    """(event ID, a JSON event of about ``size`` bytes): what a Spark job writes."""
    event_id = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{run}-{n}"))
    doc = {"eventId": event_id, "user": f"user-{n % 1000}", "amount": n % 997, "kind": "purchase", "body": ""}
    doc["body"] = "x" * max(0, size - len(json.dumps(doc)))
    return event_id, json.dumps(doc).encode()


def messages(case: CpuCase, run: str, first_seq: int) -> Iterator[str]:
    """The processRecords lines of a case, encoded up front so that encoding is not measured."""
    for first in range(0, case.events, case.batch):
        entries = [payload(n, case.payload_bytes, run) for n in range(first, min(case.events, first + case.batch))]
        yield records_message(entries, first_seq + first)


def _measure(command: list[str] | None, properties: Path, case: CpuCase, shard: str, run: str) -> float:
    """CPU seconds per event of one processor over one case."""
    proc = Processor(properties, shard, command)
    try:
        proc.initialize(shard)
        warm_up = CpuCase(case.payload_bytes, min(case.batch, 500), min(case.batch, 500))
        for message in messages(warm_up, f"{run}-warm", 1):
            proc.process_json(message)
        lines = list(messages(case, run, 1_000_000))
        before = proc.cpu_seconds()
        for message in lines:
            proc.process_json(message)
        spent = proc.cpu_seconds() - before
    finally:
        proc.close()
    return spent / case.events


def run_case(
    properties: Path, plain_command: list[str], case: CpuCase, repeats: int, shards: Iterator[str]
) -> CpuResult:
    """Both processors, ``repeats`` times each, alternating; medians and the median ratio."""
    plain: list[float] = []
    copier: list[float] = []
    for r in range(repeats):
        run = uuid.uuid4().hex[:8]
        order = (
            [("plain", plain_command), ("copier", None)] if r % 2 == 0 else [("copier", None), ("plain", plain_command)]
        )
        for kind, command in order:
            per_event = _measure(command, properties, case, next(shards), f"{run}-{kind}")
            (plain if kind == "plain" else copier).append(per_event)
    ratios = [c / p for c, p in zip(copier, plain, strict=True)]
    return CpuResult(
        case, statistics.median(plain) * 1e6, statistics.median(copier) * 1e6, statistics.median(ratios), repeats
    )
