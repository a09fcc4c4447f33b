"""Conformance of the local AWS backends (copier.local) with the AWS behaviour copier and the KCL rely on.

Every check runs against each backend in turn: moto (a real ``LocalBackend`` on 127.0.0.1) and the
independent one (kinesis-mock and dynalite, ``copier.local.independent``); a check whose API the second
lacks says so and stays on moto (``only_on_moto``; README lists them). Over the
wire: HTTP/2 prior knowledge (what the KCL's Kinesis client speaks) and
HTTP/1.1 (boto3), no lost records under concurrent writers, shard lineage
after resharding, DynamoDB conditions, transactions and indexes, and the
``copier local-backend`` entry point.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import h2.config
import h2.connection
import h2.events
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config as BotoConfig
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from copier.local import moto_patches
from copier.local.backend import DUMMY_ENV, LocalBackend
from copier.local.independent import Endpoints, servers
from tests.support.backend import free_port

ROOT = Path(__file__).resolve().parents[1]
REGION = "us-east-1"
HALF = 2**127  # the middle of the 128-bit hash key space


@pytest.fixture(scope="module", params=["moto", "independent"])
def backend(request: pytest.FixtureRequest) -> Iterator[Endpoints]:
    """Each local backend in turn, one per module, stopped at its end: moto (one port for both services) and
    the independent one (kinesis-mock and dynalite, copier.local.independent)."""
    if request.param == "moto":
        with LocalBackend() as b:
            yield Endpoints(b.endpoint, b.endpoint, impl="moto")
    else:
        with servers() as endpoints:
            yield endpoints


def only_on_moto(backend: Endpoints, reason: str) -> None:
    """Skip on the independent backend, which lacks what this check needs (README lists these checks)."""
    if backend.impl != "moto":
        pytest.skip(f"moto only: {reason}")


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def aws(service: str, endpoint: str, retries: int = 3) -> Any:
    """A boto3 client with dummy credentials; ``retries=1`` turns every failed attempt into an error."""
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION)
    config = BotoConfig(retries={"mode": "standard", "total_max_attempts": retries}, read_timeout=30)
    return session.client(service, endpoint_url=endpoint, config=config)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def hash_key(partition_key: str) -> int:
    return int(hashlib.md5(partition_key.encode()).hexdigest(), 16)


def create_stream(kinesis: Any, shards: int) -> str:
    name = unique("stream")
    kinesis.create_stream(StreamName=name, ShardCount=shards)
    kinesis.get_waiter("stream_exists").wait(StreamName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 100})
    return name


def shards_of(kinesis: Any, stream: str) -> dict[str, dict[str, Any]]:
    return {s["ShardId"]: s for s in kinesis.list_shards(StreamName=stream)["Shards"]}


def is_open(shard: dict[str, Any]) -> bool:
    return "EndingSequenceNumber" not in shard["SequenceNumberRange"]


def read_shard(
    kinesis: Any, stream: str, shard_id: str, limit: int = 10000
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every record of a shard from TRIM_HORIZON, and the last GetRecords response.

    Stops at a null NextShardIterator (a closed shard's end) or an empty page
    (the tip of an open shard); a bound on the pages turns a shard that never
    ends into a failure instead of a hang.
    """
    iterator = kinesis.get_shard_iterator(StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"
    ]
    records: list[dict[str, Any]] = []
    page: dict[str, Any] = {}
    for _ in range(1000):
        page = kinesis.get_records(ShardIterator=iterator, Limit=limit)
        records.extend(page["Records"])
        iterator = page.get("NextShardIterator")
        if iterator is None or not page["Records"]:
            return records, page
    raise AssertionError(f"{shard_id}: no end after 1000 pages")


# --- protocols ------------------------------------------------------------------------------------


def signed_headers(endpoint: str, service: str, target: str, body: bytes) -> dict[str, str]:
    """SigV4 headers for a JSON-protocol POST, as an AWS SDK would send them."""
    content_type = "application/x-amz-json-1.1" if service == "kinesis" else "application/x-amz-json-1.0"
    request = AWSRequest(
        method="POST", url=endpoint + "/", data=body, headers={"Content-Type": content_type, "X-Amz-Target": target}
    )
    SigV4Auth(Credentials("testing", "testing"), service, REGION).add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


