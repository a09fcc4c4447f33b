"""copier's billing model (``copier.local.billing``) against dynalite's ``ReturnConsumedCapacity``, request by request.

The benchmarks' cost figures come from ``copier.local.billing``, which the project wrote from AWS's documentation.
dynalite is an implementation of DynamoDB it did not write: every request below is sent to it with
``ReturnConsumedCapacity=TOTAL``, and the units it reports are compared with what the billing model says for the
same request, the model following the table through the same requests (:class:`copier.local.billing.Ledger`).

Where the two differ, AWS's documentation decides, and the difference is asserted exactly here and written down in
docs/benchmarks.md (``copier.bench.report``): dynalite counts a string's UTF-16 code units where DynamoDB counts
its UTF-8 bytes ("Item sizes and formats"); a failed conditional write is billed by DynamoDB and reported by
neither (an error carries no ``ConsumedCapacity``).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import random
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest

from copier.adapters.awsauth import lean_credentials
from copier.adapters.awsjson import ConditionFailed, JsonClient
from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.leanstate import LeanStateStore
from copier.bench.cost import _per_record
from copier.core.errors import FencedError
from copier.core.limits import MAX_ITEM_BYTES
from copier.core.packing import pack_digests
from copier.core.positions import Position
from copier.core.state import DigestBatch, ShardState, StateConflict
from copier.local.backend import DUMMY_ENV
from copier.local.billing import KB, Ledger, billed_writes, item_size
from copier.local.independent import Endpoints
from copier.local.multilang import COPIER, Processor, event
from tests.conftest import backend_for
from tests.support.backend import client as boto_client
from tests.support.backend import create_stream
from tests.support.fakes import config
from tests.support.props import write_properties

READS = ("GetItem", "BatchGetItem", "Query")
Seen = tuple[str, dict[str, Any], dict[str, Any] | None]  # operation, request, answer (None: condition failed)


class Metered(JsonClient):
    """copier's own DynamoDB client, asking for the consumed capacity of every call and keeping the answers."""

    seen: list[Seen]

    def call(self, operation: str, body: bytes, deadline: float | None = None) -> dict[str, Any]:
        request = {**json.loads(body), "ReturnConsumedCapacity": "TOTAL"}
        try:
            answer = super().call(operation, json.dumps(request).encode(), deadline)
        except ConditionFailed:
            self.seen.append((operation, request, None))
            raise
        self.seen.append((operation, request, answer))
        return answer


def _compare(seen: list[Seen]) -> list[tuple[str, float, float | None]]:
    """Each request as (operation, the billing model's units, dynalite's units; None: it reported none)."""
    ledger = Ledger()
    rows: list[tuple[str, float, float | None]] = []
    for operation, request, answer in seen:
        if operation in READS:
            assert answer is not None
            model = ledger.read(operation, request, answer)
        else:
            model = sum(w.units for w in ledger.write(operation, request, failed=answer is None))
        reported = None if answer is None else answer.get("ConsumedCapacity")
        if isinstance(reported, list):  # BatchGetItem: one entry per table
            reported = {"CapacityUnits": sum(c["CapacityUnits"] for c in reported)}
        rows.append((operation, model, None if reported is None else reported["CapacityUnits"]))
    return rows


def _client(backend: Endpoints) -> Metered:
    client = Metered("dynamodb", "us-east-1", backend.dynamodb, lean_credentials(DUMMY_ENV), 5.0, 30.0)
    client.seen = []
    return client


@pytest.fixture
def dynalite(request: pytest.FixtureRequest) -> Endpoints:
    return backend_for(request, "independent")


def _state_table(backend: Endpoints, name: str) -> tuple[LeanStateStore, Metered]:
    """copier's state table on dynalite, created as ``copier init`` creates it, and the lean store on it."""
    cfg = config(stateTableName=name)
    cfg = replace(cfg, kinesis_endpoint=backend.kinesis, target_endpoint=backend.kinesis)
    cfg = replace(cfg, dynamodb_endpoint=backend.dynamodb, state_endpoint=backend.dynamodb)
    DynamoStateStore(cfg).create_table()
    client = _client(backend)
    return LeanStateStore(cfg, client), client


