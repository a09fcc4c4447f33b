"""The lean JSON client beside botocore, the reference, on the same local server: a connection the server closed
while idle, error codes with a suffix, answers that cannot be read, DynamoDB's CRC32, NO_PROXY and the CA bundle
of the config file. In each case the lean client does what botocore does, or something safer, and raises only
copier errors."""

from __future__ import annotations

import base64
import datetime as dt
import json
import select
import ssl
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import botocore.session
import pytest

from copier.adapters.awsauth import Credentials, StaticCredentials
from copier.adapters.awsjson import ConditionFailed, JsonClient, Unanswered, Unreadable, usable
from copier.adapters.botokinesis import put_records
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.leankinesis import LeanKinesis
from copier.adapters.leanstate import LeanStateStore
from copier.core.config import load_config
from copier.core.errors import AmbiguousPutError, AwsError, FatalAwsError, TransientAwsError
from copier.core.state import ShardState
from tests.support.fakeaws import FakeAws, botocore_client, clean_aws_env, fake_aws, json_reply, raw_reply
from tests.support.props import write_properties

KEYS = StaticCredentials(Credentials("AKIDEXAMPLE", "secret"))
ENTRY = [("pk", b'{"eventId": "1"}', None)]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_aws_env(monkeypatch, tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeAws]:
    with fake_aws() as running:
        yield running


def _lean(url: str, service: str = "kinesis") -> JsonClient:
    return JsonClient(service, "us-east-1", url, KEYS, 5.0, 5.0)


def _put_body() -> bytes:
    return json.dumps({"StreamName": "target", "Records": [{"Data": "eA==", "PartitionKey": "pk"}]}).encode()


# -- a connection the server closed while idle (item 8) ------------------------------------------------------------


def test_a_connection_the_server_closed_while_idle_is_not_written_to(fake: FakeAws) -> None:
    """The server closes a kept-alive connection without a word (its idle timeout): botocore opens a new one and
    the put succeeds; so does the lean client: no unknown outcome, no verification read."""
    reference = botocore_client("kinesis", fake.url)
    for client in ("botocore", "lean"):
        fake.received.clear()
        fake.closed.clear()
        fake.replies.append(json_reply(200, {"Records": [{"SequenceNumber": "1"}]}, close=True))
        lean = _lean(fake.url)
        if client == "botocore":
            assert put_records(reference, "target", ENTRY) == [None]
            fake.closed.wait(5)
            assert put_records(reference, "target", ENTRY) == [None]
        else:
            lean.call("PutRecords", _put_body())
            fake.closed.wait(5)
            assert lean.wire._sock is not None
            select.select([lean.wire._sock], [], [], 5)  # the server's FIN has reached this side
            assert lean.call("PutRecords", _put_body())["Records"]
            assert lean.wire.opened == 2
        assert len(fake.received) == 2 and fake.connections == 2, client


# -- error codes (item 11) -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "code", "expected"),
    [
        ("ValidationException:http://internal.amazon.com/coral/validate/", "ValidationException", FatalAwsError),
        ("com.amazonaws.kinesis#ResourceNotFoundException:extra", "ResourceNotFoundException", FatalAwsError),
        ("aws#ProvisionedThroughputExceededException", "ProvisionedThroughputExceededException", TransientAwsError),
        ("ConditionalCheckFailedException:detail", "ConditionalCheckFailedException", ConditionFailed),
    ],
)
def test_an_error_code_is_read_as_botocore_reads_it(fake: FakeAws, kind: str, code: str, expected: type) -> None:
    """The part after '#' and before ':' (botocore's parser): a ValidationException with a suffix is fatal, not
    retried forever."""
    fake.replies.append(json_reply(400, {"__type": kind, "message": "no"}))
    with pytest.raises(botocore.exceptions.ClientError) as reference:
        botocore_client("kinesis", fake.url).put_records(StreamName="t", Records=[{"PartitionKey": "k", "Data": b"x"}])
    assert reference.value.response["Error"]["Code"] == code
    fake.replies.append(json_reply(400, {"__type": kind, "message": "no"}))
    with pytest.raises(expected) as caught:
        _lean(fake.url).call("PutRecords", _put_body())
    assert caught.value.code == code and type(caught.value) is expected


# -- answers that cannot be read (item 10) -------------------------------------------------------------------------

