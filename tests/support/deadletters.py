"""A staging stream whose copier dead-lettered records of every reason, for the redrive tests.

Real records in the local backend's staging stream, read back and delivered to
a real ``copier process`` as the daemon delivers them (KPL aggregates
de-aggregated, arrival times as Kinesis stamped them), so that the dead-letter
envelopes name real staging positions: a redrive reads the bytes of an
envelope that kept only their SHA-256 back from there, and ``copier verify``
judges every envelope against staging.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from copier.core.kpl import aggregate, as_daemon_delivers
from copier.local.multilang import COPIER, Processor, Rec
from tests.support.backend import DUMMY_ENV, create_stream, read_stream

SHARD = "shardId-000000000000"
BIG = 1100 * 1024  # over the target's 1 MiB record limit, under staging's raised 2 MiB


def raise_limit(kinesis: Any, stream: str, kib: int = 2048) -> None:
    arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
    kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=kib)


def staged_recs(kinesis: Any, stream: str) -> list[Rec]:
    """Every record of the staging stream as the daemon delivers it to the processor."""
    out: list[Rec] = []
    for r in read_stream(kinesis, stream):
        view = as_daemon_delivers(bytes(r["Data"]), r["PartitionKey"])
        arrival = int(r["ApproximateArrivalTimestamp"].timestamp() * 1000)
        for n, (key, data) in enumerate(view.records):
            out.append(Rec(int(r["SequenceNumber"]), data, key, n if view.aggregated else 0, arrival))
    return out


@dataclass
class DeadLettered:
    """What the live copier did: the keyed events it dead-lettered (by reason), those it forwarded, the records
    without an event ID it dead-lettered (key, bytes), and the dead-letter stream's records as it left them."""

    dlq: str
    oversize: list[str]
    bad_key: list[str]
    forwarded: list[str]
    unkeyed: list[tuple[str, bytes]]
    dead_letters: list[bytes] = field(default_factory=list)
    live: Processor | None = None


def dead_lettered(
    pipeline: Any, processors: Any, unkeyed: int = 20, big: int = 2, window_s: int = 1, **keys: object
) -> DeadLettered:
    """Staging written with forwarded events, ``big`` events over the target's limit (the first written again
    past the 1-second window: dead-lettered twice), an aggregate with a user record under an empty key, and
    ``unkeyed`` records without an event ID (dead-lettered under ``unkeyedPolicy = deadletter``); all delivered
    to a ``copier process`` that is left running (``live``) for later deliveries. With a dedup window longer
    than the retry's distance (``window_s``) the retry is a duplicate instead, dead-lettered once."""
    kinesis = pipeline.kinesis
    dlq = f"{pipeline.staging}-dlq"
    create_stream(kinesis, dlq, 1)
    pipeline.write_properties(deadLetterStreamName=dlq, unkeyedPolicy="deadletter", dedupWindowSeconds=window_s, **keys)
    raise_limit(kinesis, pipeline.staging)
    oversize = [f"big-{n}" for n in range(big)]
    bodies = {e: big_body(e) for e in oversize}
    for event_id in oversize:
        kinesis.put_record(StreamName=pipeline.staging, PartitionKey=event_id, Data=bodies[event_id])
    forwarded = ["ok-0", "ok-1", "a-1"]
    for event_id in forwarded[:2]:
        kinesis.put_record(StreamName=pipeline.staging, PartitionKey=event_id, Data=_event(event_id))
    records = [(f"u-{n}", f"raw record {n}".encode()) for n in range(unkeyed)]
    for start in range(0, len(records), 500):
        entries = [{"PartitionKey": k, "Data": d} for k, d in records[start : start + 500]]
        kinesis.put_records(StreamName=pipeline.staging, Records=entries)
    (agg,) = aggregate([("a-1", _event("a-1")), ("", _event("bad-key-1"))])
    kinesis.put_record(
        StreamName=pipeline.staging,
        PartitionKey=agg.partition_key,
        Data=agg.data,
        ExplicitHashKey=agg.explicit_hash_key,
    )
    first = staged_recs(kinesis, pipeline.staging)
    time.sleep(1.5)  # past the 1-second dedup window: the retry is dead-lettered again
    kinesis.put_record(StreamName=pipeline.staging, PartitionKey=oversize[0], Data=bodies[oversize[0]])
    everything = staged_recs(kinesis, pipeline.staging)
    live = processors(pipeline, "live")
    live.initialize(SHARD)
    live.process(first)
    live.process(everything[len(first) :])
    out = DeadLettered(dlq, oversize, ["bad-key-1"], forwarded, records, live=live)
    out.dead_letters = dead_letter_data(kinesis, dlq)
    twice = 1 if window_s < 1.5 else 0
    assert len(out.dead_letters) == unkeyed + big + 1 + twice, "every reason dead-lettered (the retry past the window)"
    return out