def h2c_prior_knowledge(port: int, calls: list[tuple[str, str, bytes]]) -> list[tuple[int, bytes]]:
    """Send ``calls`` (service, target, body) as concurrent streams on one cleartext HTTP/2 connection.

    Prior knowledge: the client starts with the HTTP/2 preface, no Upgrade, as
    the KCL's Netty client does for ``http://`` endpoints. Returns each call's
    (status, body) in order.
    """
    endpoint = f"http://127.0.0.1:{port}"
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        connection.initiate_connection()
        streams: dict[int, int] = {}
        for index, (service, target, body) in enumerate(calls):
            stream_id = connection.get_next_available_stream_id()
            streams[stream_id] = index
            headers = signed_headers(endpoint, service, target, body)
            headers.pop("host", None)
            request_headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", f"127.0.0.1:{port}"),
                (":path", "/"),
                *headers.items(),
                ("content-length", str(len(body))),
            ]
            connection.send_headers(stream_id, request_headers)
            connection.send_data(stream_id, body, end_stream=True)
        sock.sendall(connection.data_to_send())

        status: dict[int, int] = {}
        bodies: dict[int, bytearray] = {sid: bytearray() for sid in streams}
        ended: set[int] = set()
        while ended != set(streams):
            data = sock.recv(65536)
            assert data, "server closed the HTTP/2 connection"
            for event in connection.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    status[event.stream_id] = int(dict(event.headers or [])[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    bodies[event.stream_id].extend(event.data)
                    connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    raise AssertionError(f"stream {event.stream_id} reset: {event.error_code}")
            sock.sendall(connection.data_to_send())
        connection.close_connection()
        sock.sendall(connection.data_to_send())
    ordered = sorted(streams, key=streams.__getitem__)
    return [(status[sid], bytes(bodies[sid])) for sid in ordered]


def test_h2c_prior_knowledge_answers_kinesis_and_dynamodb(backend: Endpoints) -> None:
    """HTTP/2 prior-knowledge requests (the KCL Kinesis client's protocol) get 200s from Kinesis and DynamoDB."""
    stream = create_stream(aws("kinesis", backend.kinesis), 1)
    table = unique("table")
    aws("dynamodb", backend.dynamodb).create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    calls = [("kinesis", "Kinesis_20131202.ListStreams", b"{}"), ("dynamodb", "DynamoDB_20120810.ListTables", b"{}")]
    if backend.dynamodb != backend.kinesis:  # dynalite: HTTP/1.1 only, all the KCL's DynamoDB client speaks
        calls = calls[:1]
        assert aws("dynamodb", backend.dynamodb).list_tables()["TableNames"] == [table]
    answers = h2c_prior_knowledge(port_of(backend.kinesis), calls)
    (kinesis_status, kinesis_body) = answers[0]
    assert kinesis_status == 200, kinesis_body
    assert stream in json.loads(kinesis_body)["StreamNames"]
    for ddb_status, ddb_body in answers[1:]:
        assert ddb_status == 200, ddb_body
        assert table in json.loads(ddb_body)["TableNames"]


def test_http11_serves_boto3(backend: Endpoints) -> None:
    """boto3 (HTTP/1.1) reaches Kinesis and DynamoDB on the same port, and the server answers in HTTP/1.1."""
    kinesis = aws("kinesis", backend.kinesis)
    stream = create_stream(kinesis, 1)
    assert stream in kinesis.list_streams()["StreamNames"]
    assert isinstance(aws("dynamodb", backend.dynamodb).list_tables()["TableNames"], list)
    body = b"{}"
    connection = http.client.HTTPConnection("127.0.0.1", port_of(backend.kinesis), timeout=10)
    try:
        headers = signed_headers(backend.kinesis, "kinesis", "Kinesis_20131202.ListStreams", body)
        connection.request("POST", "/", body=body, headers=headers)
        response = connection.getresponse()
        assert (response.version, response.status) == (11, 200)
        assert stream in json.loads(response.read())["StreamNames"]
    finally:
        connection.close()


def test_a_region_moto_does_not_list_is_served_not_answered_with_a_500(backend: Endpoints) -> None:
    """Issue 45: regionName = us-eest-1 against the local backend made every call a 500 (moto's KeyError, a
    traceback on the backend's stderr for each of the SDK's retries). Any region is served, with streams and
    tables of its own: what is not there is a ResourceNotFoundException, as AWS says it."""
    only_on_moto(backend, "kinesis-mock answers every region from one (AWS and moto keep regions apart)")
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")
    config = BotoConfig(retries={"mode": "standard", "total_max_attempts": 1})
    kinesis = session.client("kinesis", region_name="us-eest-1", endpoint_url=backend.kinesis, config=config)
    dynamodb = session.client("dynamodb", region_name="us-eest-1", endpoint_url=backend.dynamodb, config=config)
    assert kinesis.list_streams()["StreamNames"] == []
    assert dynamodb.list_tables()["TableNames"] == []
    with pytest.raises(ClientError) as missing:
        dynamodb.describe_table(TableName="copier-local-copier-state")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert missing.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400


def test_refuses_non_loopback_hosts() -> None:
    """The backend checks no credentials, so it refuses to bind anything but a loopback address."""
    for host in ("0.0.0.0", "::", "10.0.0.1", "192.168.1.10", "example.com", ""):
        with pytest.raises(ValueError, match="loopback"):
            LocalBackend(host=host)
    LocalBackend(host="127.0.0.1")
    LocalBackend(host="::1")
    LocalBackend(host="localhost")


def test_patches_apply_once() -> None:
    """Applying the moto patches again changes nothing (the backend may be started many times per process)."""
    from moto.kinesis.models import Shard, Stream

    moto_patches.apply()
    before = (Shard.__init__, Shard.put_record, Stream.split_shard)
    moto_patches.apply()
    assert moto_patches.applied()
    assert (Shard.__init__, Shard.put_record, Stream.split_shard) == before


# --- concurrent writers ---------------------------------------------------------------------------

WRITERS = 4
RECORDS = {"moto": 20_000, "independent": 4_000}  # kinesis-mock takes about 1,000 records a second
BATCH = 100


@pytest.mark.timeout(120)
def test_no_acknowledged_record_lost_under_concurrent_writers(backend: Endpoints) -> None:
    """4 threads with their own clients PutRecords 20,000 records into 4 shards; each acked record reads back once."""
    kinesis = aws("kinesis", backend.kinesis)
    stream = create_stream(kinesis, 4)
    shard_ids = list(shards_of(kinesis, stream))
    acked: list[list[tuple[str, str, bytes]]] = [[] for _ in range(WRITERS)]
    errors: list[str] = []
    start = threading.Barrier(WRITERS + 1)
    writing = threading.Event()
    writing.set()

    def reader() -> None:
        """A consumer polling every shard while the producers write, as the KCL does."""
        client = aws("kinesis", backend.kinesis, retries=1)
        start.wait()
        while writing.is_set():
            for shard_id in shard_ids:
                try:
                    iterator = client.get_shard_iterator(
                        StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                    )["ShardIterator"]
                    client.get_records(ShardIterator=iterator, Limit=10000)
                except Exception as error:  # counted and reported below, never swallowed
                    errors.append(f"reader: {error!r}")

    def writer(w: int) -> None:
        client = aws("kinesis", backend.kinesis, retries=1)  # a failed attempt is an error, never a silent retry
        n = RECORDS[backend.impl] // WRITERS
        start.wait()
        for first in range(0, n, BATCH):
            data = [f"{w}:{i}".encode() for i in range(first, min(n, first + BATCH))]
            entries = [{"Data": d, "PartitionKey": f"pk-{d.decode()}"} for d in data]
            try:
                response = client.put_records(StreamName=stream, Records=entries)
            except Exception as error:  # counted and reported below, never swallowed
                errors.append(repr(error))
                continue
            for d, result in zip(data, response["Records"], strict=True):
                if "SequenceNumber" in result:
                    acked[w].append((result["ShardId"], result["SequenceNumber"], d))
                else:
                    errors.append(f"{result.get('ErrorCode')}: {result.get('ErrorMessage')}")

    began = time.monotonic()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
    polling = threading.Thread(target=reader)
    for thread in [*threads, polling]:
        thread.start()
    for thread in threads:
        thread.join(90)
    write_seconds = time.monotonic() - began
    writing.clear()
    polling.join(30)

    read: list[tuple[str, str, bytes]] = []
    for shard_id in shards_of(kinesis, stream):
        records, _ = read_shard(kinesis, stream, shard_id)
        read.extend((shard_id, r["SequenceNumber"], r["Data"]) for r in records)

    all_acked = [a for per_writer in acked for a in per_writer]
    lost = Counter(all_acked) - Counter(read)
    unexpected = Counter(read) - Counter(all_acked)
    summary = (
        f"acked={len(all_acked)} read={len(read)} lost={sum(lost.values())} unexpected={sum(unexpected.values())} "
        f"errors={len(errors)} write_seconds={write_seconds:.1f}"
    )
    print(summary)
    assert not errors, f"{summary}; first error: {errors[0]}"
    assert len(all_acked) == RECORDS[backend.impl], summary
    assert not lost and not unexpected, summary
    assert len({data for _, _, data in read}) == RECORDS[backend.impl], summary
    assert len({(shard, seq) for shard, seq, _ in read}) == RECORDS[backend.impl], summary


RACERS = 8
ROUNDS = 40


@pytest.mark.timeout(60)
def test_concurrent_conditional_updates_have_one_winner(backend: Endpoints) -> None:
    """8 threads race the same compare-and-set each round and exactly one wins (needs the backend's request lock)."""
    dynamodb = aws("dynamodb", backend.dynamodb)
    table = create_table(dynamodb)
    key = {"pk": {"S": "shard-0"}}
    dynamodb.put_item(TableName=table, Item={**key, "epoch": {"N": "0"}})
    wins = [0] * ROUNDS
    errors: list[str] = []
    in_step = threading.Barrier(RACERS, timeout=30)

    def racer() -> None:
        client = aws("dynamodb", backend.dynamodb, retries=1)
        for epoch in range(ROUNDS):
            in_step.wait()
            try:
                client.update_item(
                    TableName=table,
                    Key=key,
                    UpdateExpression="SET epoch = :next",
                    ConditionExpression="epoch = :mine",
                    ExpressionAttributeValues={":mine": {"N": str(epoch)}, ":next": {"N": str(epoch + 1)}},
                )
                wins[epoch] += 1
            except ClientError as error:
                if error.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    errors.append(repr(error))
            except Exception as error:  # counted and reported below, never swallowed
                errors.append(repr(error))

    # The backend runs in this process: switching threads far more often than the
    # default 5 ms widens any race inside moto, so a missing lock shows within seconds.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=racer) for _ in range(RACERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(50)
    finally:
        sys.setswitchinterval(switch_interval)
    assert not errors, errors[0]
    assert wins == [1] * ROUNDS, f"rounds with two or more winners: {sum(w > 1 for w in wins)}"
    final = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True)["Item"]["epoch"]
    assert final == {"N": str(ROUNDS)}


# --- resharding -----------------------------------------------------------------------------------


@dataclass
class Phase:
    """One round of writes: the shards open when it was written, and where each record was acknowledged."""

    tag: str
    open_shards: set[str]
    acked: dict[str, set[str]] = field(default_factory=dict)  # shard id -> data


@dataclass
class Resharded:
    """A stream taken through SplitShard, MergeShards and UpdateShardCount, with writes between the steps."""

    stream: str
    phases: list[Phase]
    shards: dict[str, dict[str, Any]]
    contents: dict[str, list[dict[str, Any]]]  # shard id -> records read from TRIM_HORIZON
    last_pages: dict[str, dict[str, Any]]  # shard id -> the GetRecords response that ended the read


@pytest.fixture(scope="module")
def resharded(backend: Endpoints) -> Resharded:
    """1 shard -> split into 2 -> merge back into 1 -> UpdateShardCount to 2, writing 300 records per phase."""
    kinesis = aws("kinesis", backend.kinesis)
    stream = create_stream(kinesis, 1)
    phases: list[Phase] = []

    def write(tag: str) -> None:
        open_now = {sid for sid, s in shards_of(kinesis, stream).items() if is_open(s)}
        phase = Phase(tag, open_now)
        data = [f"{tag}-{i}" for i in range(300)]
        entries = [{"Data": d.encode(), "PartitionKey": d} for d in data]
        response = kinesis.put_records(StreamName=stream, Records=entries)
        assert response.get("FailedRecordCount", 0) == 0
        for d, result in zip(data, response["Records"], strict=True):
            phase.acked.setdefault(result["ShardId"], set()).add(d)
        phases.append(phase)

    def open_ids() -> list[str]:
        return sorted(sid for sid, s in shards_of(kinesis, stream).items() if is_open(s))

    write("A")
    (only,) = open_ids()
    kinesis.split_shard(StreamName=stream, ShardToSplit=only, NewStartingHashKey=str(HALF))
    write("B")
    low, high = open_ids()
    kinesis.merge_shards(StreamName=stream, ShardToMerge=low, AdjacentShardToMerge=high)
    write("C")
    kinesis.update_shard_count(StreamName=stream, TargetShardCount=2, ScalingType="UNIFORM_SCALING")
    assert len(open_ids()) == 2
    write("D")

    shards = shards_of(kinesis, stream)
    contents: dict[str, list[dict[str, Any]]] = {}
    last_pages: dict[str, dict[str, Any]] = {}
    for shard_id in shards:
        contents[shard_id], last_pages[shard_id] = read_shard(kinesis, stream, shard_id, limit=100)
    return Resharded(stream, phases, shards, contents, last_pages)


def test_reshard_lineage(resharded: Resharded) -> None:
    """Split, merge and UpdateShardCount close their parents and open children that name them."""
    shards = resharded.shards
    assert len(shards) == 6, shards
    s0, s1, s2, s3, s4, s5 = sorted(shards)
    assert {sid for sid, s in shards.items() if is_open(s)} == {s4, s5}
    assert shards[s1]["ParentShardId"] == shards[s2]["ParentShardId"] == s0
    assert {shards[s3]["ParentShardId"], shards[s3]["AdjacentParentShardId"]} == {s1, s2}
    assert shards[s4]["ParentShardId"] == shards[s5]["ParentShardId"] == s3
    assert int(shards[s4]["HashKeyRange"]["EndingHashKey"]) + 1 == int(shards[s5]["HashKeyRange"]["StartingHashKey"])


def test_new_writes_land_only_in_open_shards(resharded: Resharded) -> None:
    """Every record written after a reshard is acknowledged by a shard that was open at the time."""
    for phase in resharded.phases:
        assert phase.acked, phase.tag
        assert set(phase.acked) <= phase.open_shards, (phase.tag, set(phase.acked), phase.open_shards)


def test_each_shard_holds_exactly_the_records_written_to_it(resharded: Resharded) -> None:
    """A shard holds the records acknowledged by it and nothing else: a child holds no copies of its parents'."""
    expected: dict[str, Counter[str]] = {sid: Counter() for sid in resharded.shards}
    for phase in resharded.phases:
        for shard_id, data in phase.acked.items():
            expected[shard_id].update(data)
    for shard_id, records in resharded.contents.items():
        assert Counter(r["Data"].decode() for r in records) == expected[shard_id], shard_id
    assert sum(len(r) for r in resharded.contents.values()) == 300 * len(resharded.phases)


def test_closed_shard_read_to_its_end_lists_its_children(resharded: Resharded) -> None:
    """A closed shard read to its end returns no NextShardIterator and its ChildShards; an open shard keeps one."""
    shards = resharded.shards
    for shard_id, page in resharded.last_pages.items():
        if is_open(shards[shard_id]):
            assert page.get("NextShardIterator"), shard_id
            assert not page.get("ChildShards"), shard_id
            continue
        assert page.get("NextShardIterator") is None, shard_id
        expected = {
            sid: {
                "ShardId": sid,
                "ParentShards": sorted(p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p),
                "HashKeyRange": s["HashKeyRange"],
            }
            for sid, s in shards.items()
            if shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))
        }
        assert expected, shard_id
        got = {c["ShardId"]: {**c, "ParentShards": sorted(c["ParentShards"])} for c in page["ChildShards"]}
        assert got == expected, shard_id