NOT_AN_OBJECT = {
    "not json": b"<html>busy</html>",
    "empty": b"",
    "a list": b"[1, 2]",
    "a string": b'"ok"',
    "null": b"null",
    "not utf-8": b"\xff\xfe{",
    "deep": b"[" * 100_000,
}
PUT_SHAPES = {
    "Records missing": {"FailedRecordCount": 0},
    "Records not a list": {"Records": "x"},
    "an entry not an object": {"Records": [1]},
    "too few entries": {"Records": []},
    "an ErrorCode not a string": {"Records": [{"ErrorCode": 5}]},
    "neither landed nor failed": {"Records": [{}]},
}


@pytest.mark.parametrize("body", [*NOT_AN_OBJECT.values(), *(json.dumps(d).encode() for d in PUT_SHAPES.values())])
def test_a_put_answer_that_cannot_be_read_is_an_unknown_outcome(fake: FakeAws, tmp_path: Path, body: bytes) -> None:
    """A 200 that does not say what landed: the put may have applied, so it is verified (AmbiguousPutError), on
    the lean path and on botocore's (whose parser raises AttributeError, RecursionError... on some of them)."""
    config = load_config(write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table"))
    fake.replies.append(raw_reply(200, body))
    with pytest.raises(AmbiguousPutError):
        KinesisStreams(config, lean=KEYS).put_records("target", ENTRY)
    fake.replies.append(raw_reply(200, body))
    with pytest.raises(AmbiguousPutError):
        put_records(botocore_client("kinesis", fake.url), "target", ENTRY)


READ_SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "GetRecords: Records not a list": ("get_records", {"Records": "x"}),
    "GetRecords: a record not an object": ("get_records", {"Records": [1]}),
    "GetRecords: Data not base64": (
        "get_records",
        {"Records": [{"SequenceNumber": "1", "Data": "!!", "PartitionKey": "k", "ApproximateArrivalTimestamp": 1}]},
    ),
    "GetRecords: no PartitionKey": (
        "get_records",
        {"Records": [{"SequenceNumber": "1", "Data": "eA==", "ApproximateArrivalTimestamp": 1}]},
    ),
    "GetRecords: a sequence number not a string": (
        "get_records",
        {"Records": [{"SequenceNumber": 1, "Data": "eA==", "PartitionKey": "k", "ApproximateArrivalTimestamp": 1}]},
    ),
    "GetRecords: a timestamp not a number": (
        "get_records",
        {"Records": [{"SequenceNumber": "1", "Data": "eA==", "PartitionKey": "k", "ApproximateArrivalTimestamp": "t"}]},
    ),
    "GetRecords: NextShardIterator not a string": ("get_records", {"Records": [], "NextShardIterator": 5}),
    "ListShards: Shards not a list": ("list_shards", {"Shards": {}}),
    "ListShards: a shard without a range": ("list_shards", {"Shards": [{"ShardId": "shardId-0"}]}),
    "ListShards: a range of words": (
        "list_shards",
        {"Shards": [{"ShardId": "s", "HashKeyRange": {"StartingHashKey": "a", "EndingHashKey": "b"}}]},
    ),
    "ListShards: NextToken not a string": ("list_shards", {"Shards": [], "NextToken": 1}),
    "DescribeStreamSummary: no summary": ("describe_stream_summary", {}),
    "DescribeStreamSummary: retention a string": (
        "describe_stream_summary",
        {"StreamDescriptionSummary": {"RetentionPeriodHours": "24"}},
    ),
    "GetShardIterator: an iterator not a string": ("get_shard_iterator", {"ShardIterator": 5}),
}


@pytest.mark.parametrize("case", list(READ_SHAPES))
def test_a_read_answer_that_cannot_be_read_is_a_transient_error(fake: FakeAws, case: str) -> None:
    """Every shape copier reads is checked where the answer arrives: retried as botocore retries, then a
    TransientAwsError (Unreadable), never a KeyError or TypeError far from the call."""
    method, doc = READ_SHAPES[case]
    fake.replies.extend(json_reply(200, doc) for _ in range(3))
    reads = LeanKinesis(_lean(fake.url), sleep=lambda s: None)
    with pytest.raises(Unreadable):
        getattr(reads, method)(StreamName="s")