def big_body(event_id: str) -> bytes:
    """An event over the target's 1 MiB record limit (as its producer writes it, every time)."""
    return json.dumps({"eventId": event_id, "pad": "x" * BIG}).encode()


def _event(event_id: str) -> bytes:
    return json.dumps({"eventId": event_id}).encode()


def dead_letter_data(kinesis: Any, dlq: str) -> list[bytes]:
    return sorted(bytes(r["Data"]) for r in read_stream(kinesis, dlq))


def target_copies(kinesis: Any, target: str) -> tuple[Counter[str], Counter[tuple[str, bytes]]]:
    """The target's keyed events (by event ID) and its records without one (by key and bytes)."""
    keyed: Counter[str] = Counter()
    unkeyed: Counter[tuple[str, bytes]] = Counter()
    for r in read_stream(kinesis, target):
        data = bytes(r["Data"])
        try:
            keyed[json.loads(data)["eventId"]] += 1
        except (ValueError, KeyError, TypeError):
            unkeyed[(r["PartitionKey"], data)] += 1
    return keyed, unkeyed


class Command:
    """A ``copier`` command in a process of its own: its stderr read as it comes (JSON log lines and progress),
    so that a test can act (SIGKILL it, start another) when a line shows up."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, **DUMMY_ENV}
        self.proc = subprocess.Popen(
            [COPIER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: list[str] = []
        self.out = ""
        self._err = threading.Thread(target=self._read_err, daemon=True)
        self._err.start()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in list(self.lines):
            if line.startswith("{"):
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if entry.get("event") == name:
                    found.append(entry)
        return found

    def wait_for(self, name: str, count: int = 1, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events(name)) < count:
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before {count} x {name}: {self.lines[-10:]}")
            assert time.monotonic() < deadline, f"no {count} x {name!r}; tail: {self.lines[-5:]}"
            time.sleep(0.005)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._err.join(timeout=10)

    def finish(self, timeout: float = 120) -> int:
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.read()
        code = self.proc.wait(timeout=timeout)
        self._err.join(timeout=10)
        return code


def reports_file(path: Path, *commands: Command) -> Path:
    """The ``possible_duplicates`` lines the commands logged, as ``copier verify --reports`` reads them."""
    path.write_text("".join(line + "\n" for c in commands for line in c.lines if "possible_duplicates" in line))
    return path


def second_run_while_frozen(first: Command, properties: Path, kind: str, start: Callable[[], Command]) -> Command:
    """Freeze ``first`` (SIGSTOP) once its chunk is recorded; ``copier status`` shows its run at work; start the
    second run, which announces itself and waits out the first's lease; resume the first. The second run."""
    first.wait_for("batch_recorded")
    os.kill(first.proc.pid, signal.SIGSTOP)
    try:
        status = Command("status", "--properties", str(properties))
        assert status.finish() == 0 and f"{kind} {SHARD}: running" in status.out, status.out
        second = start()
        second.wait_for("waiting_for_lease")
    finally:
        os.kill(first.proc.pid, signal.SIGCONT)
    return second
