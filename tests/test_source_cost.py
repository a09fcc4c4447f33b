"""What a redrive and a repair cost (``copier.bench.sources``, the ``sources`` part of ``python -m copier.bench``):
requests by call and DynamoDB write units per event sent, counted from the requests the local backend received.

Bounded here by what the code implies (docs/protocol.md, "Cost"); the figures are printed (``-s``) and go to
docs/benchmarks.json with a benchmark run, never into a document by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from copier.bench.sources import measure_redrive, measure_repair

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]


def test_what_a_redrive_costs(tmp_path: Path) -> None:
    """5,000 dead-lettered records (two deliveries of 2,500 without an event ID) redriven in one run: one
    PutRecords a 500 records, the dead-letter shard read in pages of 10,000, three digests an event."""
    figures = measure_redrive(tmp_path, 5000)
    print(f"\nredrive of 5,000 dead-letter records: {json.dumps(figures)}")
    requests = figures["requests"]
    assert requests["Kinesis.PutRecords"] == 10, "500 records a request"
    assert requests["Kinesis.GetRecords"] <= 3, "the dead-letter shard read once, 10,000 records a page"
    assert figures["write_units_per_event"] <= 0.04, figures


def test_what_a_repair_costs(tmp_path: Path) -> None:
    """5,000 events lost (a daemon that started past them) in a 4-shard staging stream, put back in one run:
    every staging shard's repair item taken over, the streams audited before and after."""
    figures = measure_repair(tmp_path, 5000)
    print(f"\nrepair of 5,000 lost events (4 staging shards): {json.dumps(figures)}")
    requests = figures["requests"]
    assert requests["Kinesis.PutRecords"] <= 12 + 4, "500 records a request (a shard's last one short)"
    assert figures["write_units_per_event"] <= 0.04, figures
