"""``copier status --check`` on the local backend: a healthy, a stalled and an unowned shard, told apart.

Real ``copier process`` children forward real staging records (their
sequence numbers and arrivals as Kinesis gave them), stall on a record the
target refuses, and die; the KCL's part (which worker holds each lease, and
when each worker last reported) is written into the KCL's own tables as a
live and a dead daemon leave them (``copier.adapters.kcltables`` has their
layout; ``copier/core/health.py`` the rule).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from copier.local.multilang import Rec
from tests.conftest import Pipeline
from tests.support.backend import DUMMY_ENV, ROOT, create_stream

SHARDS = [f"shardId-00000000000{i}" for i in range(3)]
HUGE = b'{"eventId": "huge", "x": "' + b"x" * (1024 * 1024) + b'"}'  # over the target's 1 MiB: refused


def status(props: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / ".venv/bin/copier"), "status", "--properties", str(props), *options],
        capture_output=True,
        text=True,
        env={**os.environ, **DUMMY_ENV},
        timeout=120,
    )


class Kcl:
    """The KCL tables of one application, written as its daemons would leave them."""

    def __init__(self, dynamodb: Any, application: str) -> None:
        self.db = dynamodb
        self.leases, self.workers = application, f"{application}-WorkerMetricStats"
        for table, key in ((self.leases, "leaseKey"), (self.workers, "wid")):
            self.db.create_table(
                TableName=table,
                KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": key, "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )

    def lease(self, shard: str, owner: str, checkpoint: str = "TRIM_HORIZON") -> None:
        item = {"leaseKey": {"S": shard}, "leaseOwner": {"S": owner}, "leaseCounter": {"N": "7"}}
        self.db.put_item(TableName=self.leases, Item={**item, "checkpoint": {"S": checkpoint}})

    def report(self, worker: str, seconds_ago: int = 0) -> None:
        """The worker's row as its reporter writes it (``lut``: epoch seconds), ``seconds_ago``."""
        lut = str(int(time.time()) - seconds_ago)
        self.db.put_item(TableName=self.workers, Item={"wid": {"S": worker}, "lut": {"N": lut}, "sts": {"M": {}}})


def timeless(lines: list[str]) -> list[str]:
    """Lines with their durations (which move between two runs) as "T"."""
    return [re.sub(r"\d+m\d\ds|\d+\.\ds", "T", line) for line in lines]


def put(pipeline: Pipeline, stream: str, shard: int, event_id: str) -> Rec:
    """One event into one staging shard (its hash key range's start), as the daemon would deliver it."""
    listed = pipeline.kinesis.list_shards(StreamName=stream)["Shards"][shard]
    data = json.dumps({"eventId": event_id}).encode()
    answer = pipeline.kinesis.put_record(
        StreamName=stream,
        Data=data,
        PartitionKey=event_id,
        ExplicitHashKey=listed["HashKeyRange"]["StartingHashKey"],
    )
    assert answer["ShardId"] == SHARDS[shard]
    it = pipeline.kinesis.get_shard_iterator(
        StreamName=stream,
        ShardId=SHARDS[shard],
        ShardIteratorType="AT_SEQUENCE_NUMBER",
        StartingSequenceNumber=answer["SequenceNumber"],
    )["ShardIterator"]
    (record,) = pipeline.kinesis.get_records(ShardIterator=it, Limit=1)["Records"]
    arrival = int(record["ApproximateArrivalTimestamp"].timestamp() * 1000)
    return Rec(int(answer["SequenceNumber"]), data, event_id, arrival_ms=arrival)


