"""One HTTP/1.1 exchange on a kept-alive connection, within a deadline: nothing of a request leaves after it.

Why: copier puts only while its lease outlives ``now + putTimeoutMillis +
margin`` (docs/protocol.md, "Fencing"), so a put must be over, or known not
to have happened, by then. ``http.client`` bounds each socket operation, not
the call: a name lookup without a timeout, a connect of up to its timeout, a
body written in many operations each allowed the whole timeout, and, once
the client gives up, bytes of the request still in the kernel's send queue,
which the kernel goes on sending to a slow reader after the socket is closed.
Here one deadline (``time.monotonic()``) bounds the whole exchange:

* the connection (name lookup, connect, TLS handshake) gets what is left of
  it, at most the connect timeout; nothing is written once it has passed;
* each write of the request is bounded by what is left (a write returns
  with what the kernel took; a TLS write gives up at its timeout);
* when the deadline passes (or the connection fails) before copier's send
  loop has handed the request's last byte to the kernel, the socket is
  reset (``SO_LINGER`` 0): the kernel discards what it still holds and sends
  nothing more, not even a retransmission, so the last byte never reaches
  the server, and a request whose body never fully arrived is not
  processed: :class:`NotSent`, safe to send again;
* once every byte was handed to the kernel, the outcome is unknown
  whatever happens next: :class:`NoAnswer` (verified, never sent again
  blindly). The socket is still reset at the deadline, which stops what the
  kernel holds from leaving later, and a server that does not get the last
  byte will not process the request; but whether the kernel sent the rest
  before the reset cannot be known: reading its queue (``SIOCOUTQNSD``) and
  resetting are two system calls, and a receive window that opens between
  them lets the kernel send the rest, the whole request at the server while
  the client would have said "not sent" (an adversarial review widened that
  gap and got exactly that).
* a kept-alive connection the server closed while idle (readable at rest: an
  end of file or a reset, as urllib3's ``is_connection_dropped`` checks) is
  never written to: a new one is opened, so a request is never lost to a
  connection that was dead before it was sent.

What no client can do: a process frozen (a pause, SIGSTOP) while the kernel
holds bytes of its request cannot reset the socket, and the kernel sends
them when it can: the honest limit of docs/protocol.md.
"""

from __future__ import annotations

import fcntl
import http.client
import io
import ipaddress
import re
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from copier.adapters.clockhooks import wall_ms

__all__ = ["Answer", "Headers", "NoAnswer", "NotSent", "Wire", "request_head"]

IDLE_RECONNECT_S = 20.0  # servers close idle connections (AWS after about a minute): never send on a stale one
SIOCOUTQNSD = 0x894B  # Linux: bytes in the send queue never sent


class NotSent(Exception):
    """The server cannot hold the whole request: not connected, or cut off before copier handed its last byte
    to the kernel.

    Internal to the adapters: ``copier.adapters.awsjson`` raises it as its Unsent (and :class:`NoAnswer` as
    Unanswered), copier errors."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        super().__init__(detail)


class NoAnswer(Exception):
    """Every byte of the request was handed to the kernel and no complete answer came by the deadline: it may
    have been processed."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        super().__init__(detail)


class Headers:
    """An answer's headers, looked up by name whatever its case; of a repeated header, the first (as
    ``email.message.Message.get``, which this stands in for)."""

    __slots__ = ("_by_name",)

    def __init__(self, pairs: Iterable[tuple[str, str]]) -> None:
        by_name: dict[str, str] = {}
        for name, value in pairs:
            by_name.setdefault(name.lower(), value)
        self._by_name = by_name

    @classmethod
    def lowered(cls, by_name: dict[str, str]) -> Headers:
        """The headers of ``by_name``, whose names are lowercased already and hold the first value of each."""
        headers = cls.__new__(cls)
        headers._by_name = by_name
        return headers

    def get(self, name: str) -> str | None:
        return self._by_name.get(name.lower())


@dataclass(frozen=True)
class Answer:
    """A complete answer; ``sent_ms`` and ``received_ms``: local wall time of the request's first byte and of
    the answer's status line (for ``copier.core.clockcheck``)."""

    status: int
    headers: Headers
    body: bytes
    sent_ms: int
    received_ms: int