@pytest.mark.parametrize("body", list(NOT_AN_OBJECT.values()))
def test_a_read_answer_not_an_object_is_a_transient_error(fake: FakeAws, body: bytes) -> None:
    fake.replies.extend(raw_reply(200, body) for _ in range(3))
    with pytest.raises(Unreadable):
        LeanKinesis(_lean(fake.url), sleep=lambda s: None).list_shards(StreamName="s")


def _store(fake: FakeAws, tmp_path: Path) -> LeanStateStore:
    config = load_config(write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table"))
    return LeanStateStore(config, _lean(fake.url, "dynamodb"), sleep=lambda s: None)


ITEMS: dict[str, dict[str, Any]] = {
    "Item not an object": {"Item": [1]},
    "an attribute of two types": {"Item": {"pk": {"S": "a", "N": "1"}}},
    "an attribute type copier does not write": {"Item": {"pk": {"SS": ["a"]}}},
    "a number that is not one": {"Item": {"pk": {"S": "a"}, "fmt": {"N": "2"}, "epoch": {"N": "x"}}},
    "binary not base64": {"Item": {"pk": {"S": "a"}, "fmt": {"N": "2"}, "redo": {"B": "abc"}}},
    "binary not a string": {"Item": {"pk": {"S": "a"}, "fmt": {"N": "2"}, "redo": {"B": 5}}},
}


@pytest.mark.parametrize("case", list(ITEMS))
def test_a_state_item_that_cannot_be_read_is_a_transient_error(fake: FakeAws, tmp_path: Path, case: str) -> None:
    store = _store(fake, tmp_path)
    fake.replies.append(json_reply(200, ITEMS[case]))
    with pytest.raises(TransientAwsError):
        store.get("staging/shardId-0")


@pytest.mark.parametrize(
    "page",
    [{"Items": 5}, {"Items": [{"sk": {"S": "batch#x"}}]}, {"Items": [{"sk": {"S": "b"}}]}, {"LastEvaluatedKey": 5}],
)
def test_a_batch_page_that_cannot_be_read_is_a_transient_error(fake: FakeAws, tmp_path: Path, page: Any) -> None:
    store = _store(fake, tmp_path)
    fake.replies.append(json_reply(200, page))
    with pytest.raises(TransientAwsError):
        list(store.batches("staging/shardId-0", 3))


@pytest.mark.parametrize("body", list(NOT_AN_OBJECT.values()))
def test_a_state_write_answered_unreadably_is_a_transient_error(fake: FakeAws, tmp_path: Path, body: bytes) -> None:
    """The write may have applied: retried, which its condition makes safe."""
    store = _store(fake, tmp_path)
    fake.replies.append(raw_reply(200, body))
    state = ShardState(epoch=1, owner="me", lease_until_ms=1, version=1)
    with pytest.raises(TransientAwsError):
        store.write("staging/shardId-0", state, ShardState(epoch=1, owner="me", lease_until_ms=2, version=2))


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, b"[1]", TransientAwsError),
        (400, b'{"__type": 5, "message": []}', TransientAwsError),
        (400, b"\xff", TransientAwsError),
        (500, b"[1]", Unanswered),
        (503, b"", Unanswered),
    ],
)
def test_an_error_answer_that_is_not_an_object_is_a_copier_error(
    fake: FakeAws, status: int, body: bytes, expected: type
) -> None:
    """botocore's parser raises AttributeError or TypeError on the first two (the reference is no help there)."""
    fake.replies.append(raw_reply(status, body))
    with pytest.raises(expected) as caught:
        _lean(fake.url).call("PutRecords", _put_body())
    assert caught.value.code == f"HTTP{status}"


# -- DynamoDB's CRC32 (item 11) ------------------------------------------------------------------------------------


def test_a_dynamodb_answer_whose_crc32_does_not_match_is_an_unreadable_answer(fake: FakeAws) -> None:
    """botocore retries such an answer, then returns the last one, damaged or not; the lean client raises a
    transient error at once (a state write is conditional: retrying it is safe). A matching CRC32 passes."""
    body = b'{"Item": {"pk": {"S": "a"}}}'
    for _ in range(3):
        fake.replies.append(raw_reply(200, body, {"x-amz-crc32": "1234"}))
    reference = botocore_client("dynamodb", fake.url, retries={"mode": "standard", "total_max_attempts": 3})
    reference.get_item(TableName="t", Key={"pk": {"S": "a"}})
    assert len(fake.received) == 3, "botocore: retried, and the last damaged answer returned"
    fake.replies.append(raw_reply(200, body, {"x-amz-crc32": "1234"}))
    with pytest.raises(Unreadable, match="CRC32Mismatch"):
        _lean(fake.url, "dynamodb").call("GetItem", b"{}")
    fake.replies.append(raw_reply(200, body, {"x-amz-crc32": "not a number"}))
    with pytest.raises(Unreadable):
        _lean(fake.url, "dynamodb").call("GetItem", b"{}")
    fake.replies.append(raw_reply(200, body, {"x-amz-crc32": str(zlib.crc32(body))}))
    assert _lean(fake.url, "dynamodb").call("GetItem", b"{}")["Item"]