def test_no_record_outside_its_shards_hash_key_range(resharded: Resharded) -> None:
    """Every record's partition-key hash lies inside the hash key range of the shard that holds it."""
    for shard_id, records in resharded.contents.items():
        key_range = resharded.shards[shard_id]["HashKeyRange"]
        low, high = int(key_range["StartingHashKey"]), int(key_range["EndingHashKey"])
        outside = [r["PartitionKey"] for r in records if not low <= hash_key(r["PartitionKey"]) <= high]
        assert not outside, (shard_id, len(outside))


def test_children_sequence_numbers_exceed_their_parents(resharded: Resharded) -> None:
    """Sequence numbers are unique, increase within a shard, and a child's exceed every parent's, as on AWS."""
    shards, contents = resharded.shards, resharded.contents
    numbers = {sid: [int(r["SequenceNumber"]) for r in records] for sid, records in contents.items()}
    everything = [n for ns in numbers.values() for n in ns]
    assert len(everything) == len(set(everything))
    for shard_id, shard in shards.items():
        assert numbers[shard_id] == sorted(numbers[shard_id])
        start = int(shard["SequenceNumberRange"]["StartingSequenceNumber"])
        assert all(n > start for n in numbers[shard_id])
        for parent in (shard.get("ParentShardId"), shard.get("AdjacentParentShardId")):
            if parent:
                assert start > int(shards[parent]["SequenceNumberRange"]["EndingSequenceNumber"])


