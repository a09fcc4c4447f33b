"""A fault-injecting HTTP proxy between the copier and the local backend.

The copier's own AWS calls (``copier.targetEndpoint`` for the target and
dead-letter streams, ``copier.stateTableEndpoint`` for the state table) are
pointed at this proxy; the KCL's calls go straight to the backend. A
DynamoDB call goes on to the backend's DynamoDB endpoint, any other to its
Kinesis one (moto serves both on one port; the independent backend,
kinesis-mock and dynalite, on two). Every
request is classified (a put to the target, a read of the target, a state
table write or read) and the fault windows active at that moment decide,
with the seed's random generator, what happens to it:

* ``put_partial``: some entries of a PutRecords fail with
  ``ProvisionedThroughputExceededException`` or ``InternalFailure`` (they
  are removed from the request before it is forwarded, as Kinesis stores no
  failed entry, and their error codes are put back in the answer);
* ``put_throttle``: the whole PutRecords is refused (400), nothing stored;
* ``put_timeout``: the request is held past the copier's put timeout and
  dropped, nothing stored;
* ``put_lost_response``: the request is applied, then the connection is
  dropped without an answer (the ambiguous put copier must verify);
* ``read_throttle``: a GetRecords or ListShards of the target is refused (400);
* ``state_throttle``: a state table request is refused (400 throttling);
* ``state_5xx``: a state table request answers 500, either before it is
  applied or after (a write that landed but looks failed);
* ``state_outage``: the state table is unreachable (connections dropped).

With a :class:`copier.chaos.throttle.ShardThrottle` (:attr:`FaultProxy.throttle`,
the ``limits`` profile), every Kinesis call through the proxy also meets
Kinesis' per-shard limits: a PutRecords entry over its shard's write limit
fails alone with ``ProvisionedThroughputExceededException``, a GetRecords
over its shard's read limit is refused (400) with that error.

Every PutRecords it receives is also kept (:attr:`FaultProxy.puts`): when it
arrived, its stream, the event IDs of its entries, the fault it met, and how
long the backend took to answer it when it was forwarded. A failed seed's
extra copies are traced to the requests that carried them, and a backend
slower than the copier's put timeout is seen for what it is: the protocol
bounds how long a put received may take to become readable (the put
timeout, docs/protocol.md "Assumptions"); a local backend on a loaded
machine that answers later breaks that bound, not the copier.

moto cannot produce any of these; that is why they are injected here. The
proxy binds 127.0.0.1 only and counts what it injected, by kind; it also
keeps when each fault was injected and, for a put, into which stream
(:attr:`FaultProxy.log`), so that the harness can reshard the target the
moment a target put becomes ambiguous (:meth:`FaultProxy.wait_for`).
"""

from __future__ import annotations

import http.client
import json
import random
import re
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from copier.chaos.putseen import PutSeen, event_ids
from copier.chaos.throttle import READ_REFUSED, ShardThrottle

__all__ = ["AMBIGUOUS_PUTS", "FAULT_KINDS", "FaultProxy", "FaultWindow", "Injection", "PutSeen"]

FAULT_KINDS = (
    "put_partial",
    "put_throttle",
    "put_timeout",
    "put_lost_response",
    "read_throttle",
    "state_throttle",
    "state_5xx",
    "state_outage",
)
AMBIGUOUS_PUTS = ("put_timeout", "put_lost_response")  # a put whose outcome the copier cannot know
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}
_ENTRY_CODES = ("ProvisionedThroughputExceededException", "InternalFailure")


@dataclass(frozen=True)
class FaultWindow:
    """A fault kind active from ``start`` to ``end`` (monotonic seconds), hitting each matching request
    with probability ``rate``; it stays open past ``end`` until it has injected once, so that a window
    that met no traffic (the copier was between owners) still happens. A put fault with a ``stream``
    hits only puts to that stream."""

    kind: str
    start: float
    end: float
    rate: float
    stream: str = ""


