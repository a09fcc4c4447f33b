"""copier's control-plane calls through real ``copier process`` children against the local backend (issue 47;
docs/operations.md, "The AWS API budget"): the target's calls pass a front on 127.0.0.1 that counts them, and
throttles DescribeStreamSummary where a test says so (``LimitExceededException``, which the local backend never
answers).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from copier.adapters.summaryshare import SHARE_ENV, SummaryShare
from copier.core.limits import MAX_RECORD_BYTES
from copier.local.multilang import Processor, event
from tests.conftest import Pipeline
from tests.support.backend import create_stream, read_stream
from tests.support.serving import RefusingFront, serving

pytestmark = pytest.mark.protocol

SHARD = "shardId-000000000000"


def test_a_record_over_1_mib_reaches_a_target_that_takes_it_though_its_limit_cannot_be_read(
    pipeline: Pipeline, processors: Callable[..., Processor]
) -> None:
    """A 1.5 MiB record, the target's limit unreadable (DescribeStreamSummary throttled throughout) and really
    10 MiB (``UpdateMaxRecordSize``): forwarded to the target, nothing dead-lettered. (The unknown limit was taken
    as 1 MiB: the record went to the dead-letter stream.)"""
    kinesis = pipeline.kinesis
    dlq = pipeline.target.replace("target", "dlq")
    create_stream(kinesis, dlq, 1)
    arn = kinesis.describe_stream_summary(StreamName=pipeline.target)["StreamDescriptionSummary"]["StreamARN"]
    kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=10240)
    front = RefusingFront(urlsplit(pipeline.endpoint).netloc, {"DescribeStreamSummary"}, "LimitExceededException")
    with serving(front, poll_s=0.05):
        pipeline.write_properties(targetEndpoint=front.url, deadLetterStreamName=dlq)
        proc = processors(pipeline)
        proc.initialize(SHARD)
        proc.process([event(1, "big", body="x" * (MAX_RECORD_BYTES * 3 // 2))])
        proc.shutdown_requested()
        assert proc.close() == 0
    assert front.seen, "the target's DescribeStreamSummary was asked, and throttled"
    assert [json.loads(r["Data"])["eventId"] for r in read_stream(kinesis, pipeline.target)] == ["big"]
    assert read_stream(kinesis, dlq) == []


def test_processors_of_one_parent_ask_describe_stream_summary_once_between_them(
    pipeline: Pipeline, processors: Callable[..., Processor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processors of one daemon run (here: children of the test, given the run's share as copier run's
    supervisor gives it) take the shard one after the other: the second acts on the first's answer about the
    target, and asks nothing. (Each asked for itself: twice.)"""
    front = RefusingFront(urlsplit(pipeline.endpoint).netloc, set())
    run = SummaryShare.start_run()
    assert run is not None
    monkeypatch.setenv(SHARE_ENV, str(run))
    with serving(front, poll_s=0.05), contextlib.ExitStack() as cleanup:
        cleanup.callback(SummaryShare.end_run, run)
        pipeline.write_properties(targetEndpoint=front.url)
        for n, name in enumerate(("first", "second"), 1):
            proc = processors(pipeline, name)
            proc.initialize(SHARD)
            proc.process([event(n, f"e{n}")])
            proc.shutdown_requested()
            assert proc.close() == 0
    assert front.calls["PutRecords"] >= 2, "both processors forwarded through the front"
    assert front.calls["DescribeStreamSummary"] == 1
    landed = sorted(json.loads(r["Data"])["eventId"] for r in read_stream(pipeline.kinesis, pipeline.target))
    assert landed == ["e1", "e2"]