def test_closed_empty_shard_ends_at_once(backend: Endpoints) -> None:
    """A shard split before it held any record reads as ended (no NextShardIterator, its ChildShards) at once."""
    kinesis = aws("kinesis", backend.kinesis)
    stream = create_stream(kinesis, 1)
    (parent,) = shards_of(kinesis, stream)
    kinesis.split_shard(StreamName=stream, ShardToSplit=parent, NewStartingHashKey=str(HALF))
    records, page = read_shard(kinesis, stream, parent)
    assert records == []
    assert page.get("NextShardIterator") is None
    assert len(page["ChildShards"]) == 2


def test_last_hash_key_of_a_shard_is_routable(backend: Endpoints) -> None:
    """A record whose ExplicitHashKey is a shard's EndingHashKey lands in that shard."""
    kinesis = aws("kinesis", backend.kinesis)
    stream = create_stream(kinesis, 2)
    for shard_id, shard in shards_of(kinesis, stream).items():
        end = shard["HashKeyRange"]["EndingHashKey"]
        response = kinesis.put_record(StreamName=stream, Data=b"edge", PartitionKey="edge", ExplicitHashKey=end)
        assert response["ShardId"] == shard_id


# --- DynamoDB -------------------------------------------------------------------------------------


def create_table(dynamodb: Any, **extra: Any) -> str:
    """A new table, ACTIVE: dynalite makes one CREATING first, as AWS does, and a write before it is ACTIVE is
    refused with ResourceNotFoundException (seen on a loaded machine)."""
    name = unique("table")
    attributes = [{"AttributeName": "pk", "AttributeType": "S"}, *extra.pop("attributes", [])]
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=attributes,
        BillingMode="PAY_PER_REQUEST",
        **extra,
    )
    dynamodb.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.1, "MaxAttempts": 300})
    return name


