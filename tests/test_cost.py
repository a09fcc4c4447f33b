"""Cost: in steady state at most 2 state-table write requests per forwarded batch, whatever its size.

The requests are counted by the backend itself (moto's request recorder),
not by copier, while a ``copier process`` child forwards batches of 1 to
3,000 events.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.support.backend import DUMMY_ENV, client, create_stream, local_backend
from tests.support.multilang import COPIER, Processor, event
from tests.support.props import write_properties

pytestmark = pytest.mark.protocol

WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}


def state_table_writes(recording: Path, table: str) -> Counter[str]:
    """DynamoDB write requests on ``table`` in a moto recording, by operation."""
    counts: Counter[str] = Counter()
    for line in recording.read_text().splitlines():
        entry = json.loads(line)
        target = {k.lower(): v for k, v in entry["headers"].items()}.get("x-amz-target", "")
        operation = target.rpartition(".")[2]
        if not target.startswith("DynamoDB") or operation not in WRITES:
            continue
        body = base64.b64decode(entry["body"]) if entry.get("body_encoded") else (entry.get("body") or "").encode()
        if f'"{table}"'.encode() in body:
            counts[operation] += 1
    return counts


def test_at_most_two_state_writes_per_forwarded_batch(tmp_path: Path) -> None:
    """Batches of 1, 100, 500, 501 and 3,000 events cost 2 state-table writes each."""
    recording = tmp_path / "recording.jsonl"
    with local_backend(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "staging", 1)
        create_stream(kinesis, "target", 2)
        props = write_properties(
            tmp_path / "p.properties", endpoint, "staging", "target", "cost-state", logLevel="INFO"
        )
        subprocess.run(
            [COPIER, "init", "--properties", str(props)],
            check=True,
            capture_output=True,
            env={**os.environ, **DUMMY_ENV},
        )
        proc = Processor(props)
        try:
            proc.initialize("shardId-000000000000")  # takeover: not steady state
            recording.write_text("")
            seq = 1
            sizes = [1, 100, 500, 501, 3000]
            for size in sizes:
                proc.process([event(seq + i, f"e{seq + i}") for i in range(size)])
                seq += size
            writes = state_table_writes(recording, "cost-state")
        finally:
            proc.kill()
    assert sum(writes.values()) <= 2 * len(sizes), writes
    assert writes == Counter({"TransactWriteItems": len(sizes), "PutItem": len(sizes)})
