"""A put's whole life fits within the deadline its lease check gave it: one that would start late is not sent,
one whose body copier could not hand to the kernel whole by the deadline is cut off there (nothing of it leaves
later, and the server never holds it whole: not sent), one handed over whole and unanswered has an unknown
outcome, and botocore, the reference, is shown beside the lean client."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.credentials
import botocore.session
import pytest

from copier.adapters import httpwire
from copier.adapters.awsauth import Credentials, StaticCredentials
from copier.adapters.awsjson import JsonClient, Unanswered, Unsent
from copier.adapters.botokinesis import botocore_client, put_records
from copier.adapters.httpwire import request_head
from copier.adapters.kinesis import KinesisStreams
from copier.core.config import load_config
from copier.core.errors import AmbiguousPutError, TransientAwsError
from copier.core.plan import Outgoing
from copier.core.positions import Position
from copier.shard.forward import Forwarder
from copier.testing import FakeClock, InMemoryStreams
from tests.support.fakeaws import botocore_client as plain_botocore_client
from tests.support.fakeaws import clean_aws_env, fake_aws
from tests.support.props import write_properties

KEYS = Credentials("AKIDEXAMPLE", "secret")
ENTRY = [("pk", b'{"eventId": "1"}', None)]


@pytest.fixture(autouse=True)
def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_aws_env(monkeypatch, tmp_path)


class _LateCredentials:
    """Credentials whose refresh returns only once ``until()`` (a monotonic time) has passed."""

    def __init__(self, until: Callable[[], float]) -> None:
        self.until = until
        self.calls = 0

    def get_frozen_credentials(self) -> Credentials:
        self.calls += 1
        while time.monotonic() <= self.until():
            time.sleep(0.01)
        return KEYS

    def refresh(self) -> dict[str, str]:
        """As botocore's ``refresh_using``."""
        self.get_frozen_credentials()
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        return {"access_key": KEYS.access_key, "secret_key": KEYS.secret_key, "token": "", "expiry_time": expiry}


def _botocore_session(credentials: _LateCredentials) -> botocore.session.Session:
    """A session whose credentials are expired, so that signing refreshes them through ``credentials``."""
    session = botocore.session.Session()
    session._credentials = botocore.credentials.RefreshableCredentials(  # no public setter
        "AKIDEXAMPLE", "secret", None, botocore.credentials._local_now(), credentials.refresh, "test"
    )
    return session


def test_a_put_whose_credential_refresh_eats_its_budget_is_not_sent() -> None:
    """The refresh ends after the deadline: the lean client and copier's botocore put client send nothing (not
    sent, safe to retry); botocore alone, the reference, sends it late."""
    deadline = [0.0]
    late = _LateCredentials(lambda: deadline[0])
    with fake_aws() as fake:
        lean = JsonClient("kinesis", "us-east-1", fake.url, late, 5.0, 5.0)
        deadline[0] = time.monotonic() + 0.2
        with pytest.raises(Unsent, match="DeadlinePassed"):
            lean.call("PutRecords", b"{}", deadline[0])
        assert late.calls == 1 and fake.received == []

        session = _botocore_session(late)
        guarded = botocore_client(session, "us-east-1", fake.url, attempts=1, read_timeout=0.2, put_deadlines=True)
        deadline[0] = time.monotonic() + 0.2
        with pytest.raises(TransientAwsError, match="DeadlinePassed") as caught:
            put_records(guarded, "target", ENTRY, deadline[0])
        assert not isinstance(caught.value, AmbiguousPutError)
        assert late.calls == 2 and fake.received == []

        reference = _botocore_session(late).create_client("kinesis", region_name="us-east-1", endpoint_url=fake.url)
        deadline[0] = time.monotonic() + 0.2
        reference.put_records(StreamName="target", Records=[{"PartitionKey": "pk", "Data": b"x"}])
        assert len(fake.received) == 1, "botocore alone sends it, after the deadline"