def error_code(error: pytest.ExceptionInfo[ClientError]) -> str:
    return str(error.value.response["Error"]["Code"])


def test_record_limits_are_per_stream_as_update_max_record_size_sets_them(backend: Endpoints) -> None:
    """A new stream takes records up to 1 MiB (key included) and refuses a byte more; UpdateMaxRecordSize
    raises one stream's limit (DescribeStreamSummary says so) and not another's; a PutRecords request
    carries up to 10 MiB; a limit over 10,240 KiB is refused."""
    only_on_moto(
        backend,
        "kinesis-mock reports MaxRecordSizeInKiB null until UpdateMaxRecordSize (AWS: 1024) and answers GetRecords "
        "with a 500 once a record of 10 MiB is stored",
    )
    kinesis = aws("kinesis", backend.kinesis, retries=1)
    big, small = create_stream(kinesis, 1), create_stream(kinesis, 1)
    limit = 1024 * 1024
    kinesis.put_record(StreamName=small, PartitionKey="k", Data=b"x" * (limit - 1))
    with pytest.raises(ClientError, match="ValidationException"):
        kinesis.put_records(StreamName=small, Records=[{"PartitionKey": "k", "Data": b"x" * limit}])
    with pytest.raises(ClientError, match="ValidationException"):
        kinesis.put_record(StreamName=small, PartitionKey="k", Data=b"x" * limit)
    arn = kinesis.describe_stream_summary(StreamName=big)["StreamDescriptionSummary"]["StreamARN"]
    kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=4096)
    assert kinesis.describe_stream_summary(StreamName=big)["StreamDescriptionSummary"]["MaxRecordSizeInKiB"] == 4096
    assert kinesis.describe_stream_summary(StreamName=small)["StreamDescriptionSummary"]["MaxRecordSizeInKiB"] == 1024
    answer = kinesis.put_records(
        StreamName=big, Records=[{"PartitionKey": "k", "Data": b"y" * (3 * limit)} for _ in range(3)]
    )
    assert answer["FailedRecordCount"] == 0  # 9 MiB in one request, records of 3 MiB
    with pytest.raises(ClientError, match="ValidationException"):
        kinesis.put_records(StreamName=big, Records=[{"PartitionKey": "k", "Data": b"y" * (4 * limit - 1)}] * 3)
    with pytest.raises(ClientError, match="ValidationException"):
        kinesis.put_record(StreamName=big, PartitionKey="k", Data=b"z" * (4 * limit))
    with pytest.raises(ClientError, match="ValidationException"):  # (boto3 itself refuses one under 1,024)
        kinesis.update_max_record_size(StreamARN=arn, MaxRecordSizeInKiB=10241)
    shard = kinesis.list_shards(StreamName=big)["Shards"][0]["ShardId"]
    iterator = kinesis.get_shard_iterator(StreamName=big, ShardId=shard, ShardIteratorType="TRIM_HORIZON")
    page = kinesis.get_records(ShardIterator=iterator["ShardIterator"])
    assert [len(r["Data"]) for r in page["Records"]] == [3 * limit] * 3  # 9 MiB: one page
    kinesis.put_records(StreamName=big, Records=[{"PartitionKey": "k", "Data": b"w" * (4 * limit - 1)}] * 2)
    kinesis.put_records(StreamName=big, Records=[{"PartitionKey": "k", "Data": b"w" * (4 * limit - 1)}])
    pages = []
    iterator = page["NextShardIterator"]
    while True:  # a GetRecords answer holds at most 10 MiB: the three 4 MiB records take two pages
        page = kinesis.get_records(ShardIterator=iterator)
        if not page["Records"]:
            break
        pages.append(len(page["Records"]))
        iterator = page["NextShardIterator"]
    assert pages == [2, 1]


