"""The chaos suite's fault-injecting proxy does to the copier's calls what it says, against the local backend."""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from botocore.exceptions import ClientError

from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.kinesis import KinesisStreams, paged_shards
from copier.chaos.limits import ShardLimits
from copier.chaos.proxy import FaultProxy, FaultWindow
from copier.chaos.throttle import ShardThrottle
from copier.core.errors import AmbiguousPutError, TransientAwsError
from copier.core.state import ShardState
from copier.local.independent import Endpoints
from tests.conftest import Pipeline
from tests.support.backend import client, read_stream
from tests.support.fakes import config

ENTRIES = [(f"k{i}", f'{{"eventId": "e{i}"}}'.encode(), None) for i in range(40)]


def always(kind: str) -> FaultWindow:
    return FaultWindow(kind, time.monotonic() - 1, time.monotonic() + 60, 1.0)


def streams_via(proxy: FaultProxy, pipeline: Pipeline) -> KinesisStreams:
    cfg = replace(config(), target_endpoint=proxy.endpoint, kinesis_endpoint=pipeline.endpoint, put_timeout_millis=500)
    return KinesisStreams(cfg)


@pytest.fixture
def proxy(pipeline: Pipeline) -> Any:
    with FaultProxy(pipeline.endpoint, seed=1, hang_s=1.0) as p:
        yield p


def test_partial_failures_store_only_the_entries_reported_landed(pipeline: Pipeline, proxy: FaultProxy) -> None:
    """Failed entries carry an error code and are not in the stream; the others are, in the answer's order."""
    proxy.add(always("put_partial"))
    codes = streams_via(proxy, pipeline).put_records(pipeline.target, ENTRIES)
    failed = {i for i, code in enumerate(codes) if code}
    assert failed and len(failed) < len(ENTRIES)
    assert {codes[i] for i in failed} <= {"ProvisionedThroughputExceededException", "InternalFailure"}
    stored = {r["PartitionKey"] for r in read_stream(pipeline.kinesis, pipeline.target)}
    assert stored == {ENTRIES[i][0] for i in range(len(ENTRIES)) if i not in failed}
    assert proxy.injected["put_partial"] == 1


@pytest.mark.parametrize("kind,landed", [("put_throttle", False), ("put_timeout", False), ("put_lost_response", True)])
def test_whole_request_faults(pipeline: Pipeline, proxy: FaultProxy, kind: str, landed: bool) -> None:
    """Throttled: refused, nothing stored. Timed out: ambiguous, nothing stored. Lost answer: ambiguous, all stored."""
    proxy.add(always(kind))
    expected = TransientAwsError if kind == "put_throttle" else AmbiguousPutError
    with pytest.raises(expected) as info:
        streams_via(proxy, pipeline).put_records(pipeline.target, ENTRIES)
    assert type(info.value) is expected
    assert len(read_stream(pipeline.kinesis, pipeline.target)) == (len(ENTRIES) if landed else 0)


def test_state_table_faults_are_transient_and_a_late_500_has_applied(pipeline: Pipeline, proxy: FaultProxy) -> None:
    """Throttling and an outage leave the item as it was; a 500 may come after the write applied."""
    cfg = replace(config(stateTableName=pipeline.table), dynamodb_endpoint=pipeline.endpoint)
    cfg = replace(cfg, state_endpoint=proxy.endpoint)
    store = DynamoStateStore(cfg)
    first = ShardState(epoch=1, version=1, owner="w")
    for kind in ("state_throttle", "state_outage"):
        proxy.add(always(kind))
        with pytest.raises(TransientAwsError):
            store.replace_if_unchanged("k", None, first)
        proxy.clear()
    assert store.get("k") is None
    proxy.add(always("state_5xx"))
    applied = 0
    for n in range(8):
        key = f"k{n}"
        with pytest.raises(TransientAwsError):
            store.replace_if_unchanged(key, None, first)
        direct = DynamoStateStore(replace(cfg, state_endpoint=pipeline.endpoint))
        applied += direct.get(key) is not None
    assert 0 < applied < 8, "some 500s came before the write, some after it applied"


