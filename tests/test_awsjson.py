"""The lean JSON client on the wire: the Host it signs is the Host it sends, a server's ``Connection: close``
does not stretch the read timeout, and each failure lands in the class copier decides on."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from copier.adapters.awsauth import Credentials, StaticCredentials, host_header, sign
from copier.adapters.awsjson import ConditionFailed, JsonClient, Unanswered, Unsent
from copier.adapters.leankinesis import READ_ATTEMPTS, LeanKinesis
from copier.core.errors import AwsError, FatalAwsError, TransientAwsError

CREDENTIALS = StaticCredentials(Credentials("AKIDEXAMPLE", "secret"))
Reply = Callable[[http.server.BaseHTTPRequestHandler], None]


def _json(status: int, doc: dict[str, Any], close: bool = False) -> Reply:
    def reply(handler: http.server.BaseHTTPRequestHandler) -> None:
        body = json.dumps(doc).encode()
        handler.send_response(status)
        handler.send_header("Content-Length", str(len(body)))
        if close:
            handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(body)
        if close:
            handler.close_connection = True

    return reply


class _Server:
    """An HTTP/1.1 server on loopback answering each POST with the next reply given; records every request."""

    def __init__(self, family: socket.AddressFamily = socket.AF_INET) -> None:
        self.replies: list[Reply] = []
        self.requests: list[dict[str, str]] = []
        self.connections: set[tuple[Any, ...]] = set()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                server.requests.append(dict(self.headers.items()))
                server.connections.add(self.client_address)
                server.replies.pop(0)(self)

        class Http(http.server.ThreadingHTTPServer):
            address_family = family

        self.httpd = Http(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0), Handler)
        port = self.httpd.server_address[1]
        self.url = f"http://[::1]:{port}/" if family == socket.AF_INET6 else f"http://127.0.0.1:{port}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[_Server]:
    running = _Server()
    yield running
    running.stop()


def _client(url: str, connect_timeout: float = 5.0, read_timeout: float = 5.0) -> JsonClient:
    return JsonClient("kinesis", "us-east-1", url, CREDENTIALS, connect_timeout, read_timeout)


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("https://kinesis.us-east-1.amazonaws.com/", "kinesis.us-east-1.amazonaws.com"),
        ("https://kinesis.us-east-1.amazonaws.com:443/", "kinesis.us-east-1.amazonaws.com"),
        ("http://127.0.0.1:80/", "127.0.0.1"),
        ("http://127.0.0.1:4566/", "127.0.0.1:4566"),
        ("https://user:pw@vpce.example:8443/", "vpce.example:8443"),
        ("http://[::1]:4566/", "[::1]:4566"),
        ("https://[fd00:ec2::254]/", "[fd00:ec2::254]"),
        ("https://[fd00:ec2::254]:443/", "[fd00:ec2::254]"),
    ],
)
def test_the_host_signed_is_the_host_sent(url: str, host: str) -> None:
    """An IPv6 endpoint keeps its brackets, a default port is dropped, userinfo never reaches the header."""
    assert host_header(url) == host
    headers = sign(CREDENTIALS.get_frozen_credentials(), "kinesis", "us-east-1", url, {}, b"{}")
    assert headers["Host"] == host
    assert "host;" in headers["Authorization"].split("SignedHeaders=")[1]


@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6], ids=["ipv4", "ipv6"])
def test_the_request_carries_exactly_the_signed_host(family: socket.AddressFamily) -> None:
    running = _Server(family)
    try:
        running.replies.append(_json(200, {"ok": 1}))
        assert _client(running.url).call("ListShards", b"{}") == {"ok": 1}
        sent = running.requests[0]
        assert sent["Host"] == host_header(running.url)
        assert list(sent).count("Host") == 1, "one Host header, not http.client's beside copier's"
    finally:
        running.stop()


def test_a_connection_the_server_closed_is_replaced_and_keeps_the_read_timeout(server: _Server) -> None:
    """After ``Connection: close`` the next call opens a new connection with the read timeout on it: a slow
    answer is Unanswered after read_timeout, not awaited for the (longer) connect timeout."""
    server.replies.append(_json(200, {"first": 1}, close=True))

    def slow(handler: http.server.BaseHTTPRequestHandler) -> None:
        time.sleep(2.0)
        _json(200, {"late": 1})(handler)

    server.replies.append(slow)
    client = _client(server.url, connect_timeout=10.0, read_timeout=0.3)
    assert client.call("ListShards", b"{}") == {"first": 1}
    started = time.monotonic()
    with pytest.raises(Unanswered):
        client.call("ListShards", b"{}")
    assert time.monotonic() - started < 1.5, "waited past the read timeout"
    assert len(server.connections) == 2


def test_a_kept_alive_connection_is_reused(server: _Server) -> None:
    server.replies += [_json(200, {"n": 1}), _json(200, {"n": 2})]
    client = _client(server.url)
    assert [client.call("ListShards", b"{}")["n"] for _ in range(2)] == [1, 2]
    assert len(server.connections) == 1


def test_each_failure_is_classed_for_the_caller(server: _Server) -> None:
    client = _client(server.url)
    cases: list[tuple[int, str, type[AwsError]]] = [
        (500, "InternalFailure", Unanswered),
        (202, "Accepted", Unanswered),  # neither a success nor a refusal (a proxy's): its outcome is unknown
        (307, "Redirect", Unanswered),
        (400, "ConditionalCheckFailedException", ConditionFailed),
        (400, "ResourceNotFoundException", FatalAwsError),
        (400, "ProvisionedThroughputExceededException", TransientAwsError),
    ]
    for status, code, kind in cases:
        server.replies.append(_json(status, {"__type": f"com.amazonaws#{code}", "message": "no"}))
        with pytest.raises(kind) as caught:
            client.call("PutRecords", b"{}")
        assert caught.value.code == code
    with socket.socket() as probe:  # a port nothing listens on: refused, nothing sent
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}/"
    with pytest.raises(Unsent):
        _client(closed).call("PutRecords", b"{}")


class _Scripted:
    """A JsonClient stand-in raising the errors given, then answering: the retry decisions without a network."""

    def __init__(self, errors: list[AwsError]) -> None:
        self.errors = errors
        self.calls = 0

    def call(self, operation: str, body: bytes) -> dict[str, Any]:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return {"Records": [], "NextShardIterator": "next"}


@pytest.mark.parametrize(
    "error",
    [
        Unsent("GetRecords", "ConnectionRefusedError", "refused"),
        Unanswered("GetRecords", "InternalFailure", "5xx"),
        TransientAwsError("GetRecords", "ProvisionedThroughputExceededException", "slow down"),
    ],
    ids=["unsent", "unanswered", "throttled"],
)
def test_reads_retry_what_botocore_retries(error: AwsError) -> None:
    scripted = _Scripted([error] * (READ_ATTEMPTS - 1))
    reads = LeanKinesis(scripted, sleep=lambda s: None)  # type: ignore[arg-type]
    assert reads.get_records(ShardIterator="it")["NextShardIterator"] == "next"
    assert scripted.calls == READ_ATTEMPTS


def test_an_expired_iterator_goes_to_the_caller_at_once() -> None:
    """The same expired iterator sent again can only fail again: the caller gets a new one."""
    scripted = _Scripted([TransientAwsError("GetRecords", "ExpiredIteratorException", "expired")])
    reads = LeanKinesis(scripted, sleep=lambda s: None)  # type: ignore[arg-type]
    with pytest.raises(TransientAwsError, match="ExpiredIteratorException"):
        reads.get_records(ShardIterator="old")
    assert scripted.calls == 1
