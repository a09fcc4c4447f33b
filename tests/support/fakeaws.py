"""A fake AWS JSON endpoint and a fake instance metadata service on 127.0.0.1, for driving botocore and the lean
client side by side: each answers what the test scripts and records what it was sent."""

from __future__ import annotations

import http.server
import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.config
import botocore.session
import pytest

from tests.support.serving import serving

__all__ = [
    "FakeAws",
    "Reply",
    "botocore_client",
    "clean_aws_env",
    "fake_aws",
    "json_reply",
    "raw_reply",
]

Reply = Callable[[http.server.BaseHTTPRequestHandler], None]
PUT_OK = {"FailedRecordCount": 0, "Records": [{"SequenceNumber": "1", "ShardId": "shardId-000000000000"}]}


def raw_reply(status: int, body: bytes, headers: dict[str, str] | None = None, close: bool = False) -> Reply:
    """An answer of exactly these bytes (``close``: the connection closed after it, without saying so)."""

    def reply(handler: http.server.BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **(headers or {})}.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(body)
        if close:
            handler.close_connection = True

    return reply


def json_reply(status: int, doc: Any, headers: dict[str, str] | None = None, close: bool = False) -> Reply:
    return raw_reply(status, json.dumps(doc).encode(), headers, close)


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    peer: tuple[Any, ...]


@dataclass
class FakeAws:
    """Answers each POST with the next scripted reply (a 200 of :data:`PUT_OK` when none is left)."""

    url: str = ""
    replies: list[Reply] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)  # set once a connection was closed by it

    @property
    def connections(self) -> int:
        return len({r.peer for r in self.received})


@contextmanager
def fake_aws(tls: ssl.SSLContext | None = None) -> Iterator[FakeAws]:
    """The endpoint, over TLS with ``tls`` (a server context)."""
    fake = FakeAws()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            fake.received.append(Received(dict(self.headers.items()), body, self.client_address))
            (fake.replies.pop(0) if fake.replies else json_reply(200, PUT_OK))(self)

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True

        def shutdown_request(self, request: Any) -> None:
            super().shutdown_request(request)
            fake.closed.set()

    server = Server(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    with serving(server, poll_s=0.02):
        fake.url = f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}/"
        yield fake


def clean_aws_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """No AWS setting of the test run's or the machine's (keys, CA bundles, proxies, files): each test sets
    its own."""
    import os

    for name in list(os.environ):
        upper = name.upper()
        if upper.startswith(("AWS_", "BOTO_")) or upper.endswith("_PROXY") or upper in ("REQUESTS_CA_BUNDLE",):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(home))


def botocore_client(service: str, url: str, session: botocore.session.Session | None = None, **config: Any) -> Any:
    """A botocore client of fixed keys against ``url``, one attempt per call (copier's put client)."""
    session = session or botocore.session.Session()
    settings = botocore.config.Config(**{"retries": {"mode": "standard", "total_max_attempts": 1}, **config})
    return session.create_client(
        service,
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=settings,
    )


def free_address() -> tuple[str, int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return "127.0.0.1", int(probe.getsockname()[1])
