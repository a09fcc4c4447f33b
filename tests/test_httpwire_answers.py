"""The lean client reads every answer http.client reads, as http.client reads it: the plain answers AWS sends
(HTTP/1.1, one Content-Length) by itself, whatever pieces they arrive in, and any other kind (chunked, an
interim 100 status, HTTP/1.0) through http.client; a body cut short, or a connection closed before a whole
answer, is no answer."""

from __future__ import annotations

import http.client
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from copier.adapters import httpwire

REQUEST = httpwire.request_head({"Host": "127.0.0.1"}, 2), b"{}"


@dataclass
class _Scripted:
    """A server on 127.0.0.1 answering each request on one connection with its script: pieces of bytes sent
    one by one, 20 ms apart (so that the client reads them apart), then the connection closed if ``close``."""

    scripts: Sequence[Sequence[bytes]]
    close: bool = False
    listener: socket.socket = field(default_factory=socket.socket)
    connections: int = 0

    def __post_init__(self) -> None:
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        scripts = list(self.scripts)
        while scripts:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                while scripts:
                    if not _read_request(conn):
                        break
                    for piece in scripts.pop(0):
                        conn.sendall(piece)
                        time.sleep(0.02)
                    if self.close:
                        break

    def stop(self) -> None:
        self.listener.close()


def _read_request(conn: socket.socket) -> bool:
    """Read one request (a head and the 2-byte body REQUEST sends); False when the client closed instead (a
    reset too: a client closing with bytes of an answer unread resets the connection)."""
    data = b""
    while not data.endswith(b"\r\n\r\n{}"):
        try:
            chunk = conn.recv(65536)
        except OSError:
            return False
        if not chunk:
            return False
        data += chunk
    return True


def _exchange(server: _Scripted, wire: httpwire.Wire | None = None) -> httpwire.Answer:
    wire = wire or httpwire.Wire("127.0.0.1", server.port, None, 5.0)
    return wire.exchange(*REQUEST, deadline=time.monotonic() + 5)


def test_a_plain_answer_in_pieces_is_read_whole_with_its_headers_by_any_case() -> None:
    """Status line, headers and body split across reads (and a header split mid-line): the body is exactly
    Content-Length bytes; a header is found by any case; of a repeated one, the first (as email.message)."""
    answer = [
        b"HTTP/1.1 200 OK\r\nx-amz-crc32: 12",
        b"34\r\nDate: Fri, 27 Nov 2026 04:20:00 GMT\r\nX-Dup: first\r\nx-dup: second\r\n",
        b'Content-Length: 11\r\n\r\n{"a": ',
        b'"bc"}',
    ]
    server = _Scripted([answer])
    try:
        got = _exchange(server)
    finally:
        server.stop()
    assert (got.status, got.body) == (200, b'{"a": "bc"}')
    assert got.headers.get("X-AMZ-CRC32") == "1234"
    assert got.headers.get("date") == "Fri, 27 Nov 2026 04:20:00 GMT"
    assert got.headers.get("x-dup") == "first"
    assert got.headers.get("absent") is None


def test_a_kept_alive_connection_carries_answers_one_after_the_other_and_closes_when_told() -> None:
    """Two plain answers on one connection (bytes past a body's length are not part of it); the second says
    ``Connection: close``, so the third request opens a new connection."""
    first = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]
    second = [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 4\r\nConnection: Close\r\n\r\n", b'{"x"', b"}"]
    third = [b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"]
    server = _Scripted([first, second, third])
    wire = httpwire.Wire("127.0.0.1", server.port, None, 5.0)
    try:
        answers = [_exchange(server, wire) for _ in range(3)]
    finally:
        server.stop()
    assert [(a.status, a.body) for a in answers] == [(200, b"{}"), (400, b'{"x"'), (200, b"")]
    assert wire.opened == 2


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(
            [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kind: chunked\r\n\r\n", b"5\r\nhello\r\n0\r\n\r\n"],
            id="chunked",
        ),
        pytest.param(
            [b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 200 OK\r\nX-Kind: final\r\nContent-Length: 5\r\n\r\nhello"],
            id="interim-status",
        ),
        pytest.param([b"HTTP/1.0 200 OK\r\nX-Kind: old\r\n\r\nhello"], id="http-1.0-to-the-end"),
    ],
)
def test_answers_of_other_kinds_are_read_as_http_client_reads_them(answer: list[bytes]) -> None:
    """What AWS does not send but HTTP allows is left to http.client, with the bytes already read: the body and
    the headers come out the same."""
    server = _Scripted([answer], close=True)
    try:
        got = _exchange(server)
    finally:
        server.stop()
    assert (got.status, got.body) == (200, b"hello")
    assert got.headers.get("x-kind") in ("chunked", "final", "old")


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}"], id="body-cut-short"),
        pytest.param([], id="closed-before-answering"),
    ],
)
def test_a_connection_closed_before_a_whole_answer_is_no_answer(answer: list[bytes]) -> None:
    """The request was handed over whole and the answer never completed: its outcome is unknown."""
    server = _Scripted([answer], close=True)
    try:
        with pytest.raises(httpwire.NoAnswer):
            _exchange(server)
    finally:
        server.stop()


