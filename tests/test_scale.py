"""``copier process`` at production sizes, over its pipes, against the local backend.

Batches as large as a GetRecords of KPL-aggregated data delivers, records
of 1 KB, a bounded verification against a busy target, a record no stream
accepts, and what a dead writer leaves in the state table: each ends with
the target holding every event exactly once and the process still running.
"""

from __future__ import annotations

import base64
import time
from collections import Counter
from typing import Any

import pytest

from copier.adapters.dynamo import DynamoStateStore
from copier.core.config import load_config
from copier.core.identity import id_digest
from copier.core.limits import MAX_ITEM_BYTES
from copier.core.packing import pack_digests
from copier.core.positions import Position
from copier.core.shardmap import ShardMap
from copier.core.state import DigestBatch, shard_key
from copier.local.billing import item_size
from copier.local.multilang import Rec, event
from tests.conftest import Pipeline
from tests.support.backend import create_stream, read_stream
from tests.test_protocol import exactly_once, target_ids

pytestmark = [pytest.mark.protocol, pytest.mark.timeout(600)]

SHARD = "shardId-000000000000"


def digest_items(p: Pipeline) -> list[dict[str, Any]]:
    """Every digest batch item in the state table, as DynamoDB stores it."""
    pages = p.dynamodb.get_paginator("scan").paginate(TableName=p.table)
    items = [item for page in pages for item in page["Items"] if item["sk"]["S"].startswith("batch#")]
    for item in items:  # boto3 decoded binaries: back to DynamoDB JSON for the size rules
        for value in item.values():
            if "B" in value:
                value["B"] = base64.b64encode(value["B"]).decode()
    return items


def test_a_batch_of_100000_aggregated_events_is_forwarded_exactly_once(pipeline: Pipeline, processors: Any) -> None:
    """400 KPL records of 250 sub-records each, in one processRecords, with producer retries among them.

    Before chunking this exited with an item over DynamoDB's 400 KB limit and
    crash-looped the host; now it is cut into chunks of 10,000, each recorded
    and committed on its own.
    """
    records: list[Rec] = []
    ids: list[str] = []
    for r in range(400):
        for s in range(250):
            n = r * 250 + s
            if n % 50 == 49:  # a producer retry of an event 20 earlier, in the same batch
                records.append(event(1000 + r, f"e{n - 20}", body="retry", subseq=s))
            else:
                records.append(event(1000 + r, f"e{n}", subseq=s))
                ids.append(f"e{n}")
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process(records, timeout=400)
    assert proc.proc.poll() is None
    assert proc.last_checkpoint() == ("1399", 249)
    assert target_ids(pipeline) == exactly_once(ids)
    sizes = [item_size(item) for item in digest_items(pipeline)]
    assert len(sizes) == 10 and max(sizes) < MAX_ITEM_BYTES // 3, sizes


def test_a_batch_of_10000_records_of_1_kb_is_forwarded_exactly_once(pipeline: Pipeline, processors: Any) -> None:
    """10 MB in one batch: requests within the 5 MiB and 500-record limits, one digest batch of 100 KB."""
    records = [event(10 + i, f"big-{i}", body="x" * 1000) for i in range(10_000)]
    proc = processors(pipeline)
    proc.initialize(SHARD)
    proc.process(records, timeout=300)
    assert target_ids(pipeline) == exactly_once([f"big-{i}" for i in range(10_000)])
    assert proc.wait_for("put_done")[0]["requests"] == 20
    assert max(item_size(item) for item in digest_items(pipeline)) < MAX_ITEM_BYTES