def test_a_window_for_one_stream_hits_only_its_puts_and_wait_for_sees_the_injection(
    pipeline: Pipeline, proxy: FaultProxy
) -> None:
    """A put fault bound to the target leaves other streams' puts alone; wait_for returns when it was injected."""
    other = f"{pipeline.target}-other"
    pipeline.kinesis.create_stream(StreamName=other, ShardCount=1)
    pipeline.kinesis.get_waiter("stream_exists").wait(StreamName=other, WaiterConfig={"Delay": 0.1})
    now = time.monotonic()
    proxy.add(always("put_throttle"))  # the plan's window: the one bound to the target goes first all the same
    proxy.add(FaultWindow("put_lost_response", now, now, 1.0, stream=pipeline.target))
    streams = streams_via(proxy, pipeline)
    with pytest.raises(TransientAwsError) as throttled:
        streams.put_records(other, ENTRIES[:3])  # another stream's put meets the plan's window only
    assert type(throttled.value) is TransientAwsError
    assert proxy.wait_for(("put_lost_response",), pipeline.target, now, 0.1) is None
    with pytest.raises(AmbiguousPutError):
        streams.put_records(pipeline.target, ENTRIES[:3])
    injection = proxy.wait_for(("put_lost_response",), pipeline.target, now, 5.0)
    assert injection is not None and injection.stream == pipeline.target and injection.at >= now
    with pytest.raises(TransientAwsError) as throttled:
        streams.put_records(pipeline.target, ENTRIES[3:6])  # the window of one injection is closed: throttled
    assert type(throttled.value) is TransientAwsError
    proxy.cancel_waits()
    assert proxy.wait_for(("put_timeout",), pipeline.target, now, 60.0) is None, "a cancelled wait returns at once"


class FrozenClock:
    """The limits' clock, stopped: no bucket refills while the test runs, whatever the machine's speed."""

    def __call__(self) -> float:
        return 1000.0


@pytest.fixture
def limited(pipeline: Pipeline, proxy: FaultProxy) -> FaultProxy:
    proxy.throttle = ShardThrottle(
        ShardLimits(FrozenClock()), lambda stream: paged_shards(pipeline.kinesis.list_shards, stream)
    )
    return proxy


def test_a_put_over_a_shards_1000_records_fails_those_entries_alone_as_kinesis_answers(
    pipeline: Pipeline, limited: FaultProxy
) -> None:
    """One partition key, one shard: its first 1,000 records land, the rest are answered 200 with
    FailedRecordCount and a per-entry ProvisionedThroughputExceededException, and are not stored."""
    kinesis = client("kinesis", limited.endpoint)
    answers = [
        kinesis.put_records(
            StreamName=pipeline.target,
            Records=[{"PartitionKey": "one", "Data": b"%d" % (n * 400 + i)} for i in range(400)],
        )
        for n in range(3)
    ]
    assert [a["FailedRecordCount"] for a in answers] == [0, 0, 200]
    failed = answers[2]["Records"]
    assert all("SequenceNumber" in r for r in failed[:200])
    assert {r.get("ErrorCode") for r in failed[200:]} == {"ProvisionedThroughputExceededException"}
    assert all(r["ErrorMessage"].startswith("Rate exceeded for shard shardId-") for r in failed[200:])
    assert len(read_stream(pipeline.kinesis, pipeline.target)) == 1000


def test_a_shards_sixth_read_in_a_second_is_refused_with_400_as_kinesis_does(
    pipeline: Pipeline, limited: FaultProxy
) -> None:
    kinesis = client("kinesis", limited.endpoint)
    shard = pipeline.kinesis.list_shards(StreamName=pipeline.target)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=pipeline.target, ShardId=shard, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"
    ]
    for _ in range(5):
        iterator = kinesis.get_records(ShardIterator=iterator)["NextShardIterator"]
    with pytest.raises(ClientError) as info:
        kinesis.get_records(ShardIterator=iterator)
    assert info.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert limited.throttle is not None
    assert limited.throttle.refused["reads", pipeline.target] >= 1  # botocore retried it before raising