def _digests(rng: random.Random, count: int) -> bytes:
    return pack_digests(rng.getrandbits(80) for _ in range(count))


def test_the_state_stores_requests_are_billed_as_dynalite_reports(dynalite: Endpoints) -> None:
    """A takeover, digest batches from 1 to about 390 KB, commits, conflicts, a release and every read copier
    makes: the model's units and dynalite's agree on each request; failed writes are billed, not reported."""
    store, client = _state_table(dynalite, "crosscheck-state")
    rng = random.Random(46)
    key = "shardId-000000000001"
    # The takeover: read the state (none yet), claim it.
    assert store.get(key) is None
    mine = ShardState(epoch=1, version=1, owner="host-a:101", lease_until_ms=1_764_200_000_123)
    mine = replace(mine, updated_ms=1_764_200_000_000)
    store.replace_if_unchanged(key, None, mine)
    # Digest batches of realistic sizes: 1 to 10,000 events (copier.core.limits.MAX_CHUNK_EVENTS), and one at the
    # 400 KB item limit's scale (its IDs, content digests and redo identities).
    sizes = [(1, 0, 0), (100, 0, 100), (1_000, 10, 1_000), (10_000, 0, 10_000), (13_000, 13_000, 13_000)]
    for index, (keyed, unkeyed, redo) in enumerate(sizes, start=1):
        batch = DigestBatch(
            index=index,
            epoch=1,
            last=Position(49_600_000_000_000_000_000 + index * 1_000),
            started_ms=1_764_200_000_000 + index,
            keyed=_digests(rng, keyed),
            unkeyed=_digests(rng, unkeyed),
            redo_ids=_digests(rng, redo),
            arrival_min_ms=1_764_199_999_000,
            arrival_max_ms=1_764_200_000_120,
            target_shards=(0, 1, 2, 3),
            settings="k=json:eventId;u=forward",
        )
        store.put_batch(key, batch)
        # Its commit: the position, the batch count, the window grown.
        mine = replace(
            mine,
            version=mine.version + 1,
            position=batch.last,
            batches=index,
            counters={"forwarded": 10 * index, "duplicates": index},
            window_ids=mine.window_ids + keyed,
            updated_ms=mine.updated_ms + 1_000,
        )
        store.write(key, replace(mine, version=mine.version - 1), mine)
    # Conflicts, each refused by its condition: a second claimant, a fenced commit, a fenced (older) batch.
    with pytest.raises(StateConflict):
        store.replace_if_unchanged(key, None, replace(mine, owner="host-b:202"))
    with pytest.raises(FencedError):
        store.write(key, replace(mine, epoch=0), replace(mine, version=mine.version + 1))
    stale = DigestBatch(index=len(sizes), epoch=0, last=Position(1), started_ms=1, keyed=_digests(rng, 1))
    with pytest.raises(FencedError):
        store.put_batch(key, stale)
    # The takeover's and the display's reads: the batches (Query, a page of two, then the rest), one batch,
    # the state, and states of many shards at once (eventually consistent, two of them absent).
    assert len(list(store.batches(key, len(sizes), page_size=2))) == len(sizes)
    batch = store.get_batch(key, len(sizes))
    assert batch is not None and batch.epoch == 1, "the fenced batch left the big one in place"
    assert store.get(key) == mine
    assert set(store.get_many([key, "shardId-000000000002", "shardId-000000000003"])) == {key}
    # The release: no owner, the lease given up.
    released = replace(mine, version=mine.version + 1, owner=None, lease_until_ms=0)
    store.write(key, mine, released)

    rows = _compare(client.seen)
    biggest = max(item_size(request["Item"]) for op, request, _ in client.seen if op == "PutItem")
    assert 350 * KB < biggest <= MAX_ITEM_BYTES, "a digest batch near DynamoDB's item limit was written"
    failed = [row for row, (_, _, answer) in zip(rows, client.seen, strict=True) if answer is None]
    assert [(op, reported) for op, _, reported in failed] == [("PutItem", None)] * 3, "an error reports no capacity"
    assert all(model >= 1 for _, model, _ in failed), "a failed conditional write is billed all the same"
    assert [(op, model) for op, model, reported in rows if reported is not None and model != reported] == []
    operations = {op for op, _, _ in rows}
    assert operations == {"GetItem", "PutItem", "Query", "BatchGetItem"}