class _FullBacklog:
    """A listener on 127.0.0.1 whose accept queue is full (one connection waiting, none accepted), so a connect to
    it hangs, until ``opens_at`` (monotonic) has passed: then it takes connections (a SYN retransmitted after about
    a second gets through) and answers every request, noting it."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.filler = socket.create_connection(self.listener.getsockname())
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.opens_at = float("inf")
        self.stop = threading.Event()
        self.requests: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while time.monotonic() <= self.opens_at and not self.stop.is_set():
            time.sleep(0.01)
        waiting, _ = self.listener.accept()  # the filler: the queue has room again
        waiting.close()
        self.listener.settimeout(0.05)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                request = conn.recv(65536)
                if request:
                    self.requests.append(request)
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")

    def close(self) -> None:
        self.opens_at = 0.0
        self.stop.set()
        self.thread.join(10)
        self.filler.close()
        self.listener.close()


def test_a_put_whose_connect_eats_its_budget_is_not_sent() -> None:
    """The connect would complete only after the deadline (the server's queue full until then): the lean client
    and copier's botocore put client give up at the deadline and send nothing; botocore alone, the reference,
    connects late and sends (the 5 s connect timeout of either client is no bound on a put)."""
    lean_side = _FullBacklog()
    try:
        lean = JsonClient("kinesis", "us-east-1", lean_side.url, StaticCredentials(KEYS), 5.0, 5.0)
        lean_side.opens_at = time.monotonic() + 0.3
        with pytest.raises(Unsent):
            lean.call("PutRecords", b"{}", lean_side.opens_at)
    finally:
        lean_side.close()
    assert lean_side.requests == []

    guarded_side = _FullBacklog()
    try:
        session = botocore.session.Session()
        session.set_credentials(KEYS.access_key, KEYS.secret_key)
        guarded = botocore_client(
            session, "us-east-1", guarded_side.url, attempts=1, read_timeout=0.3, put_deadlines=True
        )
        guarded_side.opens_at = time.monotonic() + 0.3
        with pytest.raises(TransientAwsError) as caught:
            put_records(guarded, "target", ENTRY, guarded_side.opens_at)
        assert not isinstance(caught.value, AmbiguousPutError), "never connected: nothing was sent"
    finally:
        guarded_side.close()
    assert guarded_side.requests == []

    reference_side = _FullBacklog()
    try:
        reference = plain_botocore_client("kinesis", reference_side.url, connect_timeout=5)
        reference_side.opens_at = time.monotonic() + 0.3
        reference.put_records(StreamName="target", Records=[{"PartitionKey": "pk", "Data": b"x"}])
    finally:
        reference_side.close()
    assert len(reference_side.requests) == 1, "botocore alone connects late and sends"


@dataclass
class _StalledReader:
    """A server on 127.0.0.1 with a small receive buffer that reads nothing of a request until released, then
    reads everything that still arrives: what a request leaving after its deadline would reach."""

    listener: socket.socket = field(default_factory=socket.socket)
    release: threading.Event = field(default_factory=threading.Event)
    arrived: list[bytes] = field(default_factory=list)
    reading: bytearray = field(default_factory=bytearray)

    def __post_init__(self) -> None:
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            self.release.wait(30)
            conn.settimeout(10)
            try:
                while chunk := conn.recv(65536):
                    self.reading.extend(chunk)
            except OSError:  # the reset that cut the request off
                pass
            self.arrived.append(bytes(self.reading))

    def received(self) -> int:
        """Bytes of the request read so far."""
        return len(self.reading)

    def whole_request_arrived(self) -> bool:
        self.release.set()
        self.thread.join(30)
        head, _, body = self.arrived[0].partition(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        return len(body) >= next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))

    def close(self) -> None:
        self.release.set()
        self.listener.close()


def _big_put(size: int) -> bytes:
    return json.dumps({"StreamName": "target", "Records": [{"Data": "A" * size, "PartitionKey": "pk"}]}).encode()


def _more_than_the_kernel_takes() -> int:
    """A body larger than the kernel's send buffer can ever grow (``tcp_wmem``'s maximum) plus what a reader's
    small receive buffer takes: copier's send loop cannot hand it over whole to a server that reads nothing."""
    try:
        most = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, IndexError, ValueError):
        most = 4 << 20
    return 2 * most + (1 << 20)


def test_a_body_the_send_loop_cannot_hand_over_whole_by_the_deadline_is_not_sent() -> None:
    """The slow server takes little of the request and the kernel's buffers cannot hold the rest: at the deadline
    copier's send loop has not handed the last byte over; the socket is reset (what the kernel holds is
    discarded), so the server never holds the request whole: not sent, safe to resend. Without the cut, the
    kernel would go on sending after the deadline (botocore, the reference: an unknown outcome at best)."""
    reader = _StalledReader()
    try:
        lean = JsonClient("kinesis", "us-east-1", reader.url, StaticCredentials(KEYS), 5.0, 5.0)
        with pytest.raises(Unsent):
            lean.call("PutRecords", _big_put(_more_than_the_kernel_takes()), time.monotonic() + 0.5)
        assert not reader.whole_request_arrived()
    finally:
        reader.close()

    reference = _StalledReader()
    try:
        client = plain_botocore_client("kinesis", reference.url, read_timeout=0.5, connect_timeout=0.5)
        with pytest.raises(AmbiguousPutError):
            put_records(client, "target", [("pk", b"A" * 150_000, None)])
    finally:
        reference.close()


