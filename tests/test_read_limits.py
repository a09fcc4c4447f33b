"""Readers pace a shard's reads by its read limits (copier.core.limits.read_pause_s): checked against the chaos
proxy enforcing Kinesis' per-shard limits (copier.chaos.limits) on the real local backend."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import pytest

from copier.adapters.kinesis import KinesisStreams, paged_shards
from copier.adapters.progress import Progress
from copier.adapters.streamreader import StreamReader
from copier.chaos.limits import ShardLimits
from copier.chaos.proxy import FaultProxy
from copier.chaos.throttle import ShardThrottle
from copier.core.limits import read_pause_s
from tests.conftest import Pipeline
from tests.support.backend import client, create_stream
from tests.support.fakes import config

MIB = 1024 * 1024


class FakeTime:
    """One clock for the reader and the limits, which only the reader's sleeping advances."""

    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_pause_after_a_page_follows_its_bytes() -> None:
    assert read_pause_s(0) == pytest.approx(0.2)  # 5 calls a second
    assert read_pause_s(MIB) == pytest.approx(0.5)  # 2 MiB a second
    assert read_pause_s(10 * MIB) == 5.0  # a 10 MiB page: the shard's reads are refused for 5 s


def test_a_reader_of_pages_larger_than_a_shards_read_rate_is_never_throttled(pipeline: Pipeline) -> None:
    """Three 1 MiB records come in one page: 3 MiB, 1 MiB more than the shard serves a second. A reader that
    called again a fifth of a second later was refused (and retried); one that waits for the bytes is not."""
    time_ = FakeTime()
    stream = f"{pipeline.target}-big"
    create_stream(pipeline.kinesis, stream, 1)
    pipeline.kinesis.put_records(
        StreamName=stream, Records=[{"PartitionKey": f"k{i}", "Data": b"x" * (MIB - 2)} for i in range(3)]
    )
    with FaultProxy(pipeline.endpoint, seed=1, hang_s=1.0) as proxy:
        throttle = ShardThrottle(ShardLimits(time_.clock), lambda s: paged_shards(pipeline.kinesis.list_shards, s))
        proxy.throttle = throttle
        reader = StreamReader(
            client("kinesis", proxy.endpoint), Progress(io.StringIO()), sleep=time_.sleep, clock=time_.clock, workers=1
        )
        read: list[Any] = reader.read(stream, "target", lambda _shard, r: r["PartitionKey"])
    assert sorted(read) == ["k0", "k1", "k2"]
    assert sum(throttle.refused.values()) == 0


def test_the_copiers_verification_read_of_large_pages_is_never_throttled(pipeline: Pipeline) -> None:
    """A put's verification read (``read_identities``) shares the target shard's read budget with every other
    reader: it waits for a page's bytes before the next, and is not refused."""
    time_ = FakeTime()
    stream = f"{pipeline.target}-big"
    create_stream(pipeline.kinesis, stream, 1)
    pipeline.kinesis.put_records(  # one page of 3 MiB: a reader calling again 0.2 s later is refused
        StreamName=stream, Records=[{"PartitionKey": f"k{i}", "Data": b"x" * (MIB - 2)} for i in range(3)]
    )
    with FaultProxy(pipeline.endpoint, seed=1, hang_s=1.0) as proxy:
        throttle = ShardThrottle(ShardLimits(time_.clock), lambda s: paged_shards(pipeline.kinesis.list_shards, s))
        proxy.throttle = throttle
        cfg = replace(config(), target_endpoint=proxy.endpoint, kinesis_endpoint=pipeline.endpoint)
        found = KinesisStreams(cfg, sleep=time_.sleep).read_identities(stream, None, 0, None, lambda pk, _data: len(pk))
    assert found.records_read == 3
    assert sum(throttle.refused.values()) == 0
