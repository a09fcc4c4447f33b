"""KinesisStreams against the local backend, and the fake of copier.testing held to the same answers.

The protocol tests and the exactly-once model run on ``InMemoryStreams``;
these check that what the fake answers for the calls the protocol relies on
(retention, reading a staging shard back, lineage of expired shards, reads
that keep a lease) is what the real adapter answers on a real backend.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from copier.adapters.kinesis import KinesisStreams
from copier.core.config import load_config
from copier.core.errors import TransientAwsError
from copier.core.identity import content_digest
from copier.core.kpl import aggregate
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.testing import FakeClock, InMemoryStreams
from tests.conftest import Pipeline

SHARD = "shardId-000000000000"


def _real(pipeline: Pipeline) -> KinesisStreams:
    return KinesisStreams(load_config(pipeline.properties))


def _write(pipeline: Pipeline) -> list[str]:
    """A plain record, a KPL aggregate of three, another plain record; returns their sequence numbers."""
    kinesis = pipeline.kinesis
    plain = json.dumps({"eventId": "p1"}).encode()
    users = [(f"k{i}", json.dumps({"eventId": f"a{i}"}).encode()) for i in range(3)]
    (packed,) = aggregate(users)
    seqs = []
    for pk, data, ehk in (
        ("p1", plain, None),
        (packed.partition_key, packed.data, packed.explicit_hash_key),
        ("p2", b"{}", None),
    ):
        kwargs: dict[str, Any] = {"StreamName": pipeline.staging, "PartitionKey": pk, "Data": data}
        if ehk is not None:
            kwargs["ExplicitHashKey"] = ehk
        seqs.append(kinesis.put_record(**kwargs)["SequenceNumber"])
    return seqs


@pytest.mark.protocol
def test_a_staging_range_reads_back_as_the_daemon_delivers_it(pipeline: Pipeline) -> None:
    """read_source: plain records with sub-sequence 0, an aggregate's user records 0..n-1, only within the
    range asked (both ends included), and the fake answers the same for the same records."""
    seqs = _write(pipeline)
    streams = _real(pipeline)
    first, last = Position(int(seqs[0])), Position(int(seqs[1]), 1)
    pages = list(streams.read_source(pipeline.staging, SHARD, first, last))
    got = [(r.position, r.partition_key) for page in pages for r in page]
    assert got == [(first, "p1"), (Position(int(seqs[1]), 0), "k0"), (Position(int(seqs[1]), 1), "k1")]
    assert all(r.arrival_ms > 0 for page in pages for r in page)
    fake = InMemoryStreams(FakeClock(int(time.time() * 1000)))
    now = fake.clock.now_ms()
    fake.add_staging(SHARD, [SourceRecord(p, k, b"", now) for p, k in got + [(Position(int(seqs[2])), "p2")]])
    assert [
        (r.position, r.partition_key) for page in fake.read_source("staging", SHARD, first, last) for r in page
    ] == got


@pytest.mark.protocol
def test_what_arrived_before_a_time_reads_back_as_the_daemon_delivers_it(pipeline: Pipeline) -> None:
    """read_arrivals: from AT_TIMESTAMP ``since`` up to (without) the first record that arrived at or after
    ``until``, an aggregate's user records 0..n-1, keep_alive before every page; the fake answers the same."""
    (packed,) = aggregate([("k0", b"0"), ("k1", b"1")])
    seqs = []
    for pk, data in (("p1", b"{}"), (packed.partition_key, packed.data), ("p2", b"{}")):
        seqs.append(pipeline.kinesis.put_record(StreamName=pipeline.staging, PartitionKey=pk, Data=data))
        time.sleep(0.01)  # three distinct arrival milliseconds, whatever the machine's speed
    streams = KinesisStreams(load_config(pipeline.properties), sleep=lambda _: None)
    everything = [r for page in streams.read_arrivals(pipeline.staging, SHARD, 0, 2**60) for r in page]
    agg = int(seqs[1]["SequenceNumber"])
    expected = [(Position(agg, 0), "k0"), (Position(agg, 1), "k1")]
    assert [(r.position, r.partition_key) for r in everything[1:3]] == expected
    assert everything[0].partition_key == "p1" and everything[-1].partition_key == "p2"
    since, until = everything[1].arrival_ms, everything[-1].arrival_ms
    assert everything[0].arrival_ms < since < until
    pages: list[int] = []
    got = [
        r
        for page in streams.read_arrivals(pipeline.staging, SHARD, since, until, lambda: pages.append(1))
        for r in page
    ]
    assert [(r.position, r.partition_key) for r in got] == expected
    assert pages, "keep_alive ran before the page"
    fake = InMemoryStreams(FakeClock(until))
    fake.add_staging(SHARD, everything)
    assert [r for page in fake.read_arrivals("staging", SHARD, since, until) for r in page] == got


@pytest.mark.protocol
def test_retention_is_read_from_the_stream(pipeline: Pipeline) -> None:
    """retention(): DescribeStreamSummary's RetentionPeriodHours in milliseconds, as the fake answers its own."""
    pipeline.kinesis.increase_stream_retention_period(StreamName=pipeline.target, RetentionPeriodHours=48)
    streams = _real(pipeline)
    assert streams.retention(pipeline.staging) == 24 * 3_600_000
    assert streams.retention(pipeline.target) == 48 * 3_600_000
    assert InMemoryStreams(retention_ms={"target": 48 * 3_600_000}).retention("target") == 48 * 3_600_000


@pytest.mark.protocol
def test_a_shard_not_listed_is_expired_as_an_ancestor_and_not_yet_listed_as_ones_own(pipeline: Pipeline) -> None:
    """parents(): a shard ListShards does not list is, for a lineage walk, an expired ancestor (no parents);
    for the processor's own shard, a transient error (ListShards has not caught up). The fake agrees."""
    streams = _real(pipeline)
    missing = "shardId-000000000999"
    assert streams.parents(pipeline.staging, missing, ancestor=True) == []
    with pytest.raises(TransientAwsError):
        streams.parents(pipeline.staging, missing)
    fake = InMemoryStreams()
    fake.unlisted.add(missing)
    assert fake.parents("staging", missing, ancestor=True) == []
    with pytest.raises(TransientAwsError):
        fake.parents("staging", missing)


@pytest.mark.protocol
def test_a_verification_read_calls_keep_alive_before_every_page(pipeline: Pipeline) -> None:
    """read_identities runs keep_alive before each GetRecords page (what keeps a verifying processor's lease)."""
    pipeline.kinesis.put_records(
        StreamName=pipeline.target, Records=[{"PartitionKey": f"k{i}", "Data": b"x"} for i in range(20)]
    )
    pages = []
    found = _real(pipeline).read_identities(
        pipeline.target, None, 0, None, content_digest, keep_alive=lambda: pages.append(1)
    )
    assert sum(found.identities.values()) == 20
    assert len(pages) >= found.shards_read >= 1