def test_each_service_goes_to_its_own_upstream_on_the_independent_backend(independent: Endpoints) -> None:
    """kinesis-mock and dynalite answer on two ports: through one proxy, a Kinesis call reaches kinesis-mock and a
    DynamoDB call dynalite (sent to the other server, either would fail)."""
    with FaultProxy(independent.kinesis, seed=1, hang_s=1.0, dynamodb_upstream=independent.dynamodb) as proxy:
        kinesis = client("kinesis", proxy.endpoint)
        dynamodb = client("dynamodb", proxy.endpoint)
        kinesis.create_stream(StreamName="via-proxy", ShardCount=1)
        dynamodb.create_table(
            TableName="via-proxy",
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        assert "via-proxy" in kinesis.list_streams()["StreamNames"]
        assert "via-proxy" in dynamodb.list_tables()["TableNames"]
        assert proxy.requests["read"] >= 2 and proxy.requests["state"] >= 2, proxy.requests


def test_a_client_that_resets_its_connection_mid_request_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """A worker the schedule kills drops its connections mid-request: the run's output had a socketserver
    traceback for each (an independent-backend seed printed `ConnectionResetError` between its seed lines)."""
    with FaultProxy("http://127.0.0.1:9", seed=1, hang_s=1.0) as proxy:
        host, port = proxy.endpoint.removeprefix("http://").split(":")
        for _ in range(3):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n")  # the head unfinished
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            sock.close()
        deadline = time.monotonic() + 10  # until each handler thread has read its reset and ended
        while any("process_request" in t.name for t in threading.enumerate()) and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = socket.create_connection((host, int(port)))  # and the server still accepts
        alive.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err, err


def test_every_put_is_kept_with_its_event_ids_its_fault_and_the_backends_time(
    pipeline: Pipeline, proxy: FaultProxy
) -> None:
    """What a failed seed's trace is made of: a forwarded put with how long the backend took, a timed-out one
    never forwarded (no backend time), a partial one with the entries it failed and never forwarded."""
    streams = streams_via(proxy, pipeline)
    before = time.monotonic()
    streams.put_records(pipeline.target, ENTRIES[:3])
    proxy.add(always("put_timeout"))
    with pytest.raises(AmbiguousPutError):
        streams.put_records(pipeline.target, ENTRIES[3:5])
    proxy.clear()
    proxy.add(always("put_partial"))
    codes = streams.put_records(pipeline.target, ENTRIES[5:25])
    deadline = time.monotonic() + 10
    while len(proxy.puts) < 3 and time.monotonic() < deadline:  # the timed-out one is kept once the proxy drops it
        time.sleep(0.05)
    plain, timed_out, partial = sorted(proxy.puts, key=lambda p: p.at)
    assert plain.stream == pipeline.target and plain.event_ids == ("e0", "e1", "e2") and plain.fault is None
    assert plain.at >= before and plain.backend_s is not None and 0 < plain.backend_s < 30
    assert (timed_out.fault, timed_out.backend_s, timed_out.event_ids) == ("put_timeout", None, ("e3", "e4"))
    assert partial.fault == "put_partial" and partial.backend_s is not None
    assert partial.refused == tuple(i for i, code in enumerate(codes) if code) and partial.refused


class _AppliesThenHangsUp(BaseHTTPRequestHandler):
    """An upstream that reads each request whole (applies it: counted), then closes without an answer."""

    applied: list[str]

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.applied.append(self.headers.get("X-Amz-Target", ""))
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass


def test_a_put_whose_answer_is_lost_upstream_is_sent_once_and_left_ambiguous_to_the_copier() -> None:
    """The proxy sent a put again when the backend's answer failed, though the backend had applied it: its
    records were stored twice while the copier saw one answer, a duplicate no report can explain. A put goes
    once; the copier sees no answer (ambiguous, verified). A read, which may go twice, still gets its retry."""
    applied: list[str] = []
    handler = type("Upstream", (_AppliesThenHangsUp,), {"applied": applied})
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    try:
        with FaultProxy(f"http://127.0.0.1:{upstream.server_address[1]}", seed=1, hang_s=1.0) as proxy:
            host, port = proxy.endpoint.removeprefix("http://").split(":")
            for operation in ("PutRecords", "GetRecords"):
                connection = http.client.HTTPConnection(host, int(port), timeout=10)
                body = b'{"StreamName": "t", "Records": []}'
                connection.request("POST", "/", body=body, headers={"X-Amz-Target": f"Kinesis_20131202.{operation}"})
                with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
                    connection.getresponse()
                connection.close()
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert applied == ["Kinesis_20131202.PutRecords"] + ["Kinesis_20131202.GetRecords"] * 2
