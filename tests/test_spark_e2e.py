"""The PySpark job killed in the middle of a micro-batch, restarted, and copied exactly once.

``copier produce`` (local Spark) writes a directory of JSON lines to the
staging stream in one micro-batch and is SIGKILLed while writing it. The
restarted query re-runs the micro-batch from its checkpoint, so the staging
stream holds duplicates: Spark's at-least-once. A ``copier run`` worker (the
real daemon) then copies the stream, and the target holds each event once.

The input is what a user's often is: half the rows carry an ``eventId``,
half do not (Spark infers a nullable column and reads theirs as null). With
no ``--id-column``, those take the derived ID, the same in both runs of the
micro-batch, or the target would hold their re-written copies as new events.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from copier.local.backend import LocalBackend
from copier.local.pipeline import LocalPipeline
from copier.spark.rows import event_id_of

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]

EVENTS = 40000


def write_mixed_input(directory: Path, events: int, per_file: int) -> list[str]:
    """JSON-lines files where every other row has an ``eventId`` and the rest none; the IDs the target must
    hold: the given ones, and for the others the derived ID of the row as Spark reads it (``eventId`` null)."""
    directory.mkdir(parents=True, exist_ok=True)
    ids, rows = [], []
    for n in range(events):
        row = {"user": f"user-{n % 1000}", "amount": n % 500, "n": n}
        if n % 2 == 0:
            row["eventId"] = f"evt-{n:08d}"
            ids.append(row["eventId"])
        else:
            ids.append(event_id_of({**row, "eventId": None}))
        rows.append(json.dumps(row))
    for index, first in enumerate(range(0, events, per_file)):
        (directory / f"part-{index:05d}.json").write_text("\n".join(rows[first : first + per_file]) + "\n")
    return ids


def test_a_query_killed_mid_micro_batch_writes_duplicates_that_the_copier_removes(tmp_path: Path) -> None:
    """Staging holds more records than events after the restart; the target holds each event once, the rows
    without an ID under the same derived ID in both runs."""
    with LocalBackend() as backend:
        pipeline = LocalPipeline(
            backend.endpoint, tmp_path, staging="staging-spark", target="target-spark", application="copier-spark"
        )
        try:
            pipeline.create(staging_shards=2, target_shards=2)
            ids = write_mixed_input(tmp_path / "input", EVENTS, per_file=4000)
            checkpoint = tmp_path / "checkpoint"
            options = ("--max-files-per-trigger", "100", "--partitions", "4")
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
