"""AWS refusing a host's requests for their time (a clock stepped past AWS's 5-minute signature window): the
clock is named, the shard is kept and retried, nothing on the host restarts; ``copier status`` says it too.

The refusals are injected (the local backend checks no signature); the
clock is measured as in production, from the Date of every answer
(``copier.core.clockcheck``), and for ``copier status`` from a server on
127.0.0.1 that answers as AWS does to a request signed 10 minutes late.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from copier.core.clockcheck import ClockSnapshot, blames_the_clock, clock_note, naming_the_clock
from copier.core.errors import AwsError, FatalAwsError, TransientAwsError
from copier.shard import ShardWorker
from tests.support.backend import DUMMY_ENV, ROOT
from tests.support.fakes import SHARD, OffsetClock, World, measured, rec
from tests.support.serving import serving

MINUTE = 60_000
EXPIRED = "Signature expired: 20261126T101000Z is now earlier than 20261126T101500Z (20261126T102000Z - 5 min.)"
TOKEN_EXPIRED = "The security token included in the request is expired"
NOT_YET = "Signature not yet current: 20261126T103000Z is still later than 20261126T102500Z (20261126T102000Z + 5 min.)"


def snapshot(offset_ms: int | None, error_ms: int = 20) -> ClockSnapshot:
    bound = None if offset_ms is None else abs(offset_ms) + error_ms
    return ClockSnapshot(offset_ms, None if offset_ms is None else error_ms, bound, 10, 1, 0)


@pytest.mark.parametrize(
    ("code", "message", "offset", "blamed"),
    [
        ("InvalidSignatureException", EXPIRED, None, True),
        ("InvalidSignatureException", NOT_YET, None, True),
        ("InvalidSignatureException", "The request signature we calculated does not match", 10 * MINUTE, False),
        (
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large",
            None,
            True,
        ),
        ("ExpiredTokenException", TOKEN_EXPIRED, 10 * MINUTE, True),
        ("ExpiredTokenException", TOKEN_EXPIRED, -10 * MINUTE, True),
        ("ExpiredTokenException", TOKEN_EXPIRED, 30_000, False),
        ("ExpiredTokenException", TOKEN_EXPIRED, None, False),
        ("AccessDeniedException", "not authorized", 10 * MINUTE, False),
    ],
)
def test_which_refusals_blame_the_clock(code: str, message: str, offset: int | None, blamed: bool) -> None:
    """A signature outside AWS's window, said outright or by its message, is the clock; an expired token is the
    clock only when the clock is measured at least the window off (else the credentials really expired)."""
    assert blames_the_clock(FatalAwsError("PutRecords", code, message), snapshot(offset)) is blamed


def test_the_note_names_the_clock_its_direction_and_the_measured_offset() -> None:
    behind = clock_note(snapshot(612_345))
    assert "612.3 s behind AWS time" in behind and "clock_offset_ms 612345" in behind and "±20 ms" in behind
    assert "ahead of AWS time" in clock_note(snapshot(-400_000))
    assert "not measured yet" in clock_note(None)
    named = naming_the_clock(FatalAwsError("ListShards", "InvalidSignatureException", EXPIRED), snapshot(612_345))
    assert isinstance(named, FatalAwsError) and EXPIRED in str(named) and "behind AWS time" in str(named)
    other = FatalAwsError("ListShards", "AccessDeniedException", "no")
    assert naming_the_clock(other, snapshot(612_345)) is other


def host_off(world: World, offset_ms: int) -> ShardWorker:
    """A processor on a host whose clock is ``offset_ms`` off AWS time, measured from every answer."""
    host = OffsetClock(world.clock, offset_ms)
    return world.worker(SHARD, None, host, measured(host), answering=True)


def refusing(
    times: int, error: Callable[[], AwsError]
) -> Callable[[str, list[tuple[str, bytes]]], tuple[list[bool], BaseException | None]]:
    """A put fault: the first ``times`` requests are refused with ``error()`` (nothing of them written)."""
    left = [times]

    def fault(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
        if left[0]:
            left[0] -= 1
            return [False] * len(entries), error()
        return [True] * len(entries), None

    return fault


def refuse_batches(world: World, refusals: list[AwsError]) -> None:
    """The store refuses the next digest batch writes with ``refusals``, one each, then writes as before."""
    real = world.store.put_batch

    def put_batch(key: str, batch: object) -> None:
        if refusals:
            raise refusals.pop()
        real(key, batch)  # type: ignore[arg-type]

    world.store.put_batch = put_batch  # type: ignore[method-assign]


@pytest.mark.parametrize("message", [EXPIRED, NOT_YET], ids=["expired", "not yet current"])
def test_a_put_refused_for_the_hosts_clock_stalls_the_shard_naming_the_clock_then_goes_on(message: str) -> None:
    """The processor keeps its shard: the put is retried at the longest backoff, each retry logged as
    shard_stalled with reason "clock" and the measured offset, and once AWS takes the signature again every
    event lands once. (The error was host-wide: the process exited, and every shard of the host restarted,
    every few seconds, with nothing naming the clock.)"""
    world = World()
    owner = host_off(world, -7 * MINUTE)  # 7 minutes behind AWS time
    world.streams.fault = refusing(3, lambda: FatalAwsError("PutRecords", "InvalidSignatureException", message))
    slept = len(world.clock.slept)
    with capture_logs() as logs:
        owner.process([rec(1, "a"), rec(2, "b")])
    assert world.target_ids() == Counter({"a": 1, "b": 1})
    stalls = [e for e in logs if e["event"] == "shard_stalled"]
    assert [e["reason"] for e in stalls] == ["clock"] * 3
    assert all(abs(e["clock_offset_ms"] - 7 * MINUTE) <= e["clock_error_ms"] for e in stalls)
    assert " s behind AWS time" in stalls[0]["detail"]
    assert world.clock.slept[slept:].count(owner.config.max_backoff_millis) >= 3, "at the longest backoff"


def test_a_state_write_refused_for_the_hosts_clock_stalls_the_shard_too() -> None:
    """DynamoDB refuses the same way: the chunk's intent (a digest batch write) is retried, the clock named."""
    world = World()
    owner = host_off(world, 8 * MINUTE)  # 8 minutes ahead
    refuse_batches(world, [FatalAwsError("PutItem", "InvalidSignatureException", NOT_YET)] * 2)
    with capture_logs() as logs:
        owner.process([rec(1, "a")])
    assert world.target_ids() == Counter({"a": 1})
    stalls = [e for e in logs if e["event"] == "shard_stalled"]
    assert [(e["call"], e["reason"]) for e in stalls] == [("put_batch", "clock")] * 2
    assert "ahead of AWS time" in stalls[0]["detail"]