def test_a_stream_switched_to_auto_ignores_partition_keys_and_switched_back_routes_by_them(
    backend: Endpoints,
) -> None:
    """UpdateStreamRecordDistributionStrategy: under AUTO one key's records spread over every open shard, and
    DescribeStreamSummary says AUTO; back under USER_PARTITION_KEY they go to the key's shard again."""
    only_on_moto(backend, "kinesis-mock has no RecordDistributionStrategy nor UpdateStreamRecordDistributionStrategy")
    kinesis = aws("kinesis", backend.kinesis, retries=1)
    stream = create_stream(kinesis, 3)
    summary = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]
    assert summary["RecordDistributionStrategy"] == "USER_PARTITION_KEY"
    arn = summary["StreamARN"]

    def shards_of_one_key(n: int) -> set[str]:
        answer = kinesis.put_records(StreamName=stream, Records=[{"PartitionKey": "k", "Data": b"x"}] * n)
        return {r["ShardId"] for r in answer["Records"]}

    assert len(shards_of_one_key(6)) == 1
    kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy="AUTO")
    assert (
        kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["RecordDistributionStrategy"]
        == "AUTO"
    )
    assert len(shards_of_one_key(6)) == 3
    kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy="USER_PARTITION_KEY")
    assert len(shards_of_one_key(6)) == 1


