"""What a redrive and a repair cost: requests by call, GetRecords reads and DynamoDB write units per event sent.

Counted from the requests the local backend received (moto's request
recorder), as ``copier.bench.cost`` counts the live copier's;
``copier.local.billing`` applies DynamoDB's item size and write unit rules.
So the figures are what AWS would bill for the requests made, not what
copier believes it made; docs/protocol.md says what the code implies
(requests a page, a put request, a chunk) and the numbers are here, in
benchmarks.json, never typed into a document.

* redrive: ``events`` records without an event ID dead-lettered by the live
  processor (``unkeyedPolicy = deadletter``, two deliveries), then one
  ``copier redrive`` of them all;
* repair: ``events`` events in a 4-shard staging stream that the live
  processors committed past without forwarding (a delivery starting after
  them), then one ``copier repair`` of the whole range: two audits, the lost
  records read back, put and committed.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import boto3

from copier.local.backend import DUMMY_ENV, spawned
from copier.local.billing import billed_writes
from copier.local.multilang import COPIER, Processor, records_message
from copier.local.pipeline import local_properties

__all__ = ["TABLE", "calls", "measure_redrive", "measure_repair", "measure_sources", "measured"]

TABLE = "sources-state"
SHARD = "shardId-000000000000"


def calls(recording: Path) -> Counter[str]:
    """Requests by call (``Kinesis.GetRecords``, ``DynamoDB.PutItem``, ...)."""
    out: Counter[str] = Counter()
    for line in recording.read_text().splitlines():
        headers = {k.lower(): v for k, v in json.loads(line)["headers"].items()}
        target = headers.get("x-amz-target", "")
        if target:
            service, _, operation = target.partition(".")
            out[f"{'Kinesis' if service.startswith('Kinesis') else 'DynamoDB'}.{operation}"] += 1
    return out


def measured(recording: Path, events: int) -> dict[str, Any]:
    """The state table's billed write units and the requests by call, per ``events`` events sent."""
    writes = [w for w in billed_writes(recording.read_text().splitlines()) if w.table == TABLE]
    units = sum(w.units for w in writes)
    return {
        "events": events,
        "write_units": units,
        "write_units_per_event": round(units / events, 4),
        "digest_batch_bytes_per_event": round(
            sum(w.size for w in writes if w.sort_key.startswith("batch#")) / events, 1
        ),
        "requests": dict(sorted(calls(recording).items())),
    }


def _properties(path: Path, endpoint: str, **copier: str) -> Path:
    keys = {"stateTableName": TABLE, "logLevel": "WARNING", "checkpointIntervalMillis": "0", **copier}
    return local_properties(path, endpoint, "sources", "staging", "target", COPIER, kcl=None, **keys)


def _streams(endpoint: str, *streams: tuple[str, int]) -> Any:
    os.environ.update({k: v for k, v in DUMMY_ENV.items() if k not in os.environ})  # Processor's children too
    kinesis = boto3.session.Session(region_name="us-east-1").client("kinesis", endpoint_url=endpoint)
    for name, shards in streams:
        kinesis.create_stream(StreamName=name, ShardCount=shards)
        kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})
    return kinesis


def _copier(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COPIER, *args], capture_output=True, text=True, env={**os.environ, **DUMMY_ENV})


def _checked(run: subprocess.CompletedProcess[str], says: str) -> None:
    if run.returncode != 0 or says not in run.stdout:
        raise RuntimeError(f"{run.args[1]}: exit {run.returncode}, expected {says!r}: {run.stdout}{run.stderr[-2000:]}")


def measure_redrive(workdir: Path, events: int) -> dict[str, Any]:
    """``events`` (even) dead-lettered records without an event ID, redriven in one run (module docstring)."""
    recording = workdir / "redrive.jsonl"
    with spawned(**DUMMY_ENV, MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        _streams(endpoint, ("staging", 1), ("target", 4), ("dlq", 1))
        props = _properties(
            workdir / "redrive.properties", endpoint, deadLetterStreamName="dlq", unkeyedPolicy="deadletter"
        )
        _checked(_copier("init", "--properties", str(props)), "")
        live = Processor(props)
        try:
            live.initialize(SHARD)
            half = events // 2
            for first in (1, half + 1):
                entries = [
                    (f"k{n}", f"record {n} without an event ID {'x' * 150}".encode())
                    for n in range(first, first + half)
                ]
                live.process_json(records_message(entries, first))
        finally:
            live.kill()
        recording.write_text("")
        _checked(_copier("redrive", "--properties", str(props)), f"sent {2 * half} (no_id {2 * half})")
        return measured(recording, 2 * half)


def measure_repair(workdir: Path, events: int) -> dict[str, Any]:
    """``events`` (a multiple of 500) events lost in a 4-shard staging stream, repaired in one run (module
    docstring)."""
    recording = workdir / "repair.jsonl"
    with spawned(**DUMMY_ENV, MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        kinesis = _streams(endpoint, ("staging", 4), ("target", 4))
        props = _properties(workdir / "repair.properties", endpoint, dedupWindowSeconds="0", coalesceEvents="1")
        _checked(_copier("init", "--properties", str(props)), "")
        for first in range(0, events, 500):
            entries = [
                {"PartitionKey": f"k{n}", "Data": json.dumps({"eventId": f"e{n}"}).encode()}
                for n in range(first, min(events, first + 500))
            ]
            kinesis.put_records(StreamName="staging", Records=entries)
        for shard in kinesis.list_shards(StreamName="staging")["Shards"]:  # each live shard committed past them
            live = Processor(props)
            try:
                live.initialize(shard["ShardId"])
                late = json.dumps({"eventId": f"late-{shard['ShardId']}"}).encode()
                live.process_json(records_message([("late", late)], 10**40))
            finally:
                live.kill()
        recording.write_text("")
        run = _copier("repair", "--properties", str(props), "--since", "0", "--until", "2100-01-01")
        _checked(run, f"lost in the range: {events}; put {events}; waiting 0")
        return measured(recording, events)


def measure_sources(workdir: Path, events: int) -> dict[str, Any]:
    """The ``sources`` part of ``python -m copier.bench``: a redrive's and a repair's figures, ``events`` each."""
    workdir.mkdir(parents=True, exist_ok=True)
    return {"redrive": measure_redrive(workdir, events), "repair": measure_repair(workdir, events)}