def test_an_expired_token_on_a_host_whose_clock_is_right_still_ends_the_process() -> None:
    """ExpiredTokenException with the clock measured right: the credentials really expired; no waiting mends
    that, so the fault stays host-wide (the supervisor restarts the daemon and its credential chain)."""
    world = World()
    owner = host_off(world, 0)
    expired = FatalAwsError(
        "PutRecords", "ExpiredTokenException", "The security token included in the request is expired"
    )
    world.streams.fault = refusing(1, lambda: expired)
    with pytest.raises(FatalAwsError, match="ExpiredTokenException"):
        owner.process([rec(1, "a")])


def test_an_expired_token_on_a_host_whose_clock_is_far_behind_stalls_naming_the_clock() -> None:
    """The same answer on a host measured 20 minutes behind: its credential provider took expired credentials
    for fresh by its own clock; the clock is named and the shard waits."""
    world = World()
    owner = host_off(world, -20 * MINUTE)
    expired = FatalAwsError(
        "PutRecords", "ExpiredTokenException", "The security token included in the request is expired"
    )
    world.streams.fault = refusing(2, lambda: expired)
    with capture_logs() as logs:
        owner.process([rec(1, "a")])
    assert [e["reason"] for e in logs if e["event"] == "shard_stalled"] == ["clock", "clock"]
    assert world.target_ids() == Counter({"a": 1})


def test_a_request_time_too_skewed_answer_is_a_clock_stall_not_a_quiet_retry() -> None:
    """RequestTimeTooSkewed is not a fatal code (it is retried): it is said as a clock stall all the same."""
    world = World()
    owner = host_off(world, -6 * MINUTE)
    refuse_batches(world, [TransientAwsError("PutItem", "RequestTimeTooSkewed", "The difference ... is too large")])
    with capture_logs() as logs:
        owner.process([rec(1, "a")])
    assert [e["reason"] for e in logs if e["event"] == "shard_stalled"] == ["clock"]


class _SignedLate(BaseHTTPRequestHandler):
    """Answers every request as AWS answers one signed 10 minutes before its own time (its Date 10 minutes on)."""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"__type": "InvalidSignatureException", "message": EXPIRED}).encode()
        self.send_response(400)  # with the Date of date_time_string
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def date_time_string(self, timestamp: float | None = None) -> str:
        return formatdate(time.time() + 600, usegmt=True)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_copier_status_on_a_host_whose_clock_is_off_names_the_clock(tmp_path: Path) -> None:
    """Run on that host, ``copier status`` meets the same refusal: its one error line names the clock and how
    far it is off, measured from the refusal's own Date (it said only that the signature had expired)."""
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), _SignedLate)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        path = tmp_path / "copier.properties"
        path.write_text(
            "applicationName = app\nstreamName = staging\nregionName = us-east-1\n"
            f"kinesisEndpoint = {url}\ndynamoDBEndpoint = {url}\n"
            "copier.targetStreamName = target\ncopier.dedupKey = json:eventId\n"
        )
        result = subprocess.run(
            [str(ROOT / ".venv" / "bin" / "copier"), "status", "--properties", str(path)],
            capture_output=True,
            text=True,
            env={**os.environ, **DUMMY_ENV},
            timeout=120,
        )
    assert result.returncode == 3, result.stderr
    assert "InvalidSignatureException" in result.stderr and "Signature expired" in result.stderr
    assert "s behind AWS time" in result.stderr and "time synchronisation" in result.stderr
    seconds = float(result.stderr.split(" s behind AWS time")[0].rsplit(" ", 1)[1])
    assert 598 <= seconds <= 602