@dataclass(frozen=True)
class Injection:
    """One fault the proxy injected: when (monotonic seconds, as the request arrived), what, and for a put
    the stream it was for ("" otherwise)."""

    at: float
    kind: str
    stream: str


_STREAM_NAME = re.compile(rb'"StreamName"\s*:\s*"([^"]+)"')


def _stream_name(body: bytes) -> str:
    """The StreamName of a Kinesis request ("" if none): the one ``"StreamName":`` of its JSON body, as a key
    (inside a string, its quotes would be escaped). botocore writes it first, so the search stops early."""
    found = _STREAM_NAME.search(body)
    return found.group(1).decode() if found else ""


def _classify(target: str) -> str:
    """'put', 'read' (the target's Kinesis calls), 'state' (the state table), or 'other'."""
    service, _, operation = target.partition(".")
    if service.startswith("Kinesis"):
        return "put" if operation == "PutRecords" else "read"
    if service.startswith("DynamoDB"):
        return "state"
    return "other"


_APPLIES = {
    "put_partial": "put",
    "put_throttle": "put",
    "put_timeout": "put",
    "put_lost_response": "put",
    "read_throttle": "read",
    "state_throttle": "state",
    "state_5xx": "state",
    "state_outage": "state",
}


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


class FaultProxy:
    """The proxy server; see the module docstring. Use as a context manager."""

    def __init__(self, upstream: str, seed: int, hang_s: float, dynamodb_upstream: str | None = None) -> None:
        """``upstream``: the backend's Kinesis endpoint, and its DynamoDB one unless ``dynamodb_upstream`` is
        given (the independent backend serves each service on a port of its own)."""
        self.upstreams = {"kinesis": _host_port(upstream), "dynamodb": _host_port(dynamodb_upstream or upstream)}
        self.hang_s = hang_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._injected_cv = threading.Condition(self._lock)
        self._windows: list[FaultWindow] = []
        self._hits: Counter[FaultWindow] = Counter()
        self._added: list[FaultWindow] = []  # every window ever added (clear() closes them, they stay counted)
        self.injected: Counter[str] = Counter()
        self.log: list[Injection] = []  # every injection, in order
        self.cancelled = False  # set by cancel_waits: wait_for returns at once
        self.requests: Counter[str] = Counter()
        self.puts: list[PutSeen] = []  # every PutRecords received, kept as each is answered (or dropped)
        self.throttle: ShardThrottle | None = None  # the shard limits, when the profile enforces them
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, window: FaultWindow) -> None:
        """Open ``window``. One bound to a stream is the harness asking for a fault at a moment (a target reshard
        at an ambiguous put): it goes first, so that the plan's windows, which inject at most one fault a
        request, do not take every request it waits for."""
        with self._lock:
            self._added.append(window)
            if window.stream:
                self._windows.insert(0, window)
            else:
                self._windows.append(window)

    def idle_windows(self) -> list[FaultWindow]:
        """The windows added that injected nothing (the run ended before one met a request)."""
        with self._lock:
            return [w for w in self._added if not self._hits[w]]

    def clear(self) -> None:
        """No faults from now on (what was injected stays counted)."""
        with self._lock:
            self._windows.clear()

    def decide(self, kind_of_request: str, stream: str = "") -> str | None:
        """The fault to inject into a request of this class (to ``stream``, for a put) now, if any (one at a time)."""
        now = time.monotonic()
        with self._lock:
            self.requests[kind_of_request] += 1
            for window in self._windows:
                open_ = window.start <= now and (now < window.end or not self._hits[window])
                applies = _APPLIES[window.kind] == kind_of_request and window.stream in ("", stream)
                if open_ and applies and self._rng.random() < window.rate:
                    self._hits[window] += 1
                    self.injected[window.kind] += 1
                    self.log.append(Injection(now, window.kind, stream))
                    self._injected_cv.notify_all()
                    return window.kind
        return None

    def wait_for(self, kinds: Collection[str], stream: str, since: float, timeout_s: float) -> Injection | None:
        """The first injection of one of ``kinds`` into a put to ``stream`` at or after ``since`` (monotonic),
        waiting up to ``timeout_s`` for it; None if none came."""
        deadline = time.monotonic() + timeout_s
        with self._injected_cv:
            while True:
                for injection in self.log:
                    if injection.at >= since and injection.kind in kinds and injection.stream == stream:
                        return injection
                left = deadline - time.monotonic()
                if left <= 0 or self.cancelled:
                    return None
                self._injected_cv.wait(left)

    def cancel_waits(self) -> None:
        """End every :meth:`wait_for`, now and later (the run is over)."""
        with self._injected_cv:
            self.cancelled = True
            self._injected_cv.notify_all()

    def choose(self, count: int, rate: float) -> dict[int, str]:
        """Entries of a PutRecords to fail, with their error codes (at least one)."""
        with self._lock:
            failed = {i: self._rng.choice(_ENTRY_CODES) for i in range(count) if self._rng.random() < rate}
            if not failed and count:
                failed = {self._rng.randrange(count): self._rng.choice(_ENTRY_CODES)}
            return failed

    def saw_put(self, put: PutSeen) -> None:
        with self._lock:
            self.puts.append(put)

    def coin(self) -> bool:
        with self._lock:
            return self._rng.random() < 0.5

    def __enter__(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="chaos-proxy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(10)


class _Server(ThreadingHTTPServer):
    """The proxy's server. A client that goes away mid-request (a worker the schedule kills, a connection a
    client drops at its timeout) is part of the run, not a fault of the proxy: socketserver would print a
    traceback on the run's output for each; any other error is printed as it prints them."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no delayed-ACK stall between them
    owner: FaultProxy
    _upstream = threading.local()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass  # the proxy is quiet: what it injects is counted, not logged

    def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        received = time.monotonic()
        target = self.headers.get("X-Amz-Target", "")
        kind = _classify(target)
        stream = _stream_name(body) if kind == "put" else ""
        fault = self.owner.decide(kind, stream)
        self._backend_s: float | None = None
        self._refused: tuple[int, ...] = ()
        try:
            if fault is None and self.owner.throttle is not None and kind in ("put", "read"):
                self._limited(self.owner.throttle, target.partition(".")[2], body)
            else:
                self._serve(fault, body)
        except (OSError, http.client.HTTPException):
            self.close_connection = True
        finally:
            if target.endswith(".PutRecords"):
                self.owner.saw_put(PutSeen(received, stream, event_ids(body), fault, self._backend_s, self._refused))

    def _limited(self, throttle: ShardThrottle, operation: str, body: bytes) -> None:
        """Serve a Kinesis call within the shard limits (see the module docstring)."""
        request = json.loads(body)
        if operation == "PutRecords":
            refused = throttle.put_refusals(request)
            if refused:
                return self._partial(body, refused)
        elif operation == "GetRecords":
            message = throttle.read_refusal(request)
            if message is not None:
                return self._error(400, READ_REFUSED, message)
        status, headers, answer = self._forward(body)
        if status == 200 and operation in ("GetShardIterator", "GetRecords"):
            throttle.answered(operation, request, json.loads(answer))
        self._reply(status, headers, answer)

    def _serve(self, fault: str | None, body: bytes) -> None:
        if fault in ("put_throttle", "read_throttle", "state_throttle"):
            code = (
                "ThrottlingException"
                if fault == "state_throttle" and self.owner.coin()
                else ("ProvisionedThroughputExceededException")
            )
            return self._error(400, code)
        if fault == "state_outage":
            return self._drop()
        if fault == "put_timeout":
            time.sleep(self.owner.hang_s)
            return self._drop()
        if fault == "state_5xx" and self.owner.coin():
            return self._error(500, "InternalServerError")  # before it is applied
        if fault == "put_partial":
            failed = self.owner.choose(len(json.loads(body)["Records"]), 0.3)
            return self._partial(body, {i: (code, "injected by the chaos proxy") for i, code in failed.items()})
        status, headers, answer = self._forward(body)
        if fault == "put_lost_response":
            return self._drop()  # applied, and the answer never arrives
        if fault == "state_5xx":
            return self._error(500, "InternalServerError")  # applied, but it looks failed
        self._reply(status, headers, answer)

    def _partial(self, body: bytes, failed: dict[int, tuple[str, str]]) -> None:
        """Forward a PutRecords without the entries ``failed`` names (index -> error code, message), and answer
        as Kinesis does for a partly failed one: 200, FailedRecordCount, each failed entry's code and message."""
        request = json.loads(body)
        records = request["Records"]
        self._refused = tuple(sorted(failed))
        request["Records"] = [r for i, r in enumerate(records) if i not in failed]
        landed: list[dict[str, Any]] = []
        headers: list[tuple[str, str]] = [("Content-Type", "application/x-amz-json-1.1")]
        if request["Records"]:
            status, headers, answer = self._forward(json.dumps(request).encode())
            if status != 200:
                return self._reply(status, headers, answer)
            landed = json.loads(answer)["Records"]
        out = iter(landed)
        results = [
            {"ErrorCode": failed[i][0], "ErrorMessage": failed[i][1]} if i in failed else next(out)
            for i in range(len(records))
        ]
        answer = json.dumps({"FailedRecordCount": len(failed), "Records": results}).encode()
        self._reply(200, headers, answer)

    def _service(self) -> str:
        """The upstream this request goes to: DynamoDB's for a DynamoDB call, Kinesis' otherwise."""
        return "dynamodb" if self.headers.get("X-Amz-Target", "").startswith("DynamoDB") else "kinesis"

    def _connection(self) -> http.client.HTTPConnection:
        """This thread's pooled connection to the request's upstream."""
        pool: dict[str, http.client.HTTPConnection] = self._upstream.__dict__.setdefault("pool", {})
        service = self._service()
        if service not in pool:
            host, port = self.owner.upstreams[service]
            pool[service] = http.client.HTTPConnection(host, port, timeout=60)
        return pool[service]

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """The backend's answer to ``body``; how long it took is kept for the request (:class:`PutSeen`)."""
        started = time.monotonic()
        try:
            return self._forward_once(body)
        finally:
            self._backend_s = time.monotonic() - started

    def _forward_once(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """Forward ``body`` and read the backend's answer.

        A PutRecords goes on a connection of its own and is never sent twice: a failure after its bytes left
        may come after the backend applied it, and a second send would store its records twice while the copier
        sees one answer (a duplicate no verification can explain; measured with an upstream that applies a
        request and closes without answering). The failure reaches the copier as a connection closed without
        an answer, an ambiguous put it verifies. Any other call may go again, once, on a new connection, when
        the pooled one fails (the backend closed it while idle)."""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["Content-Length"] = str(len(body))
        if self.headers.get("X-Amz-Target", "").endswith(".PutRecords"):
            host, port = self.owner.upstreams[self._service()]
            connection = http.client.HTTPConnection(host, port, timeout=60)
            try:
                return self._exchange(connection, body, headers)
            finally:
                connection.close()
        for attempt in (1, 2):
            connection = self._connection()
            try:
                return self._exchange(connection, body, headers)
            except (OSError, http.client.HTTPException):
                connection.close()
                self._upstream.pool.pop(self._service(), None)
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def _exchange(
        self, connection: http.client.HTTPConnection, body: bytes, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection.request("POST", self.path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheaders(), response.read()

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str, message: str = "injected by the chaos proxy") -> None:
        body = json.dumps({"__type": code, "message": message}).encode()
        self._reply(status, [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-ErrorType", code)], body)

    def _drop(self) -> None:
        """Close the connection without an answer."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
