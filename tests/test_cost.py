"""Cost: DynamoDB write units per forwarded event, from the billed sizes of the requests the backend received.

The requests are recorded by the backend itself (moto's request recorder),
not counted by copier, while a ``copier process`` child forwards batches;
``copier.local.billing`` applies DynamoDB's item size and write unit rules.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest

from copier.core.summaryboard import BOARD_SK
from copier.local.billing import BilledWrite, billed_writes
from copier.local.multilang import COPIER, Processor, event
from tests.support.backend import DUMMY_ENV, client, create_stream, local_backend
from tests.support.props import write_properties

pytestmark = pytest.mark.protocol

TABLE = "cost-state"
LEASE_MS = 3_600_000  # longer than any run of these tests: no renewal, only what a delivery costs


def forward(sizes: list[int], tmp_path: Path) -> dict[int, list[BilledWrite]]:
    """Forward one batch of each size (events with UUID IDs); the state table's billed writes per batch."""
    recording = tmp_path / "recording.jsonl"
    per_batch: dict[int, list[BilledWrite]] = {}
    with local_backend(MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        kinesis = client("kinesis", endpoint)
        create_stream(kinesis, "staging", 1)
        create_stream(kinesis, "target", 4)
        # A lease far longer than the test: a commit is then the only state write a delivery makes, however slow
        # the machine (with the 3 s default a loaded machine renewed it between two deliveries: a second write).
        props = write_properties(
            tmp_path / "p.properties", endpoint, "staging", "target", TABLE, logLevel="INFO", leaseMillis=LEASE_MS
        )
        env = {**os.environ, **DUMMY_ENV}
        subprocess.run([COPIER, "init", "--properties", str(props)], check=True, capture_output=True, env=env)
        proc = Processor(props)
        try:
            proc.initialize("shardId-000000000000")  # takeover: not steady state
            seq = 1
            for n, size in enumerate(sizes):
                recording.write_text("")
                ids = [str(uuid.UUID(int=seq + i)) for i in range(size)]
                proc.process([event(seq + i, event_id, body="x" * 150) for i, event_id in enumerate(ids)])
                seq += size
                per_batch[n] = [w for w in billed_writes(recording.read_text().splitlines()) if w.table == TABLE]
        finally:
            proc.kill()
    return per_batch


def shard_writes(writes: list[BilledWrite]) -> list[BilledWrite]:
    """A batch's writes of the shard's own items: not the application's answers (``sk = summary``,
    ``copier.core.summaryboard``), which a stream's first reader writes once per refresh for every host."""
    return [w for w in writes if w.sort_key != BOARD_SK]


def test_write_units_per_event_at_500_and_5000_event_batches(tmp_path: Path) -> None:
    """At most 0.015 write units an event with 500-event batches, less with 5,000; single-item writes only.

    Each batch is one digest batch (10 bytes an event) and one commit of the
    state item (under 1 KB): no transaction, which DynamoDB bills twice.
    """
    sizes = [500] * 4 + [5000] * 2
    everything = forward(sizes, tmp_path)
    application = [w for writes in everything.values() for w in writes if w.sort_key == BOARD_SK]
    # the staging and target streams' answers, each a turn taken and an answer posted, 1 unit each: once for the run
    assert len(application) <= 4 and all(w.units == 1 and w.operation == "PutItem" for w in application), application
    per_batch = {n: shard_writes(writes) for n, writes in everything.items()}
    units = {n: sum(w.units for w in writes) for n, writes in per_batch.items()}
    at_500 = sum(units[n] for n in range(4)) / 2000
    at_5000 = sum(units[n] for n in (4, 5)) / 10000
    assert at_500 <= 0.015, (at_500, per_batch[0])
    assert at_5000 < at_500, (at_5000, at_500)
    for writes in per_batch.values():
        kinds = Counter("state" if w.sort_key == "state" else "batch" for w in writes)
        assert kinds == Counter({"state": 1, "batch": 1}), writes
        assert {w.operation for w in writes} == {"PutItem"}
        assert next(w for w in writes if w.sort_key == "state").units == 1, "the state item stays under 1 KB"


def test_a_batch_of_any_size_costs_about_ten_bytes_an_event(tmp_path: Path) -> None:
    """From 1 to 25,000 events a batch, the digest batches' billed size stays within 10 bytes an event plus 1 KB."""
    sizes = [1, 100, 501, 3000, 25_000]
    per_batch = {n: shard_writes(writes) for n, writes in forward(sizes, tmp_path).items()}
    for n, size in enumerate(sizes):
        digest_bytes = sum(w.size for w in per_batch[n] if w.sort_key.startswith("batch#"))
        chunks = -(-size // 10_000)
        assert digest_bytes <= 10 * size + 1024 * chunks, (size, digest_bytes)
        assert sum(1 for w in per_batch[n] if w.sort_key.startswith("batch#")) == chunks, "one digest batch a chunk"
        assert sum(1 for w in per_batch[n] if w.sort_key == "state") == chunks, "a commit a chunk"
