"""The baseline of the benchmarks: a plain at-least-once KCL copier, as a team would write one without copier.

An amazon-kclpy record processor that forwards each batch to the target
with PutRecords (requests of at most 500 records and 5 MiB, failed entries
retried, botocore's own retries on) and checkpoints at the same interval as
copier (``copier.checkpointIntervalMillis``), so neither pays more protocol
round trips than the other. No
event IDs, no deduplication, no state table, no fencing: every producer
duplicate, every replay after a restart and every ambiguous put is
forwarded again. It reads the same properties file as copier (target stream,
endpoints), so both run against the same backend under the same settings.

    python -m copier.bench.plain --properties FILE      (as the daemon's executableName)
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import boto3
from amazon_kclpy import kcl
from amazon_kclpy.v3 import processor

from copier.core.batching import split_requests
from copier.core.config import load_config
from copier.core.limits import record_size

__all__ = ["PlainProcessor", "main"]


class PlainProcessor(processor.RecordProcessorBase):  # type: ignore[misc]
    """Forward, checkpoint, nothing else."""

    def __init__(self, client: Any, target: str, checkpoint_interval_ms: int) -> None:
        self.client = client
        self.target = target
        self.interval_s = checkpoint_interval_ms / 1000
        self.last_checkpoint = time.monotonic()

    def initialize(self, initialize_input: Any) -> None:
        pass

    def process_records(self, process_records_input: Any) -> None:
        records = process_records_input.records
        if not records:
            return
        entries = [(r.partition_key, r.binary_data) for r in records]
        for request in split_requests(entries, lambda e: record_size(e[0], e[1])):
            left = request
            while left:
                answer = self.client.put_records(
                    StreamName=self.target, Records=[{"PartitionKey": k, "Data": d} for k, d in left]
                )
                left = [e for e, r in zip(left, answer["Records"], strict=True) if r.get("ErrorCode")]
                if left:
                    time.sleep(0.1)
        if time.monotonic() - self.last_checkpoint >= self.interval_s:
            last = records[-1]
            process_records_input.checkpointer.checkpoint(last.sequence_number, last.sub_sequence_number)
            self.last_checkpoint = time.monotonic()

    def lease_lost(self, lease_lost_input: Any) -> None:
        pass

    def shard_ended(self, shard_ended_input: Any) -> None:
        shard_ended_input.checkpointer.checkpoint()

    def shutdown_requested(self, shutdown_requested_input: Any) -> None:
        shutdown_requested_input.checkpointer.checkpoint()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.bench.plain", description="a plain at-least-once copier")
    parser.add_argument("--properties", required=True)
    args = parser.parse_args(argv)
    protocol_out = sys.stdout
    sys.stdout = sys.stderr
    config = load_config(args.properties)
    client = boto3.session.Session().client("kinesis", region_name=config.region, endpoint_url=config.target_endpoint)
    kcl.KCLProcess(
        PlainProcessor(client, config.target_stream_name, config.checkpoint_interval_millis),
        input_file=sys.stdin,
        output_file=protocol_out,
        error_file=sys.stderr,
    ).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