def _padded(item: dict[str, Any], size: int) -> dict[str, Any]:
    """``item`` with an ASCII string attribute making its size (copier.local.billing.item_size) exactly ``size``."""
    filler = size - item_size(item) - len("pad")
    assert filler >= 0, item
    return {**item, "pad": {"S": "x" * filler}}


def _values() -> dict[str, dict[str, Any]]:
    """One value of every DynamoDB type, and the numbers whose size the plain formula gets wrong."""
    blob = base64.b64encode(bytes(range(256)) * 3).decode()
    numbers = ["0", "1", "12", "120", "1.2", "-5", "-1.5", "0.001", "1700000000000", "1700000000123", "9" * 38]
    return {
        "binary": {"B": blob},
        "bool": {"BOOL": True},
        "null": {"NULL": True},
        "list": {"L": [{"S": "a"}, {"N": "120"}, {"L": []}, {"M": {"k": {"BOOL": False}}}]},
        "map": {"M": {"name": {"S": "x"}, "nested": {"M": {"n": {"N": "-1.5"}}}, "empty": {"M": {}}}},
        "string set": {"SS": ["a", "bc", "def"]},
        "number set": {"NS": ["1", "120", "-0.5", "1700000000000"]},
        "binary set": {"BS": [blob, base64.b64encode(b"\x00").decode()]},
        **{f"number {n}": {"N": n} for n in numbers},
    }


def _table(backend: Endpoints, name: str) -> None:
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=backend.dynamodb,
        region_name="us-east-1",
        aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk")],
        BillingMode="PAY_PER_REQUEST",
    )


def _put_and_read(client: Metered, table: str, item: dict[str, Any]) -> None:
    key = {"pk": item["pk"], "sk": item["sk"]}
    client.call("PutItem", json.dumps({"TableName": table, "Item": item}).encode())
    for consistent in (True, False):
        client.call("GetItem", json.dumps({"TableName": table, "Key": key, "ConsistentRead": consistent}).encode())


def test_every_type_is_sized_to_the_byte_as_dynalite_sizes_it(dynalite: Endpoints) -> None:
    """Each type's item padded to exactly 1,024 bytes by the model (1 write unit), then 1,025 (2 units), then
    4,096 and 4,097 (1 and 2 read units; half when eventually consistent): a byte more or less on either side
    moves one of them over a boundary, so agreement is agreement on the size itself."""
    client = _client(dynalite)
    _table(dynalite, "crosscheck-types")
    names = []
    for name, value in _values().items():
        for size in (KB, KB + 1, 4 * KB, 4 * KB + 1):
            item = _padded({"pk": {"S": name}, "sk": {"S": str(size)}, "value": value}, size)
            _put_and_read(client, "crosscheck-types", item)
            names += [f"{name} {size}"] * 3
    rows = _compare(client.seen)
    assert [(name, *row) for name, row in zip(names, rows, strict=True) if row[1] != row[2]] == []
    assert {row[1] for row in rows if row[0] == "PutItem"} == {1, 2, 4, 5}
    assert {row[1] for row in rows if row[0] == "GetItem"} == {0.5, 1, 2}