def test_dynamodb_conditional_writes(backend: Endpoints) -> None:
    """A write whose condition fails raises ConditionalCheckFailedException and changes nothing."""
    dynamodb = aws("dynamodb", backend.dynamodb)
    table = create_table(dynamodb)
    item = {"pk": {"S": "shard-1"}, "epoch": {"N": "1"}}
    dynamodb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")
    with pytest.raises(ClientError) as second_create:
        dynamodb.put_item(TableName=table, Item=item, ConditionExpression="attribute_not_exists(pk)")
    assert error_code(second_create) == "ConditionalCheckFailedException"
    with pytest.raises(ClientError) as stale_epoch:
        dynamodb.update_item(
            TableName=table,
            Key={"pk": {"S": "shard-1"}},
            UpdateExpression="SET epoch = :new",
            ConditionExpression="epoch = :expected",
            ExpressionAttributeValues={":new": {"N": "3"}, ":expected": {"N": "2"}},
        )
    assert error_code(stale_epoch) == "ConditionalCheckFailedException"
    dynamodb.update_item(
        TableName=table,
        Key={"pk": {"S": "shard-1"}},
        UpdateExpression="SET epoch = :new",
        ConditionExpression="epoch = :expected",
        ExpressionAttributeValues={":new": {"N": "2"}, ":expected": {"N": "1"}},
    )
    assert dynamodb.get_item(TableName=table, Key={"pk": {"S": "shard-1"}}, ConsistentRead=True)["Item"]["epoch"] == {
        "N": "2"
    }


