"""DynamoDB write units per 1,000,000 forwarded events: copier against per-record idempotency.

Both write to the same local backend, which records every request (moto's
request recorder); the write units are what DynamoDB would bill for the
requests received (``copier.local.billing``: item sizes, 1 KB units,
UpdateItem at the larger of the item before and after), not what either
side believes it wrote.

* copier: ``copier process``, driven over its pipes, forwards batches of a
  given size; everything it writes to its state table counts (digest
  batches, commits, lease renewals). The batch sizes are measured with
  coalescing off (``copier.coalesceEvents = 1``), so that each delivery is
  one forwarded batch; the smallest is measured again as configured by
  default, where deliveries wait to go out together.
* per-record idempotency, as AWS Lambda Powertools' idempotency utility
  does it: per event, a conditional PutItem of an ``INPROGRESS`` record
  (key ``<function>#<MD5 of the event>``, expiry, in-progress expiry), then
  an UpdateItem to ``COMPLETED`` with the result (here the target's shard
  and sequence number).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from copier.bench.cpu import DRAIN_WAIT_S
from copier.core.summaryboard import BOARD_SK
from copier.local.backend import DUMMY_ENV, spawned
from copier.local.billing import billed_writes
from copier.local.multilang import COPIER, Processor, records_message
from copier.local.pipeline import local_properties

__all__ = ["CostResult", "measure_costs"]

PER_MILLION = 1_000_000


@dataclass(frozen=True)
class CostResult:
    """Write units per million events: copier by delivered batch size, and the per-record baseline."""

    copier: dict[int, float]  # delivered batch size, coalescing off -> units per 1,000,000 events
    coalesced: dict[int, float]  # delivered batch size, default coalescing -> units per 1,000,000 events
    per_record: float
    events: int  # events measured per case

    def to_json(self) -> dict[str, Any]:
        def fewer(cases: dict[int, float]) -> dict[str, float]:
            return {str(k): round(self.per_record / v, 1) for k, v in cases.items()}

        return {
            "copier_units_per_million": {str(k): round(v) for k, v in self.copier.items()},
            "coalesced_units_per_million": {str(k): round(v) for k, v in self.coalesced.items()},
            "per_record_idempotency_units_per_million": round(self.per_record),
            "times_fewer": fewer(self.copier),
            "coalesced_times_fewer": fewer(self.coalesced),
            "events_per_case": self.events,
        }


def _event(n: int, run: str) -> tuple[str, bytes]:
    event_id = str(uuid.uuid5(uuid.NAMESPACE_OID, f"{run}-{n}"))
    return event_id, json.dumps({"eventId": event_id, "user": f"user-{n % 1000}", "body": "x" * 120}).encode()


def _units(recording: Path, table: str) -> int:
    """The write units of the table's shard items. The application's DescribeStreamSummary answers
    (``sk = summary``, ``copier.core.summaryboard``: a turn and an answer per stream and refresh, for every
    host at once) are the application's cost per 2.4 to 4.8 minutes, not an event's: left out."""
    writes = billed_writes(recording.read_text().splitlines())
    return sum(w.units for w in writes if w.table == table and w.sort_key != BOARD_SK)


def _per_record(client: Any, table: str, events: int) -> None:
    """Powertools' idempotency writes for ``events`` events: a conditional put, then an update."""
    client.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    while client.describe_table(TableName=table)["Table"]["TableStatus"] != "ACTIVE":  # CREATING: writes refused
        time.sleep(0.05)
    now = int(time.time())
    for n in range(events):
        event_id, data = _event(n, "per-record")
        key = {"id": {"S": f"copier-forward.forward#{hashlib.md5(data).hexdigest()}"}}
        client.put_item(
            TableName=table,
            Item={
                **key,
                "expiration": {"N": str(now + 3600)},
                "in_progress_expiration": {"N": str(now * 1000 + 60_000)},
                "status": {"S": "INPROGRESS"},
            },
            ConditionExpression="attribute_not_exists(id) OR expiration < :now",
            ExpressionAttributeValues={":now": {"N": str(now)}},
        )
        result = json.dumps({"ShardId": "shardId-000000000001", "SequenceNumber": str(49_600_000_000 + n) * 2})
        client.update_item(
            TableName=table,
            Key=key,
            UpdateExpression="SET #status = :completed, #data = :data, #expiration = :expiration",
            ExpressionAttributeNames={"#status": "status", "#data": "data", "#expiration": "expiration"},
            ExpressionAttributeValues={
                ":completed": {"S": "COMPLETED"},
                ":data": {"S": result},
                ":expiration": {"N": str(now + 3600)},
            },
        )


def measure_costs(workdir: Path, batch_sizes: list[int], coalesced_sizes: list[int], events: int) -> CostResult:
    """Forward ``events`` events at each batch size with copier, and run the baseline on ``events`` events.

    ``coalesced_sizes``: delivered batch sizes measured again with coalescing as configured by default.
    """
    recording = workdir / "recording.jsonl"
    cases = [(size, False) for size in batch_sizes] + [(size, True) for size in coalesced_sizes]
    results: dict[bool, dict[int, float]] = {False: {}, True: {}}
    with spawned(**DUMMY_ENV, MOTO_ENABLE_RECORDING="True", MOTO_RECORDER_FILEPATH=str(recording)) as endpoint:
        os.environ.update({k: v for k, v in DUMMY_ENV.items() if k not in os.environ})
        session = boto3.session.Session(region_name="us-east-1")
        kinesis = session.client("kinesis", endpoint_url=endpoint)
        dynamodb = session.client("dynamodb", endpoint_url=endpoint)
        # Each batch size runs on a shard of its own (a processor looks its shard up in ListShards).
        for name, shards in (("cost-staging", len(cases)), ("cost-target", 4)):
            kinesis.create_stream(StreamName=name, ShardCount=shards)
            kinesis.get_waiter("stream_exists").wait(StreamName=name)
        properties = {
            coalesced: local_properties(
                workdir / f"cost-{coalesced}.properties",
                endpoint,
                "cost",
                "cost-staging",
                "cost-target",
                COPIER,
                logLevel="WARNING",
                kcl=None,
                **({} if coalesced else {"coalesceEvents": "1"}),
            )
            for coalesced in (False, True)
        }
        subprocess.run([COPIER, "init", "--properties", str(properties[False])], check=True, capture_output=True)
        table = "cost-copier-state"
        seq = 1
        for shard, (size, coalesced) in enumerate(cases):
            proc = Processor(properties[coalesced], f"cost-{size}-{coalesced}")
            try:
                proc.initialize(f"shardId-{shard:012d}")  # a takeover is not steady state: not counted
                recording.write_text("")
                records = [_event(seq + n, f"copier-{size}-{coalesced}") for n in range(events)]
                for first in range(0, events, size):
                    proc.process_json(records_message(records[first : first + size], seq + first))
                time.sleep(DRAIN_WAIT_S)  # then an empty delivery, as the daemon sends: nothing is left waiting
                proc.process_json(records_message([], seq + events))
                results[coalesced][size] = _units(recording, table) / events * PER_MILLION
                seq += events
            finally:
                proc.close()
        recording.write_text("")
        _per_record(dynamodb, "cost-idempotency", events)
        per_record = _units(recording, "cost-idempotency") / events * PER_MILLION
    return CostResult(results[False], results[True], per_record, events)