_BAD_VALUE = re.compile("[\r\n\0]")  # would end the header line (or the string, for C readers)
_BAD_NAME = re.compile("[:\r\n\0 ]")


def request_head(headers: dict[str, str], length: int) -> bytes:
    """The head of a POST to "/" of a body of ``length`` bytes, with exactly these headers (Host among them).

    A header value with a line break would split the request: refused (ValueError), as http.client does.
    Checked over all names and all values at once (a character is in one of them if and only if it is in
    their concatenation), header by header only to name the one refused.
    """
    sent = {**headers, "Accept-Encoding": "identity", "Content-Length": str(length)}
    if _BAD_VALUE.search("".join(sent.values())) or _BAD_NAME.search("".join(sent)):
        for name, value in sent.items():
            if _BAD_VALUE.search(value) or _BAD_NAME.search(name):
                raise ValueError(f"header {name!r} cannot be sent: {value[:40]!r}")
    lines = "".join([f"{name}: {value}\r\n" for name, value in sent.items()])
    return f"POST / HTTP/1.1\r\n{lines}\r\n".encode("latin-1")


def _queue(sock: socket.socket, request: int) -> int | None:
    """A Linux send-queue count of ``sock`` (None where it cannot be read)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        count: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0"))[0]
    except OSError:
        return None
    return count


def _reset(sock: socket.socket) -> None:
    """Close with a reset: the kernel discards whatever it still holds to send and sends nothing more."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def _dropped(sock: socket.socket) -> bool:
    """True when a connection at rest is readable: the server closed it (an end of file, a reset) or sent
    something unasked; either way it is not written to."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


def _resolve(host: str, port: int, within: float) -> list[Any]:
    """getaddrinfo, given up after ``within`` seconds (it has no timeout of its own; the lookup runs on
    in a daemon thread, harmlessly)."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    found: list[Any] = []
    failed: list[BaseException] = []

    def lookup() -> None:
        try:
            found.extend(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            failed.append(exc)

    worker = threading.Thread(target=lookup, name=f"resolve {host}", daemon=True)
    worker.start()
    worker.join(max(within, 0.0))
    if failed:
        raise failed[0]
    if not found:
        raise TimeoutError(f"looking up {host} took longer than {within:.3f} s")
    return found


class _Reader(io.RawIOBase):
    """The socket as http.client reads an answer from it, each read bounded by what is left of the deadline;
    ``prefix``: bytes of the answer already read from it, read first."""

    def __init__(self, sock: socket.socket, deadline: float, prefix: bytes = b"") -> None:
        self._sock, self._deadline, self._prefix = sock, deadline, prefix

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._prefix:
            count = min(len(buffer), len(self._prefix))
            buffer[:count] = self._prefix[:count]
            self._prefix = self._prefix[count:]
            return count
        return _recv_into(self._sock, buffer, self._deadline)

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(self)


def _recv_into(sock: socket.socket, buffer: Any, deadline: float) -> int:
    """One read from the socket, bounded by what is left of the deadline (0: the server closed it)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the deadline passed before a complete answer")
    sock.settimeout(left)
    return sock.recv_into(buffer)


_MAX_HEAD = 65536  # http.client's longest line: a head longer than this is left to it (it refuses a longer line)
_MAX_HEADERS = 100  # http.client's most lines after the status line, the blank line that ends them counted
_HEAD_END = re.compile(rb"\n\r?\n")  # where http.client's head ends: a line break, then an empty line
_STATUS_LINE = re.compile(r"HTTP/1\.1 ([2-9][0-9][0-9])(?: [^\r\n]*)?")
# A header line email.parser reads as one header: a name of token characters (a name with any other character,
# a blank or a byte past ASCII, ends its headers there), the value without the blanks before it (those after it
# kept, as email.message keeps them). Lines hold no CR or LF but the CR LF between them (_plain_head counts them
# first), so the lines after the status line are all such lines exactly when _HEADER_LINES matches them whole,
# and then _HEADER finds each line's name and value, one line after the other.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_HEADER_LINES = re.compile(rf"{_TOKEN}:[^\r\n]*(?:\r\n{_TOKEN}:[^\r\n]*)*")
_HEADER = re.compile(rf"({_TOKEN}):[ \t]*([^\r\n]*)")
_LENGTH = re.compile(r"[0-9]{1,18}")
_NO_BODY = (204, 304)  # http.client reads no body after these, whatever Content-Length says


def _plain_head(head: bytes) -> tuple[int, Headers, int, bool] | None:
    """(status, headers, body length, will close) of an HTTP/1.1 head (without the blank line that ends it), or
    None when it is not the plain kind this reads exactly as http.client does: not HTTP/1.1, an interim (1xx)
    status or one without a body (204, 304), a body without one Content-Length (chunked, or to the end of the
    connection), a line break other than CR LF, a folded or malformed header line, more headers or a longer
    line than http.client takes. AWS answers the plain kind; the other kinds are left to http.client
    (:func:`_answer`), which reads them, or refuses them, as it always did."""
    crlf = head.count(b"\r\n")
    if head.count(b"\n") != crlf or head.count(b"\r") != crlf or crlf >= _MAX_HEADERS or len(head) > _MAX_HEAD - 2:
        return None
    # latin-1: one character a byte, as http.client reads a head
    first, _, lines = head.decode("latin-1").partition("\r\n")
    status = _STATUS_LINE.fullmatch(first)
    if status is None or int(status.group(1)) in _NO_BODY or not _HEADER_LINES.fullmatch(lines):
        return None
    by_name: dict[str, str] = {}
    lengths = 0
    for name, value in _HEADER.findall(lines):
        lower = name.lower()
        lengths += lower == "content-length"
        by_name.setdefault(lower, value)
    headers = Headers.lowered(by_name)
    length = by_name.get("content-length")
    if length is None or "transfer-encoding" in by_name or lengths != 1:
        return None
    if not _LENGTH.fullmatch(length.rstrip(" \t")):
        return None
    will_close = "close" in (headers.get("Connection") or "").lower()
    return int(status.group(1)), headers, int(length), will_close


def _answer(sock: socket.socket, deadline: float) -> tuple[int, Headers, bytes, bool, int]:
    """Read an answer: (status, headers, body, will the server close the connection, local wall time when
    its head was read). OSError or http.client.HTTPException when no complete one comes by the deadline.

    Why not http.client alone: its header parsing (``email.parser``) cost about 60 µs of CPU an answer,
    and a processor reads three answers a delivery. The plain answers AWS sends (HTTP/1.1, a
    Content-Length, no interim status) are read here; any other is handed whole to http.client, with the
    bytes already read, so what it accepts and refuses is unchanged (tests/test_httpwire_answers.py
    compares the two byte for byte). Bytes read past the body are no part of this answer, and not of the
    next either: a server that sent more than it declared is out of step, and its connection is closed.
    """
    buffer = bytearray()
    chunk = bytearray(16384)
    view = memoryview(chunk)
    while (found := _HEAD_END.search(buffer)) is None and len(buffer) <= _MAX_HEAD:
        count = _recv_into(sock, view, deadline)
        if not count:
            break  # closed: http.client says how (RemoteDisconnected, a bad status line, ...)
        buffer += view[:count]
    plain = None
    if found is not None and found.group() == b"\n\r\n" and buffer[found.start() - 1 : found.start()] == b"\r":
        end = found.start() - 1  # the head ends with CR LF CR LF: the plain kind, if its lines are
        plain = _plain_head(bytes(buffer[:end]))
    if plain is None:
        answer = http.client.HTTPResponse(_Reader(sock, deadline, bytes(buffer)), method="POST")  # type: ignore[arg-type]
        answer.begin()
        received_ms = wall_ms()
        data = answer.read()
        return answer.status, Headers(answer.msg.items()), data, bool(answer.will_close), received_ms
    received_ms = wall_ms()
    status, headers, length, will_close = plain
    body = bytearray(length)  # the rest is read straight into it: a page of megabytes in few reads
    got = len(buffer[end + 4 : end + 4 + length])
    body[:got] = buffer[end + 4 : end + 4 + got]
    if len(buffer) > end + 4 + length:
        will_close = True  # bytes past the body: never read as the next answer's
    into = memoryview(body)
    while got < length:
        count = _recv_into(sock, into[got:], deadline)
        if not count:
            raise http.client.IncompleteRead(bytes(body[:got]), length - got)
        got += count
    return status, headers, bytes(body), will_close, received_ms


_JOINED_BODY = 65536  # a body up to this is sent in one buffer with the head


def _parts(head: bytes, body: bytes) -> tuple[memoryview, ...]:
    """What the send loop hands the kernel: head and body in one buffer when the body is small (one write,
    one segment on the wire, as http.client sends them), else the two apart (a large body is not copied)."""
    if len(body) <= _JOINED_BODY:
        return (memoryview(head + body),)
    return memoryview(head), memoryview(body)


class Wire:
    """A kept-alive connection to one host and port (TLS when ``tls`` is given). Not thread-safe."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None, connect_timeout: float) -> None:
        self.host, self.port, self.tls, self.connect_timeout = host, port, tls, connect_timeout
        self._sock: socket.socket | None = None
        self._last_used = 0.0
        self.opened = 0  # connections opened (tests read it)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _connection(self, deadline: float) -> socket.socket:
        """The kept-alive connection if it is alive and was used recently, else a new one; NotSent when none
        can be made by the deadline."""
        if self._sock is not None:
            if time.monotonic() - self._last_used < IDLE_RECONNECT_S and not _dropped(self._sock):
                return self._sock
            self.close()
        try:
            self._sock = self._open(deadline)
        except (OSError, ssl.SSLError) as exc:  # nothing of the request was written
            raise NotSent(type(exc).__name__, str(exc) or type(exc).__name__) from exc
        self.opened += 1
        return self._sock

    def _open(self, deadline: float) -> socket.socket:
        def left() -> float:
            remaining = min(self.connect_timeout, deadline - time.monotonic())
            if remaining <= 0:
                raise TimeoutError("the deadline passed while connecting")
            return remaining

        error: OSError = OSError(f"no address for {self.host}")
        for family, kind, proto, _, address in _resolve(self.host, self.port, left()):
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(left())
                sock.connect(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.tls is not None:
                    sock.settimeout(left())
                    sock = self.tls.wrap_socket(sock, server_hostname=self.host)
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error

    def exchange(self, head: bytes, body: bytes, deadline: float | None, budget: float = 0.0) -> Answer:
        """Send a request (``head`` and ``body``) and read its answer by ``deadline``; NotSent or NoAnswer
        otherwise (module docstring).

        Without a deadline: the connect timeout for a new connection, then ``budget`` seconds for the rest.
        """
        if deadline is not None and time.monotonic() >= deadline:
            raise NotSent("DeadlinePassed", "the deadline passed before the request was sent")
        sock = self._connection(time.monotonic() + self.connect_timeout if deadline is None else deadline)
        if deadline is None:
            deadline = time.monotonic() + budget
        sent_ms = wall_ms()
        done = 0
        try:
            for part in _parts(head, body):
                written = 0
                while written < len(part):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError("the deadline passed while sending")
                    sock.settimeout(left)
                    written += sock.send(part[written:])
                done += written
        except OSError as exc:  # the last byte was never handed over: the reset keeps it from the server
            self._sock = None
            _reset(sock)
            size = len(head) + len(body)
            raise NotSent(type(exc).__name__, f"{exc or type(exc).__name__} ({done} of {size} bytes)") from exc
        try:
            status, headers, data, will_close, received_ms = _answer(sock, deadline)
        except (OSError, http.client.HTTPException) as exc:
            # Handed over whole: its outcome is unknown. The reset stops what the kernel still holds from leaving
            # after the deadline; whether some of it left before cannot be known (module docstring).
            self._sock = None
            _reset(sock)
            raise NoAnswer(type(exc).__name__, str(exc) or type(exc).__name__) from exc
        if _queue(sock, SIOCOUTQNSD):  # answered before the whole request was taken: the rest is not sent
            self._sock = None
            _reset(sock)
        elif will_close:
            self.close()
        else:
            self._last_used = time.monotonic()
        return Answer(status, headers, data, sent_ms, received_ms)