def test_dynamodb_transaction_is_all_or_nothing(backend: Endpoints) -> None:
    """A TransactWriteItems with one failing condition raises TransactionCanceledException and writes nothing."""
    only_on_moto(backend, "dynalite has no TransactWriteItems (UnknownOperationException); copier writes none")
    dynamodb = aws("dynamodb", backend.dynamodb)
    table = create_table(dynamodb)
    dynamodb.put_item(TableName=table, Item={"pk": {"S": "state"}, "epoch": {"N": "5"}})
    with pytest.raises(ClientError) as cancelled:
        dynamodb.transact_write_items(
            TransactItems=[
                {"Put": {"TableName": table, "Item": {"pk": {"S": "digest-1"}}}},
                {"Put": {"TableName": table, "Item": {"pk": {"S": "digest-2"}}}},
                {
                    "ConditionCheck": {
                        "TableName": table,
                        "Key": {"pk": {"S": "state"}},
                        "ConditionExpression": "epoch = :mine",
                        "ExpressionAttributeValues": {":mine": {"N": "4"}},
                    }
                },
            ]
        )
    assert error_code(cancelled) == "TransactionCanceledException"
    reasons = [r.get("Code") for r in cancelled.value.response.get("CancellationReasons", [])]
    assert reasons == ["None", "None", "ConditionalCheckFailed"]
    keys = {i["pk"]["S"] for i in dynamodb.scan(TableName=table, ConsistentRead=True)["Items"]}
    assert keys == {"state"}
    dynamodb.transact_write_items(
        TransactItems=[
            {"Put": {"TableName": table, "Item": {"pk": {"S": "digest-1"}}}},
            {
                "ConditionCheck": {
                    "TableName": table,
                    "Key": {"pk": {"S": "state"}},
                    "ConditionExpression": "epoch = :mine",
                    "ExpressionAttributeValues": {":mine": {"N": "5"}},
                }
            },
        ]
    )
    keys = {i["pk"]["S"] for i in dynamodb.scan(TableName=table, ConsistentRead=True)["Items"]}
    assert keys == {"state", "digest-1"}


def test_dynamodb_global_secondary_index(backend: Endpoints) -> None:
    """A table created with a GSI answers queries on it, and UpdateTable creating an existing GSI does not fail
    (on dynalite, which cannot add a GSI to an on-demand table: that it refuses, so the setup step is needed)."""
    dynamodb = aws("dynamodb", backend.dynamodb, retries=1)  # a 500 must show, not be retried away
    owner = [{"AttributeName": "owner", "AttributeType": "S"}]
    table = create_table(
        dynamodb,
        attributes=owner,
        GlobalSecondaryIndexes=[
            {
                "IndexName": "by-owner",
                "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
    )
    for key, owner_name in (("lease-1", "w1"), ("lease-2", "w2"), ("lease-3", "w1")):
        dynamodb.put_item(TableName=table, Item={"pk": {"S": key}, "owner": {"S": owner_name}})
    found = dynamodb.query(
        TableName=table,
        IndexName="by-owner",
        KeyConditionExpression="#o = :w",
        ExpressionAttributeNames={"#o": "owner"},
        ExpressionAttributeValues={":w": {"S": "w1"}},
    )["Items"]
    assert sorted(i["pk"]["S"] for i in found) == ["lease-1", "lease-3"]

    # Two KCL workers starting together both add the lease table's index to an existing table.
    lease_table = create_table(dynamodb)
    add_index = {
        "TableName": lease_table,
        "AttributeDefinitions": owner,
        "GlobalSecondaryIndexUpdates": [
            {
                "Create": {
                    "IndexName": "LeaseOwnerToLeaseKeyIndex",
                    "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            }
        ],
    }
    if backend.impl == "independent":
        # dynalite refuses a GSI Create without ProvisionedThroughput on an on-demand table (AWS and moto accept
        # it, as the KCL sends it), so the local backend's setup creates the KCL's lease table with its index:
        # copier.local.independent.create_lease_table.
        with pytest.raises(ClientError, match="provisionedThroughput"):
            dynamodb.update_table(**add_index)
        return
    dynamodb.update_table(**add_index)
    dynamodb.update_table(**add_index)
    indexes = dynamodb.describe_table(TableName=lease_table)["Table"]["GlobalSecondaryIndexes"]
    assert [i["IndexName"] for i in indexes] == ["LeaseOwnerToLeaseKeyIndex"]


# --- the command ----------------------------------------------------------------------------------


def read_line(stream: Any, timeout: float) -> str:
    """One line from a pipe, or AssertionError after ``timeout`` seconds."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise AssertionError(f"no line within {timeout} s")
        return str(stream.readline())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_main_prints_ready_serves_and_stops_cleanly(stop_signal: signal.Signals) -> None:
    """``copier local-backend`` prints only the READY line, serves boto3, and on SIGTERM/SIGINT exits 0 with its
    port closed."""
    port = free_port()
    python = ROOT / ".venv/bin/python"
    command = [
        str(python if python.exists() else sys.executable),
        "-c",
        f"from copier.commands.cli import main; import sys; sys.exit(main(['local-backend', '--port', '{port}']))",
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, **DUMMY_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert read_line(process.stdout, 30) == f"READY http://127.0.0.1:{port}\n"
        kinesis = aws("kinesis", f"http://127.0.0.1:{port}")
        assert kinesis.list_streams()["StreamNames"] == []
        process.send_signal(stop_signal)
        stdout, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert stdout == "", stdout
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