def test_status_check_tells_a_healthy_a_stalled_and_an_unowned_shard_apart(pipeline: Pipeline, processors: Any) -> None:
    """All three shards held by a live worker, nothing waiting: exit 0 and one ok line. Then one shard's
    processor stalls on a record the target refuses, and another's worker dies (its processor killed, its
    last report ten minutes old) while a record waits: exit 1, one line for each of the two, none for the
    healthy shard; --json carries the same lines; a record waiting past --max-lag is one more."""
    staging = f"{pipeline.staging}-three"
    create_stream(pipeline.kinesis, staging, 3)
    props = pipeline.write_properties(maxBackoffMillis=300)
    application = f"status-{pipeline.table}"
    text = props.read_text().replace(f"streamName = {pipeline.staging}", f"streamName = {staging}")
    props.write_text(text.replace("applicationName = copier-test", f"applicationName = {application}"))
    kcl = Kcl(pipeline.dynamodb, application)
    kcl.report("worker-live")
    for shard in SHARDS:
        kcl.lease(shard, "worker-live")

    healthy = processors(pipeline, "healthy")
    healthy.initialize(SHARDS[0])
    healthy.process([put(pipeline, staging, 0, "a"), put(pipeline, staging, 0, "b")])
    doomed = processors(pipeline, "doomed")
    doomed.initialize(SHARDS[2])
    doomed.process([put(pipeline, staging, 2, "c")])
    result = status(props, "--check")
    assert (result.returncode, result.stdout) == (
        0,
        "ok: 3 shards: every open one owned by a live worker, none stalled, none behind the limit\n",
    ), result.stderr

    stalled = processors(pipeline, "stalled")
    stalled.initialize(SHARDS[1])
    stalled.send_process([Rec(1, HUGE, "huge")])
    stalled.wait_for("shard_stalled", 2, timeout=60)  # the stall written at the first, retried since
    doomed.kill()
    kcl.report("worker-dead", seconds_ago=600)
    kcl.lease(SHARDS[2], "worker-dead")
    put(pipeline, staging, 2, "d")  # waits for an owner
    kcl.report("worker-live")

    # the dead worker's shard is unowned once copier's lease of it has run out too (copier.core.health.gone_since):
    # asked again until then, however long the machine took to get here
    deadline = time.monotonic() + 60
    while True:
        result = status(props, "--check", "--max-unowned", "0")
        lines = result.stdout.splitlines()
        if len(lines) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert result.returncode == 1, result.stderr
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"{SHARDS[1]}: stalled for ")
    assert ": rejected: PutRecords: ValidationException: " in lines[0], lines[0]
    assert lines[1].startswith(f"{SHARDS[2]}: no live owner for ")
    assert re.search(r": its KCL lease is held by worker-dead, which last reported 10m\d\ds ago \(dead\)$", lines[1])

    result = status(props, "--check", "--max-unowned", "0", "--json")
    assert result.returncode == 1, result.stderr
    *shards, check = [json.loads(line) for line in result.stdout.splitlines()]
    assert check["check"] == "failed" and timeless(check["problems"]) == timeless(lines)
    by_shard = {s["shard"]: s for s in shards}
    assert [timeless(by_shard[s]["problems"]) for s in SHARDS] == [
        [],
        *(timeless([x.split(": ", 1)[1]]) for x in lines),
    ]
    assert (by_shard[SHARDS[0]]["worker_alive"], by_shard[SHARDS[0]]["waiting"]) == (True, False)
    assert (by_shard[SHARDS[1]]["stall_reason"], by_shard[SHARDS[1]]["worker_alive"]) == ("rejected", True)
    assert (by_shard[SHARDS[2]]["worker_alive"], by_shard[SHARDS[2]]["waiting"]) == (False, True)

    result = status(props, "--check", "--max-unowned", "0", "--max-lag", "0")
    lag = [line for line in result.stdout.splitlines() if "behind by" in line]
    assert result.returncode == 1 and len(lag) == 1 and lag[0].startswith(f"{SHARDS[2]}: behind by "), result.stdout

    table = status(props)  # the view without --check: the table, then the same problems
    assert table.returncode == 0, table.stderr
    shown = [line for line in table.stdout.splitlines() if line.startswith("problem: ")]
    assert timeless(shown) == timeless([f"problem: {lines[0]}"]), "the default --max-unowned (60 s) counts from the "
    "dead processor's last write, seconds ago"