# -- NO_PROXY (item 11) --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bypass", ["exact", "other port", "host only", "suffix"])
def test_no_proxy_is_matched_as_botocore_matches_it(
    fake: FakeAws, monkeypatch: pytest.MonkeyPatch, bypass: str
) -> None:
    """With a proxy set, botocore goes direct where NO_PROXY matches the URL's host:port (or host); the lean
    client is used exactly where botocore goes direct (a proxy it does not handle keeps botocore)."""
    port = fake.url.rstrip("/").rsplit(":", 1)[1]
    entry = {"exact": f"127.0.0.1:{port}", "other port": "127.0.0.1:1", "host only": "127.0.0.1", "suffix": ".0.1"}
    with fake_aws() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", entry[bypass])
        botocore_client("kinesis", fake.url).put_records(StreamName="t", Records=[{"PartitionKey": "k", "Data": b"x"}])
        direct = len(fake.received) == 1
        assert direct != (len(proxy.received) == 1)
        assert usable(fake.url) == direct
    assert direct == (bypass != "other port")


# -- TLS as botocore verifies it (item 9) --------------------------------------------------------------------------


def _tls_files(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a certificate for 127.0.0.1 it signed: (CA bundle, server certificate, server key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)

    def certificate(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            import ipaddress

            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("copier test CA", ca_key, "copier test CA", ca_key, True)
    server = certificate("127.0.0.1", server_key, "copier test CA", ca_key, False)
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    key_pem = server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    paths[2].write_bytes(key_pem)
    return paths


@pytest.fixture
def tls_fake(tmp_path: Path) -> Iterator[tuple[FakeAws, Path]]:
    """The fake endpoint over TLS, its certificate trusted only by a CA bundle of the test's own."""
    bundle, cert, key = _tls_files(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    with fake_aws(context) as running:
        yield running, bundle


def test_the_fast_put_client_verifies_tls_with_the_config_files_ca_bundle(
    tls_fake: tuple[FakeAws, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The config file names the CA bundle: botocore's client verifies with it, and so does the fast put client
    made from it (it failed every put before, retried forever)."""
    fake, bundle = tls_fake
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nca_bundle = {bundle}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    reference = botocore_client("kinesis", fake.url, session=botocore.session.Session())
    put_records(reference, "target", ENTRY)
    fast = JsonClient.for_botocore(reference, KEYS, 5.0, 5.0)
    assert fast is not None
    assert fast.call("PutRecords", _put_body())["Records"]
    assert len(fake.received) == 2

    monkeypatch.delenv("AWS_CONFIG_FILE")
    untrusting = botocore_client("kinesis", fake.url, session=botocore.session.Session())
    with pytest.raises(botocore.exceptions.SSLError):
        untrusting.put_records(StreamName="t", Records=[{"PartitionKey": "k", "Data": b"x"}])
    plain = JsonClient.for_botocore(untrusting, KEYS, 5.0, 5.0)
    assert plain is not None
    with pytest.raises(AwsError, match="CERTIFICATE_VERIFY_FAILED"):
        plain.call("PutRecords", _put_body())


@pytest.mark.parametrize("name", ["AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE"])
def test_the_lean_client_verifies_tls_with_the_environments_ca_bundle(
    tls_fake: tuple[FakeAws, Path], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    fake, bundle = tls_fake
    monkeypatch.setenv(name, str(bundle))
    botocore_client("kinesis", fake.url, session=botocore.session.Session()).put_records(
        StreamName="t", Records=[{"PartitionKey": "k", "Data": base64.b64decode("eA==")}]
    )
    assert _lean(fake.url).call("PutRecords", _put_body())["Records"]
    assert len(fake.received) == 2
