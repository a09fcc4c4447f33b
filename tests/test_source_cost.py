"""What a redrive and a repair cost: requests by call, GetRecords reads, DynamoDB write units per event sent.

Counted from the requests the local backend received (moto's request recorder), as ``tests/test_cost.py`` counts
the live copier's; ``copier.local.billing`` applies DynamoDB's item size and write unit rules. The figures are
printed (``-s``) for docs/protocol.md and bounded here.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from copier.local.billing import billed_writes
from copier.local.multilang import COPIER, Processor, records_message
from tests.support.backend import DUMMY_ENV, client, create_stream, local_backend
from tests.support.props import write_properties

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]

SHARD = "shardId-000000000000"
TABLE = "cost-state"


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


def measured(recording: Path, events: int, what: str) -> dict[str, Any]:
    writes = [w for w in billed_writes(recording.read_text().splitlines()) if w.table == TABLE]
    units = sum(w.units for w in writes)
    requests = calls(recording)
    figures = {
        "events": events,
        "write_units": units,
        "write_units_per_event": round(units / events, 4),
        "digest_batch_bytes_per_event": round(
            sum(w.size for w in writes if w.sort_key.startswith("batch#")) / events, 1
        ),
        "requests": dict(sorted(requests.items())),
    }
    print(f"\n{what}: {json.dumps(figures)}")
    return figures


def test_what_a_redrive_costs(tmp_path: Path) -> None:
    """5,000 dead-lettered records (two deliveries of 2,500 without an event ID) redriven in one run."""
    recording = tmp_path / "recording.jsonl"
    with local_backend(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        kinesis = client("kinesis", endpoint)
        for stream, shards in (("staging", 1), ("target", 4), ("dlq", 1)):
            create_stream(kinesis, stream, shards)
        props = write_properties(
            tmp_path / "p.properties",
            endpoint,
            "staging",
            "target",
            TABLE,
            logLevel="INFO",
            deadLetterStreamName="dlq",
            unkeyedPolicy="deadletter",
        )
        env = {**os.environ, **DUMMY_ENV}
        subprocess.run([COPIER, "init", "--properties", str(props)], check=True, capture_output=True, env=env)
        live = Processor(props)
        try:
            live.initialize(SHARD)
            for first in (1, 2501):
                entries = [
                    (f"k{n}", f"record {n} without an event ID {'x' * 150}".encode())
                    for n in range(first, first + 2500)
                ]
                live.process_json(records_message(entries, first))
        finally:
            live.kill()
        recording.write_text("")
        run = subprocess.run([COPIER, "redrive", "--properties", str(props)], capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stdout + run.stderr[-2000:]
        assert "sent 5000 (no_id 5000)" in run.stdout
        figures = measured(recording, 5000, "redrive of 5,000 dead-letter records")
    requests = figures["requests"]
    assert requests["Kinesis.PutRecords"] == 10, "500 records a request"
    assert requests["Kinesis.GetRecords"] <= 3, "the dead-letter shard read once, 10,000 records a page"
    assert figures["write_units_per_event"] <= 0.04, figures


def test_what_a_repair_costs(tmp_path: Path) -> None:
    """5,000 events lost (a daemon that started past them) in a 4-shard staging stream, put back in one run:
    every staging shard's repair item taken over, the streams audited before and after."""
    recording = tmp_path / "recording.jsonl"
    with local_backend(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "staging", 4)
        create_stream(kinesis, "target", 4)
        props = write_properties(
            tmp_path / "p.properties", endpoint, "staging", "target", TABLE, logLevel="INFO", dedupWindowSeconds=0
        )
        env = {**os.environ, **DUMMY_ENV}
        subprocess.run([COPIER, "init", "--properties", str(props)], check=True, capture_output=True, env=env)
        for first in range(0, 5000, 500):
            entries = [
                {"PartitionKey": f"k{n}", "Data": json.dumps({"eventId": f"e{n}"}).encode()}
                for n in range(first, first + 500)
            ]
            kinesis.put_records(StreamName="staging", Records=entries)
        for shard in kinesis.list_shards(StreamName="staging")["Shards"]:  # each live shard committed past them
            live = Processor(props)
            try:
                live.initialize(shard["ShardId"])
                live.process_json(
                    records_message([("late", json.dumps({"eventId": f"late-{shard['ShardId']}"}).encode())], 10**40)
                )
            finally:
                live.kill()
        recording.write_text("")
        until = "2100-01-01"
        run = subprocess.run(
            [COPIER, "repair", "--properties", str(props), "--since", "0", "--until", until],
            capture_output=True,
            text=True,
            env=env,
        )
        assert run.returncode == 0, run.stdout + run.stderr[-2000:]
        assert "lost in the range: 5000; put 5000; waiting 0" in run.stdout, run.stdout
        figures = measured(recording, 5000, "repair of 5,000 lost events (4 staging shards)")
    requests = figures["requests"]
    assert requests["Kinesis.PutRecords"] <= 12 + 4, "500 records a request (a shard's last one short)"
    assert figures["write_units_per_event"] <= 0.04, figures
