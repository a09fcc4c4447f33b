"""Records of 8 MiB, as Kinesis now allows (MaxRecordSizeInKiB up to 10,240), through the real daemon.

The MultiLang protocol carries each one to ``copier process`` as about 11 MB
of base64 in one JSON line. Staging and target raised to 10 MiB: each record
must land in the target once, byte for byte. The processor's peak memory and
the time from staging arrival to target arrival are measured and printed
(docs/protocol.md, "Limits", states them).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from copier.local.backend import LocalBackend
from copier.local.pipeline import LocalPipeline

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]

RECORDS = 4
SIZE = 8 * 1024 * 1024


def _peak_rss_mb(pid: int) -> float:
    """VmHWM: the most resident memory the process has held."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _all_records(kinesis: object, stream: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for shard in kinesis.list_shards(StreamName=stream)["Shards"]:  # type: ignore[attr-defined]
        iterator = kinesis.get_shard_iterator(  # type: ignore[attr-defined]
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            page = kinesis.get_records(ShardIterator=iterator)  # type: ignore[attr-defined]
            out.extend(page["Records"])
            if not page["Records"] and page.get("MillisBehindLatest") == 0:
                break
            iterator = page.get("NextShardIterator")
    return out


def test_records_of_8_mib_go_through_the_real_daemon_once_each(tmp_path: Path) -> None:
    with LocalBackend() as backend:
        pipeline = LocalPipeline(
            backend.endpoint, tmp_path, staging="staging-big", target="target-big", application="copier-big"
        )
        try:
            pipeline.create(staging_shards=1, target_shards=1)
            kinesis = pipeline.kinesis
            for stream in (pipeline.staging, pipeline.target):
                arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]
                kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=10240)
            digests = {}
            for n in range(RECORDS):
                body = json.dumps({"eventId": f"big-{n}", "pad": "x" * (SIZE - 64)}).encode()
                digests[f"big-{n}"] = hashlib.sha256(body).hexdigest()
                kinesis.put_record(StreamName=pipeline.staging, PartitionKey=f"k{n}", Data=body)
            worker = pipeline.start_worker("a")
            tips = pipeline.staging_tips()
            peak = 0.0
            deadline = time.monotonic() + 300
            while not pipeline.caught_up(tips):
                assert time.monotonic() < deadline, (tmp_path / "worker-a.log").read_text()[-3000:]
                peak = max([peak, *(_peak_rss_mb(c) for c in worker.processor_pids() if _is_processor(c))])
                time.sleep(0.5)
            peak = max([peak, *(_peak_rss_mb(c) for c in worker.processor_pids() if _is_processor(c))])
            staged = {json.loads(r["Data"])["eventId"]: r for r in _all_records(kinesis, pipeline.staging)}
            landed = _all_records(kinesis, pipeline.target)
            assert sorted(json.loads(r["Data"])["eventId"] for r in landed) == sorted(digests)
            assert all(
                hashlib.sha256(r["Data"]).hexdigest() == digests[json.loads(r["Data"])["eventId"]] for r in landed
            )
            delays = [
                (
                    r["ApproximateArrivalTimestamp"]
                    - staged[json.loads(r["Data"])["eventId"]]["ApproximateArrivalTimestamp"]
                ).total_seconds()
                for r in landed
            ]
            print(
                f"\n8 MiB records: {RECORDS} landed once each; copier process peak RSS {peak:.0f} MB; "
                f"staging-to-target {min(delays):.1f} to {max(delays):.1f} s (the daemon's startup included), "
                f"{(max(delays) - min(delays)) / (RECORDS - 1):.2f} s a record after the first"
            )
            assert peak > 0, "the processor's memory was sampled"
        finally:
            pipeline.stop_all()


def _is_processor(pid: int) -> bool:
    try:
        return b"process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