def test_a_body_handed_whole_to_the_kernel_is_an_unknown_outcome_though_the_server_reads_it_late() -> None:
    """The whole request (200 KB) is handed to the kernel at once, and the slow server has taken little of it by
    the deadline: the socket is reset, but what the kernel sent of it cannot be known for sure (the next test),
    so the outcome is unknown (verified), never "not sent". Before, the kernel's queue, read just before the
    reset, said bytes were left, and the request was reported not sent."""
    reader = _StalledReader()
    try:
        lean = JsonClient("kinesis", "us-east-1", reader.url, StaticCredentials(KEYS), 5.0, 5.0)
        with pytest.raises(Unanswered) as caught:
            lean.call("PutRecords", _big_put(200_000), time.monotonic() + 0.5)
        assert not isinstance(caught.value, Unsent)
    finally:
        reader.close()


def test_a_window_opening_between_a_look_at_the_kernels_queue_and_the_reset_is_an_unknown_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request is handed to the kernel whole; the server's receive window opens just after the deadline,
    while the client cuts the exchange: the kernel sends the rest before the socket is reset (the gap between
    two system calls, widened here until the server holds every byte). The server holds the whole request,
    so the client must say its outcome is unknown. Before, it read the kernel's queue (bytes never sent), then
    reset, and reported NotSent: the forwarder sent it again, an unreported duplicate."""
    reader = _StalledReader()
    body = b"x" * 200_000
    head = request_head({"Host": "127.0.0.1"}, len(body))
    real_reset = httpwire._reset

    def reset_once_the_server_holds_it_all(sock: socket.socket) -> None:
        reader.release.set()  # the window opens
        until = time.monotonic() + 10
        while reader.received() < len(head) + len(body) and time.monotonic() < until:
            time.sleep(0.01)
        real_reset(sock)

    monkeypatch.setattr(httpwire, "_reset", reset_once_the_server_holds_it_all)
    try:
        wire = httpwire.Wire("127.0.0.1", reader.listener.getsockname()[1], None, 5.0)
        with pytest.raises(httpwire.NoAnswer):
            wire.exchange(head, body, time.monotonic() + 0.5)
        assert reader.whole_request_arrived()
    finally:
        reader.close()


def test_a_request_that_left_whole_and_got_no_answer_is_an_unknown_outcome() -> None:
    """Every byte left before the deadline (a small request the server's buffer takes): no answer by then is an
    unknown outcome, as today."""
    reader = _StalledReader()
    try:
        lean = JsonClient("kinesis", "us-east-1", reader.url, StaticCredentials(KEYS), 5.0, 5.0)
        with pytest.raises(Unanswered) as caught:
            lean.call("PutRecords", b"{}", time.monotonic() + 0.3)
        assert not isinstance(caught.value, Unsent)
        assert reader.whole_request_arrived()
    finally:
        reader.close()


def test_the_processors_puts_carry_their_deadline_to_the_wire(tmp_path: Path) -> None:
    """KinesisStreams hands the deadline to the lean client: a put whose deadline already passed is not sent."""
    with fake_aws() as fake:
        config = load_config(write_properties(tmp_path / "p.properties", fake.url, "staging", "target", "table"))
        streams = KinesisStreams(config, lean=StaticCredentials(KEYS))
        assert streams.put_records("target", ENTRY, time.monotonic() + 5) == [None]
        with pytest.raises(Unsent):
            streams.put_records("target", ENTRY, time.monotonic() - 0.001)
        assert len(fake.received) == 1


class _Session:
    """A PutSession that notes when the lease was checked."""

    def __init__(self) -> None:
        self.checked: list[float] = []

    def ensure_lease(self) -> None:
        self.checked.append(time.monotonic())

    def identity_for(self, destination: str) -> Any:
        raise AssertionError("no verification here")

    def retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        return fn()

    def on_put_request(self, *args: object) -> None:
        pass

    def on_put_retry(self, *args: object) -> None:
        pass

    def on_landed(self, *args: object) -> None:
        pass

    def on_stall(self, *args: object) -> None:
        pass


class _DeadlineStreams(InMemoryStreams):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock, {"target": 1})
        self.deadlines: list[float | None] = []

    def put_records(self, stream: str, entries: Any, deadline: float | None = None) -> list[str | None]:
        self.deadlines.append(deadline)
        return super().put_records(stream, entries, deadline)


def test_the_forwarder_gives_each_put_the_deadline_of_its_lease_check() -> None:
    """deadline <= the lease check's monotonic time + the put timeout, for every request."""
    clock = FakeClock()
    streams = _DeadlineStreams(clock)
    session = _Session()
    forwarder = Forwarder(streams, clock, session, {"target": "target"}, 2000, 100)
    outgoing = [Outgoing(Position(i, 0), "target", f"k{i}", b"{}", identity=i, event_id=f"e{i}") for i in range(1, 4)]
    forwarder.forward(outgoing, read_from_ms=0)
    assert streams.deadlines and len(streams.deadlines) == len(session.checked)
    for deadline, checked in zip(streams.deadlines, session.checked, strict=True):
        assert deadline is not None and deadline - 2.0 <= checked
