"""The PySpark job killed in the middle of a micro-batch, restarted, and copied exactly once.

``copier produce`` (local Spark) writes a directory of JSON lines to the
staging stream in one micro-batch and is SIGKILLed while writing it. The
restarted query re-runs the micro-batch from its checkpoint, so the staging
stream holds duplicates: Spark's at-least-once. A ``copier run`` worker (the
real daemon) then copies the stream, and the target holds each event once.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from copier.demo import write_input
from copier.local.backend import LocalBackend
from copier.local.pipeline import LocalPipeline

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]

EVENTS = 20000


def test_a_query_killed_mid_micro_batch_writes_duplicates_that_the_copier_removes(tmp_path: Path) -> None:
    """Staging holds more records than events after the restart; the target holds each event once."""
    with LocalBackend() as backend:
        pipeline = LocalPipeline(
            backend.endpoint, tmp_path, staging="staging-spark", target="target-spark", application="copier-spark"
        )
        try:
            pipeline.create(staging_shards=2, target_shards=2)
            ids = write_input(tmp_path / "input", EVENTS, per_file=2000, redelivered=0)
            checkpoint = tmp_path / "checkpoint"
            options = ("--id-column", "eventId", "--max-files-per-trigger", "100", "--partitions", "4")
            first = pipeline.start_producer(tmp_path / "input", checkpoint, *options)
            deadline = time.monotonic() + 180
            while not pipeline.staging_written():
                assert first.poll() is None, "the job ended before writing anything"
                assert time.monotonic() < deadline, "the job wrote nothing in time"
                time.sleep(0.02)
            pipeline.kill_producer(first)
            written = pipeline.staging_records()
            assert 0 < written < EVENTS, f"killed mid-micro-batch ({written} of {EVENTS} written)"

            second = pipeline.start_producer(tmp_path / "input", checkpoint, *options)
            assert second.wait(timeout=300) == 0, (tmp_path / "producer.log").read_text()[-3000:]
            staging = pipeline.staging_records()
            assert staging >= EVENTS + written, "the restarted micro-batch was written again"

            pipeline.start_worker("a")
            tips = pipeline.staging_tips()
            assert pipeline.wait(lambda: pipeline.caught_up(tips), 240), "the copier caught up"
            verify = pipeline.verify(ids)
            assert verify.returncode == 0, verify.stdout + verify.stderr
            assert f"target: {EVENTS} records" in verify.stdout
            assert pipeline.counters().get("duplicates", 0) >= staging - EVENTS
        finally:
            pipeline.stop_all()