_LOOKED_UP = ("content-length", "connection", "date", "x-amz-crc32", "x-amzn-errortype", "x-a", "transfer-encoding")


def _never_waiting(sock: socket.socket, buffer: Any, deadline: float) -> int:
    """``httpwire._recv_into`` for :func:`_outcome`: every byte was written before the read, so a read that
    finds none wants bytes the server never sent; it gives up at once, as a real read gives up at its deadline
    (the same "no answer", without a wait)."""
    sock.setblocking(False)
    try:
        return sock.recv_into(buffer)
    except BlockingIOError:
        raise TimeoutError("the read waits for bytes never sent") from None


def _outcome(
    read: Callable[[socket.socket, float], tuple[int, httpwire.Headers, bytes, bool]],
    data: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> object:
    """What ``read`` makes of ``data`` sent on a connection left open (as a kept-alive one is): the status, the
    headers copier looks up, the body and whether the connection is closed after; or "no answer" (the kinds
    ``Wire.exchange`` turns into NoAnswer: a read that would wait past what ``data`` holds, a refused head)."""
    monkeypatch.setattr(httpwire, "_recv_into", _never_waiting)
    client, server = socket.socketpair()
    try:
        server.sendall(data)
        try:
            status, headers, body, will_close = read(client, time.monotonic() + 60)
        except (OSError, http.client.HTTPException):
            return "no answer"
        return status, [headers.get(name) for name in _LOOKED_UP], body, will_close
    finally:
        client.close()
        server.close()


def _lean(sock: socket.socket, deadline: float) -> tuple[int, httpwire.Headers, bytes, bool]:
    status, headers, body, will_close, _ = httpwire._answer(sock, deadline)  # noqa: SLF001 - the reader itself
    return status, headers, body, will_close


def _http_client(sock: socket.socket, deadline: float) -> tuple[int, httpwire.Headers, bytes, bool]:
    """The answer as http.client alone reads it (the client before the lean reader)."""
    answer = http.client.HTTPResponse(httpwire._Reader(sock, deadline), method="POST")  # type: ignore[arg-type]  # noqa: SLF001
    answer.begin()
    body = answer.read()
    return answer.status, httpwire.Headers(answer.msg.items()), body, bool(answer.will_close)


_OK = b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(_OK + b"Content-Length: 2\r\n\r\n{}", id="plain"),
        pytest.param(_OK + b"X-A: v \t\r\nContent-Length: 2\r\n\r\n{}", id="value-trailing-blanks"),
        pytest.param(_OK + b"X-A: \xe9t\xe9\r\nContent-Length: 2\r\n\r\n{}", id="non-ascii-value"),
        pytest.param(_OK + b"X\xffA: 1\r\nContent-Length: 2\r\n\r\n{}", id="non-ascii-name"),
        pytest.param(_OK + b"Bad Name: 1\r\nContent-Length: 2\r\n\r\n{}", id="name-with-a-space"),
        pytest.param(_OK + b"X-A: a\nContent-Length: 3\r\nContent-Length: 2\r\n\r\n{}x", id="bare-lf-in-a-line"),
        pytest.param(_OK + b"X-A: a\rContent-Length: 3\r\nContent-Length: 2\r\n\r\n{}x", id="bare-cr-in-a-line"),
        pytest.param(b"HTTP/1.1 200 OK\nContent-Length: 2\n\n{}", id="bare-lf-head"),
        pytest.param(_OK + b"Content-Length: 2\r\n\n{}", id="bare-lf-blank-line"),
        pytest.param(b"HTTP/1.1 204 No Content\r\nContent-Length: 2\r\n\r\n{}", id="no-content-with-a-length"),
        pytest.param(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 2\r\n\r\n{}", id="not-modified-with-a-length"),
        pytest.param(_OK + b"X-A: 1\r\n" * 100 + b"Content-Length: 2\r\n\r\n{}", id="101-headers"),
        pytest.param(_OK + b"X-A: 1\r\n" * 99 + b"Content-Length: 2\r\n\r\n{}", id="100-headers"),
        pytest.param(_OK + b"X-A: " + b"a" * 65600 + b"\r\nContent-Length: 2\r\n\r\n{}", id="line-too-long"),
        pytest.param(_OK + b"X-A: " + b"a" * 65525 + b"\r\nContent-Length: 2\r\n\r\n{}", id="longest-line"),
        pytest.param(_OK + b"X-A: 1\r\n\tfolded\r\nContent-Length: 2\r\n\r\n{}", id="folded-header"),
        pytest.param(_OK + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x", id="two-lengths"),
        pytest.param(_OK + b"Content-Length: +2\r\n\r\n{}", id="signed-length"),
        pytest.param(_OK + b"Content-Length: 5\r\n\r\n{}", id="body-shorter-than-declared"),
        pytest.param(_OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n", id="chunked"),
        pytest.param(_OK + b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n", id="chunked-unfinished"),
        pytest.param(b"HTTP/1.1 100 Continue\r\n\r\n" + _OK + b"Content-Length: 2\r\n\r\n{}", id="interim-status"),
        pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}", id="http-1.0"),
        pytest.param(b"HTTP/1.1 200 OK", id="status-line-unfinished"),
        pytest.param(b"\r\n" + _OK + b"Content-Length: 2\r\n\r\n{}", id="leading-blank-line"),
        pytest.param(_OK + b"Connection: keep-alive, close\r\nContent-Length: 2\r\n\r\n{}", id="close"),
        pytest.param(_OK + b"Content-Length: 2 \t\r\nX-A:\r\nx-amz-crc32:1 \r\n\r\n{}", id="blanks-and-empty"),
        pytest.param(_OK + b"X(A): 1\r\nContent-Length: 2\r\n\r\n{}", id="name-email-takes"),
        pytest.param(b"HTTP/1.1 500 \xc9chec\r\nx-amzn-ErrorType: X\r\nContent-Length: 2\r\n\r\n{}", id="reason"),
        pytest.param(
            _OK + b"Connection: close\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",
            id="two-connection-headers",
        ),
    ],
)
def test_the_lean_reader_makes_of_every_answer_what_http_client_makes_of_it(
    data: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Byte for byte, whatever a server sends on a kept-alive connection, the lean reader comes to what
    http.client alone came to: the same status, headers, body and closing, or no answer where it had none (a
    read past the deadline, a refused head). A success where http.client had no answer would let copier act
    on an answer it never read; a different body would be another answer."""
    assert _outcome(_lean, data, monkeypatch) == _outcome(_http_client, data, monkeypatch)


_STATUS_LINES = st.sampled_from(
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200",
        b"HTTP/1.1 200 ",
        b"HTTP/1.1 400 Bad Request",
        b"HTTP/1.1 999 x",
        b"HTTP/1.1 204 No Content",
        b"HTTP/1.1 304 Not Modified",
        b"HTTP/1.1 100 Continue",
        b"HTTP/1.1 199 x",
        b"HTTP/1.1 20",
        b"HTTP/1.1 2000",
        b"HTTP/1.1 2x0 OK",
        b"HTTP/1.1 \xb2\xb3\xb9 OK",
        b"HTTP/1.0 200 OK",
        b"HTTP/1.1  200 OK",
        b"http/1.1 200 OK",
        b"HTTP/1.1 500 \xc9chec",
        b"HTTP/1.1 200\tOK",
        b"HTTP/1.1 200\xa0OK",
    ]
)
_PLAIN_NAMES = st.sampled_from([b"Connection", b"Date", b"X-A", b"x-amz-crc32", b"x-amzn-ErrorType", b"x-a", b"~!#"])
_ODD_NAMES = st.one_of(
    st.sampled_from([b"Content-Length", b"content-length", b"Transfer-Encoding", b"", b"X A", b"X(A)", b"X\xe9"]),
    st.sampled_from([b"X\x00", b"X\x7f", b" X-A", b"X-A "]),
    st.binary(max_size=3).map(lambda raw: b"X" + raw.replace(b"\r", b"").replace(b"\n", b"")),
)
# mostly names a plain head holds, so that a head with several lines still reaches every check of the lean reader
_NAMES = st.one_of(_PLAIN_NAMES, _PLAIN_NAMES, _PLAIN_NAMES, _ODD_NAMES)
_SEPARATORS = st.sampled_from([b":", b": ", b":\t", b": \t ", b" :", b"\t:", b"", b"::"])
_VALUES = st.one_of(
    st.sampled_from(
        [
            b"2",
            b" 2",
            b"2 \t",
            b"\t2",
            b"+2",
            b"0x2",
            b"-1",
            b"2.0",
            b"\xb2",
            b"\xef\xbc\x91",
            b"",
            b" ",
            b"close",
            b"keep-alive, Close",
            b"chunked",
            b"v:w",
            b"\xe9t\xe9",
            b"2\xa0",
            b"\xa02",
            b"02",
        ]
    ),
    st.binary(max_size=4).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b"")),
)
_LINES = st.lists(st.tuples(_NAMES, _SEPARATORS, _VALUES), max_size=5)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    status=_STATUS_LINES,
    lines=_LINES,
    length_at=st.integers(min_value=0, max_value=5),
    length=st.sampled_from([b"2", b"2", b"2", b" 2", b"2 \t", b"02", b"+2", b"\xb2", b"2\xa0", b"\t2"]),
    body=st.sampled_from([b"", b"{}"]),  # bytes past the body: a deliberate difference (the test after this)
)
def test_any_head_drawn_from_the_pieces_aws_and_others_send_reads_as_http_client_reads_it(
    status: bytes,
    lines: list[tuple[bytes, bytes, bytes]],
    length_at: int,
    length: bytes,
    body: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Heads drawn from the pieces the parametrized cases pick one by one (status lines of every kind, names of
    token characters and not, blanks around the colon, lengths signed, spaced, of other digits), each
    with one Content-Length among its lines (mostly a plain 2) so that most of them reach the lean reader's every
    check: its verdict is http.client's, whichever branch of it a head reaches."""
    lines = [*lines[:length_at], (b"Content-Length", b": ", length), *lines[length_at:]]
    head = status + b"".join(b"\r\n" + name + sep + value for name, sep, value in lines)
    data = head + b"\r\n\r\n" + body
    assert _outcome(_lean, data, monkeypatch) == _outcome(_http_client, data, monkeypatch)


def test_a_length_of_more_digits_than_the_lean_reader_takes_is_left_to_http_client() -> None:
    """Up to 18 digits (a length in a 64-bit integer) the lean reader takes; more, and the head is not the plain
    kind (drawn above only in sizes a test can hold: http.client would try to read such a body)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: "
    plain = httpwire._plain_head(head + b"9" * 18)  # noqa: SLF001 - the reader itself
    assert plain is not None and plain[2] == 10**18 - 1
    assert httpwire._plain_head(head + b"9" * 19) is None  # noqa: SLF001


def test_bytes_past_a_body_close_the_connection_and_are_never_read_as_the_next_answer() -> None:
    """A server that sent more than its Content-Length (here a whole second answer, in the same write) is out of
    step: the connection is not used again, and the next request's answer is the one the server sends it."""
    stray = b'HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{"x": 1}'
    first = [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}" + stray]
    second = [b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\n{}"]
    server = _Scripted([first, second])
    wire = httpwire.Wire("127.0.0.1", server.port, None, 5.0)
    try:
        answers = [_exchange(server, wire) for _ in range(2)]
    finally:
        server.stop()
    assert [(a.status, a.body) for a in answers] == [(200, b"{}"), (400, b"{}")]
    assert wire.opened == 2


def test_a_request_head_carries_its_headers_in_order_and_refuses_one_that_would_split_it() -> None:
    """The head is the headers given, in their order, then Accept-Encoding and Content-Length; a name or a
    value that would end its line (a line break, a NUL; a colon or a blank in a name) is refused, naming that
    header, whichever header it is in and however many are fine."""
    head = httpwire.request_head({"Host": "h", "X-Amz-Target": "T.Op", "Content-Type": "c"}, 12)
    assert head == (
        b"POST / HTTP/1.1\r\nHost: h\r\nX-Amz-Target: T.Op\r\nContent-Type: c\r\n"
        b"Accept-Encoding: identity\r\nContent-Length: 12\r\n\r\n"
    )
    fine = {"Host": "h", "X-Amz-Date": "20261124T073015Z", "Authorization": "AWS4-HMAC-SHA256 Credential=a/b"}
    for name, value in [
        ("X-Amz-Security-Token", "tok\r\nX-Evil: 1"),
        ("X-Amz-Security-Token", "tok\nen"),
        ("X-Amz-Security-Token", "tok\0en"),
        ("X-Bad Name", "v"),
        ("X-Bad:Name", "v"),
        ("X-Bad\rName", "v"),
    ]:
        with pytest.raises(ValueError, match=re.escape(f"header {name!r}")):
            httpwire.request_head({**fine, name: value, "Content-Type": "c"}, 2)
