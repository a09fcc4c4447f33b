"""Small servers that tests stand in for services the local backend does not serve (bound to 127.0.0.1)."""

from __future__ import annotations

import http.client
import http.server
import json
import socketserver
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

S = TypeVar("S", bound=socketserver.BaseServer)


@contextmanager
def serving(server: S, poll_s: float = 0.5) -> Iterator[S]:
    """Serve from a daemon thread, looking for a shutdown every ``poll_s`` (what stopping it waits at most);
    shut down and close the socket afterwards."""
    thread = threading.Thread(target=server.serve_forever, args=(poll_s,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _Front(http.server.BaseHTTPRequestHandler):
    """Forwards each request to ``server.backend``, except the operations in ``server.refused``, which it answers
    400 with ``server.code`` (UnknownOperationException: as an endpoint without them does)."""

    server: RefusingFront

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        operation = self.headers.get("X-Amz-Target", "").rpartition(".")[2]
        self.server.calls[operation] += 1
        if operation in self.server.refused:
            self.server.seen.append(operation)
            answer = json.dumps({"__type": f"com.amazon.coral.service#{self.server.code}"}).encode()
            self._reply(400, [("Content-Type", "application/x-amz-json-1.0")], answer)
            return
        backend = http.client.HTTPConnection(self.server.backend, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            backend.request("POST", self.path, body=body, headers=headers)
            response = backend.getresponse()
            keep = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            self._reply(response.status, keep, response.read())
        finally:
            backend.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        """Quiet: the test says what matters."""


_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class RefusingFront(http.server.ThreadingHTTPServer):
    """An HTTP front on 127.0.0.1 for the local backend (``host:port``) that refuses some operations, as an
    endpoint that does not have them does, or with ``code`` (``LimitExceededException``: a throttle the backend
    never answers); ``seen``: the refused calls, in order; ``calls``: every call, by operation."""

    daemon_threads = True

    def __init__(self, backend: str, refused: set[str], code: str = "UnknownOperationException") -> None:
        super().__init__(("127.0.0.1", 0), _Front)
        self.backend = backend
        self.refused = refused
        self.code = code
        self.seen: list[str] = []
        self.calls: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class EmfAgent(socketserver.ThreadingTCPServer):
    """The CloudWatch agent's EMF listener (not served by the local backend): keeps each line it receives."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.lines: list[str] = []
        server = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    server.lines.append(line.decode())

        super().__init__(("127.0.0.1", 0), Handler)
