"""A second copier application started at a point in time, with the real KCL MultiLangDaemon on the local backend.

A first application copies the staging stream to its target the whole time.
Events are produced (with producer retries) before a start time; then,
after it, retries of some of those events, new events and their retries. A
second application (its own applicationName, lease tables and state table)
is started at that time (``initialPositionInStreamExtended``) to a second
target: it must hold every event first written after the start exactly once
and none from before, the retries straddling the start included; its worker
is then killed and replaced, and more retries of events from before the
start must still be dropped (the IDs loaded before the start live in the
state table). The first target must hold every event exactly once.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from copier.core.positions import Position
from copier.local.backend import DUMMY_ENV, LocalBackend
from copier.local.pipeline import LocalPipeline
from copier.local.producer import Produced, produce
from tests.support.backend import read_stream
from tests.test_e2e_daemon import CLEAN

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(480)]


def put_again(kinesis: Any, stream: str, numbers: list[int], run: str, out: Produced) -> None:
    """Producer retries: the events numbered ``numbers`` written again, the same bytes under new sequence numbers
    (as ``copier.local.producer`` writes them)."""
    for first in range(0, len(numbers), 500):
        ids = [(n, f"evt-{run}-{n:08d}") for n in numbers[first : first + 500]]
        records = [
            {"PartitionKey": i, "Data": json.dumps({"eventId": i, "n": n, "body": "x" * 64}).encode()} for n, i in ids
        ]
        answer = kinesis.put_records(StreamName=stream, Records=records)
        assert answer["FailedRecordCount"] == 0
        for result in answer["Records"]:
            out.records += 1
            position, shard = Position.parse(result["SequenceNumber"]), result["ShardId"]
            if shard not in out.last or out.last[shard] < position:
                out.last[shard] = position


def check_config(pipeline: LocalPipeline) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [pipeline.copier_bin, "check-config", str(pipeline.properties)],
        capture_output=True,
        text=True,
        env={**os.environ, **DUMMY_ENV},
        timeout=120,
    )


def test_a_second_application_started_at_a_time_copies_every_event_after_it_once_and_none_before(
    tmp_path: Path,
) -> None:
    """Producer duplicates straddle the start; the second target gets exactly the events first written after it."""
    run = "pit"
    with LocalBackend() as backend:
        first = LocalPipeline(
            backend.endpoint,
            tmp_path / "first",
            staging="staging-pit",
            target="target-first",
            application="copier-first",
        )
        second: LocalPipeline | None = None
        try:
            first.create(staging_shards=2, target_shards=1)
            first.start_worker("first")
            produced = produce(first.kinesis, first.staging, 600, run=run, seed=5)  # before the start
            start_s = math.floor(time.time()) + 1
            while time.time() < start_s + 0.05:  # the host clock past the start: every later arrival is after it
                time.sleep(0.05)
            after = list(range(600, 1200))
            straddling = list(range(0, 600, 3))  # 200 events first written before the start, retried after it
            put_again(first.kinesis, first.staging, straddling, run, produced)
            produce(first.kinesis, first.staging, 400, run=run, seed=6, start=600, out=produced)
            put_again(first.kinesis, first.staging, list(range(600, 1000, 7)), run, produced)

            second = LocalPipeline(
                backend.endpoint,
                tmp_path / "second",
                staging=first.staging,
                target="target-second",
                application="copier-second",
                kcl={"initialPositionInStreamExtended": str(start_s)},
            )
            second.kinesis.create_stream(StreamName=second.target, ShardCount=1)
            second.kinesis.get_waiter("stream_exists").wait(StreamName=second.target, WaiterConfig={"Delay": 0.2})
            second.store.create_table()
            check = check_config(second)
            assert check.returncode == 0, check.stdout + check.stderr
            assert "no lease yet: every shard starts at the start" in check.stdout

            worker = second.start_worker("second-a")
            assert second.wait(lambda: second.caught_up(produced.last), 240), f"see the logs in {tmp_path}"
            worker.kill_host()  # the next owner must find the IDs from before the start in the state table
            states = second.shard_states()
            assert {s.prestart_ms for s in states.values()} == {start_s * 1000}
            again = check_config(second)  # its own tables now: a restart of the application passes
            assert again.returncode == 0, again.stdout + again.stderr
            assert "2 of 2 staging shards hold the events from before the start" in again.stdout
            second.start_worker("second-b")
            put_again(first.kinesis, first.staging, list(range(1, 600, 5)), run, produced)  # more from before
            produce(first.kinesis, first.staging, 200, run=run, seed=7, start=1000, out=produced)
            put_again(first.kinesis, first.staging, list(range(600, 1200, 11)), run, produced)
            assert second.wait(lambda: second.caught_up(produced.last), 240), f"see the logs in {tmp_path}"
            assert first.wait(lambda: first.caught_up(produced.last), 240), f"see the logs in {tmp_path}"

            copied = Counter(json.loads(r["Data"])["eventId"] for r in read_stream(second.kinesis, second.target))
            assert copied == Counter({f"evt-{run}-{n:08d}": 1 for n in after})
            counters = second.counters()
            assert counters.get("duplicates", 0) >= len(straddling), counters
            assert counters.get("before_start", 0) == 0, "the daemon delivered nothing from before the start"
            verify = first.verify(produced.manifest)
            assert verify.returncode == 0, verify.stdout + verify.stderr
            assert CLEAN in verify.stdout, "the running copier was not disturbed"
        finally:
            first.stop_all()
            if second is not None:
                second.stop_all()