def test_item_size_rounding_up_to_the_400_kb_limit(dynalite: Endpoints) -> None:
    """Writes round up to 1 KB, reads to 4 KB, up to an item of exactly 400 KB (400 write units, 100 read units);
    an overwrite is billed at the larger item; a read of no item costs as a small one."""
    client = _client(dynalite)
    _table(dynalite, "crosscheck-sizes")
    for size in (KB - 1, 2 * KB, 5 * KB + 1, 100 * KB, 399 * KB + 1, MAX_ITEM_BYTES):
        _put_and_read(client, "crosscheck-sizes", _padded({"pk": {"S": "k"}, "sk": {"S": str(size)}}, size))
    # The largest item overwritten by a small one, then the small one again: 400 units, then 1.
    for _ in range(2):
        _put_and_read(client, "crosscheck-sizes", _padded({"pk": {"S": "k"}, "sk": {"S": str(MAX_ITEM_BYTES)}}, 30))
    for consistent in (True, False):
        key = {"pk": {"S": "absent"}, "sk": {"S": "absent"}}
        body = {"TableName": "crosscheck-sizes", "Key": key, "ConsistentRead": consistent}
        client.call("GetItem", json.dumps(body).encode())
    rows = _compare(client.seen)
    assert [row for row in rows if row[1] != row[2]] == []
    assert [row[1] for row in rows if row[0] == "PutItem"] == [1, 2, 6, 100, 400, 400, 400, 1]
    assert rows[-2:] == [("GetItem", 1, 1), ("GetItem", 0.5, 0.5)]


def test_the_per_record_baselines_requests_are_billed_as_dynalite_reports(dynalite: Endpoints) -> None:
    """The benchmark's other column: Powertools' idempotency writes (a conditional PutItem, then an UpdateItem
    that grows the item), run by the benchmark's own code against dynalite."""
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=dynalite.dynamodb,
        region_name="us-east-1",
        aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
    )
    seen: list[Seen] = []
    pending: list[dict[str, Any]] = []

    def ask(params: dict[str, Any], **_: Any) -> None:
        params["ReturnConsumedCapacity"] = "TOTAL"
        pending.append(dict(params))

    def keep(parsed: dict[str, Any], model: Any, **_: Any) -> None:
        seen.append((model.name, pending.pop(0), parsed))

    for operation in ("PutItem", "UpdateItem"):
        dynamodb.meta.events.register(f"provide-client-params.dynamodb.{operation}", ask)
        dynamodb.meta.events.register(f"after-call.dynamodb.{operation}", keep)
    _per_record(dynamodb, "crosscheck-idempotency", 20)
    assert [op for op, _, _ in seen] == ["PutItem", "UpdateItem"] * 20
    rows = _compare(seen)
    assert [row for row in rows if row[1] != row[2]] == []


def test_non_ascii_strings_are_where_dynalite_departs_from_aws(dynalite: Endpoints) -> None:
    """AWS sizes a string by its UTF-8 bytes ("Item sizes and formats"); dynalite by its UTF-16 code units. An item
    of 1,025 UTF-8 bytes whose 'é's are 1 unit each in UTF-16: the model bills 2 units as AWS documents, dynalite 1.
    copier's own items are ASCII (IDs, hosts, settings), so its figures are not affected."""
    client = _client(dynalite)
    _table(dynalite, "crosscheck-utf8")
    item = _padded({"pk": {"S": "k"}, "sk": {"S": "s"}, "name": {"S": "é" * 100}, "emoji": {"S": "\U0001f600"}}, KB + 1)
    _put_and_read(client, "crosscheck-utf8", item)
    rows = _compare(client.seen)
    assert rows[0] == ("PutItem", 2, 1), "100 'é' are 200 bytes in UTF-8, 100 units in UTF-16; the emoji 4 and 2"
    assert [row for row in rows[1:] if row[1] != row[2]] == [], "the reads stay inside 4 KB either way"