def keys_on(shard_map: ShardMap, shard_id: str, count: int, prefix: str) -> list[str]:
    """``count`` partition keys that hash to ``shard_id``."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        key = f"{prefix}-{n}"
        if shard_map.shard_for(key) == shard_id:
            out.append(key)
        n += 1
    return out


def test_verifying_a_batch_in_flight_reads_only_its_shard_and_its_time(pipeline: Pipeline, processors: Any) -> None:
    """Killed mid-put; 200,000 unrelated records then fill the 4-shard target; the successor reads about the batch only.

    The batch's keys all hash to one target shard; the successor reads that
    shard first, then (part of the batch is missing there) every shard, each
    from the batch's start to the end of the dead owner's lease plus the put
    timeout and the margin, stopping at the first record after that: not
    the unrelated records written since.
    """
    wide = f"{pipeline.target}-wide"
    create_stream(pipeline.kinesis, wide, 4)
    pipeline.write_properties(targetStreamName=wide, putTimeoutMillis=500, clockSkewMillis=100)
    target_map = ShardMap.of(pipeline.kinesis.list_shards(StreamName=wide)["Shards"])
    hot = target_map.ranges[1][2]
    ids = keys_on(target_map, hot, 5000, "hot")
    records = [event(100 + i, event_id) for i, event_id in enumerate(ids)]

    victim = processors(pipeline, "victim")
    victim.initialize(SHARD)
    victim.send_process(records)
    victim.wait_for("put_request", 3, timeout=60)  # a third of its ten requests have landed, no commit yet
    victim.kill()
    killed = time.time()
    config = load_config(pipeline.properties)
    bound_s = (config.lease_millis + config.put_timeout_millis + 2 * config.clock_skew_millis) / 1000
    time.sleep(max(0.0, killed + bound_s + 1 - time.time()))  # past the bound: unrelated writes start
    for first in range(0, 200_000, 500):
        pipeline.kinesis.put_records(
            StreamName=wide,
            Records=[{"PartitionKey": f"other-{n}", "Data": b"{}"} for n in range(first, first + 500)],
        )

    successor = processors(pipeline, "successor")
    successor.initialize(SHARD)
    verified = successor.wait_for("verified_pending")[0]
    print("verified_pending:", {k: verified[k] for k in ("landed", "to_redo", "records_read", "shards_read")})
    landed = verified["landed"]
    # Part of the batch is missing from its shard: before redoing it, every shard is read (the target may
    # ignore keys), each within the same time bound, so the 200,000 unrelated records stay unread.
    assert 0 < landed < 5000 and verified["shards_read"] == 4
    assert landed <= verified["records_read"] <= 2 * landed + 4 * 500, verified
    successor.process(records)
    found = Counter(r["PartitionKey"] for r in read_stream(pipeline.kinesis, wide) if r["PartitionKey"] in set(ids))
    assert found == Counter({event_id: 1 for event_id in ids})


def test_a_record_no_stream_accepts_stalls_its_shard_only(pipeline: Pipeline, processors: Any) -> None:
    """Over the record size limit and no dead-letter stream: that shard retries and says why; the process
    keeps running (an exit would restart every shard on the host) and another shard goes on forwarding."""
    two = f"{pipeline.staging}-two"
    create_stream(pipeline.kinesis, two, 2)
    pipeline.write_properties(maxBackoffMillis=300)
    text = pipeline.properties.read_text().replace(f"streamName = {pipeline.staging}", f"streamName = {two}")
    pipeline.properties.write_text(text)
    poisoned = processors(pipeline, "poisoned")
    poisoned.initialize("shardId-000000000000")
    poisoned.send_process([event(1, "fine"), Rec(2, b'{"eventId": "huge", "x": "' + b"x" * (1024 * 1024) + b'"}', "k")])
    stalls = poisoned.wait_for("shard_stalled", 3, timeout=60)
    assert stalls[0]["code"] == "ValidationException" and poisoned.proc.poll() is None
    healthy = processors(pipeline, "healthy")
    healthy.initialize("shardId-000000000001")
    healthy.process([event(1, "other")])
    assert target_ids(pipeline)["other"] == 1
    assert poisoned.proc.poll() is None, "still running, still retrying"


def test_leftovers_of_a_dead_writer_in_the_table_never_drop_an_event(pipeline: Pipeline, processors: Any) -> None:
    """Digest batches a fenced writer left (one above the committed index, one refused over a committed one)."""
    first = processors(pipeline, "first")
    first.initialize(SHARD)
    first.process([event(1, "a"), event(2, "b")])
    first.shutdown_requested()
    first.close()
    config = load_config(pipeline.properties)
    store = DynamoStateStore(config)
    key = shard_key(config.stream_name, SHARD)
    state = store.get(key)
    assert state is not None and state.batches == 1
    # The dead writer recorded its next chunk (c, d at positions 3-4) but never put it.
    store.put_batch(
        key,
        DigestBatch(
            index=2,
            epoch=state.epoch,
            last=Position(4),
            started_ms=int(time.time() * 1000),
            keyed=pack_digests([id_digest("c"), id_digest("d")]),
        ),
    )
    second = processors(pipeline, "second")
    second.initialize(SHARD)
    assert (second.wait_for("verified_pending")[0]["to_redo"]) == 2
    second.process([event(3, "c"), event(4, "d"), event(5, "e")])
    assert target_ids(pipeline) == exactly_once(["a", "b", "c", "d", "e"])