METERED = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "GetItem", "BatchGetItem", "Query"}


class _Meter(BaseHTTPRequestHandler):
    """Forwards a DynamoDB request to dynalite asking for its consumed capacity; keeps the request and answer."""

    protocol_version = "HTTP/1.1"  # keep-alive, as copier's client expects
    upstream: str
    seen: list[tuple[str, bytes, dict[str, Any] | None]]  # target, the body copier sent, the answer (None: an error)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        sent = self.rfile.read(int(self.headers["Content-Length"]))
        target = self.headers.get("X-Amz-Target", "")
        body = sent
        if target.rpartition(".")[2] in METERED:  # dynalite reads the Authorization header's form, not its signature
            body = json.dumps({**json.loads(sent), "ReturnConsumedCapacity": "TOTAL"}).encode()
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("content-length", "host", "connection")}
        parts = urlsplit(self.upstream)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
        try:
            connection.request("POST", "/", body, headers)
            answer = connection.getresponse()
            data = answer.read()
        finally:
            connection.close()
        if target.rpartition(".")[2] in METERED:
            self.seen.append((target, sent, json.loads(data) if answer.status == 200 else None))
        self.send_response(answer.status)
        for name, value in answer.getheaders():
            if name.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@contextlib.contextmanager
def _metering(upstream: str) -> Iterator[tuple[str, list[tuple[str, bytes, dict[str, Any] | None]]]]:
    seen: list[tuple[str, bytes, dict[str, Any] | None]] = []
    handler = type("Meter", (_Meter,), {"upstream": upstream, "seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_copier_process_run_is_billed_as_dynalite_reports(dynalite: Endpoints, tmp_path: Path) -> None:
    """The same run, not the same kinds of request: a real ``copier process`` takes a shard over and forwards
    deliveries of 1, 50 and 500 events on kinesis-mock, its state table on dynalite behind a proxy that asks for
    the consumed capacity of each request. The units of each request agree with the model's, and the
    benchmark's own count over those requests (:func:`billed_writes`, which copier.bench.cost sums) is the sum
    of dynalite's write units."""
    kinesis = boto_client("kinesis", dynalite.kinesis)
    create_stream(kinesis, "bill-staging", 1)
    create_stream(kinesis, "bill-target", 2)
    props = tmp_path / "copier.properties"
    names = (dynalite.kinesis, "bill-staging", "bill-target", "bill-state")
    write_properties(props, *names, dynamodb_endpoint=dynalite.dynamodb)
    subprocess.run(
        [COPIER, "init", "--properties", str(props)], check=True, capture_output=True, env=os.environ | DUMMY_ENV
    )
    with _metering(dynalite.dynamodb) as (url, seen):
        write_properties(props, *names, dynamodb_endpoint=dynalite.dynamodb, logLevel="INFO", stateTableEndpoint=url)
        proc = Processor(props, "billed")
        try:
            proc.initialize("shardId-000000000000")
            seq = 1
            for size in (1, 50, 500):
                proc.process([event(seq + i, str(uuid.UUID(int=seq + i)), body="x" * 150) for i in range(size)])
                seq += size
        finally:
            proc.kill()
    assert seen, "the processor's state requests went through the proxy"
    requests = [(target.rpartition(".")[2], json.loads(sent), answer) for target, sent, answer in seen]
    rows = _compare([(op, {**body, "ReturnConsumedCapacity": "TOTAL"}, answer) for op, body, answer in requests])
    assert [row for row in rows if row[2] is not None and row[1] != row[2]] == []
    lines = [json.dumps({"headers": {"X-Amz-Target": target}, "body": sent.decode()}) for target, sent, _ in seen]
    writes = [row for row in rows if row[0] not in READS]
    assert sum(w.units for w in billed_writes(lines)) == sum(reported or 0 for _, _, reported in writes)
    assert {row[0] for row in writes} == {"PutItem"} and len(writes) >= 6, rows
