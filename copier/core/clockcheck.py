"""Bounds on this host's clock offset from AWS time, from the ``Date`` header of answers copier already receives.

Why: copier's leases and verification windows are safe only while host
clocks stay within ``copier.clockSkewMillis`` of each other and of Kinesis'
arrival timestamps (AWS time). A host whose NTP is broken would break that
silently; this measures it for free, with no request of its own.

How: a request sent at local wall-clock time ``s`` and answered at ``r``
carries a ``Date`` header ``D`` of one-second resolution. At some instant
during the request the server's clock read a time in ``[D, D + 1000)`` while
ours read a time in ``[s, r]``, so the offset (AWS minus local) lies in
``[D - r, D + 1000 - s)``: about a second wide. Intersecting the intervals of
recent samples narrows it to about the round-trip time, because the second
boundary of ``Date`` falls at different local instants from one sample to
the next ("tick detection"): a sample sent just after the server's second
ticked pins the upper end, one answered just before it ticks pins the lower.

Steps: the samples are kept against a clock that never steps (the
monotonic clock), and turned into wall-clock terms with the difference
"wall minus monotonic" read when asked. A wall-clock step (``date -s``, an
NTP step, a VM resumed) changes that difference by exactly the step, so the
interval follows a step the instant it happens, before any answer shows it,
and :attr:`ClockBounds.steps` counts it at the next answer. (Intersecting
wall-clock samples instead would hide a step smaller than the interval's
width: the intersection of samples from before and after it can miss the
true offset by up to the step, which the exactly-once model found.) On
Linux the monotonic clock is slewed with the wall clock, so slewing does
not count as a step.

Only samples of the last ``keep_ms`` (10 minutes, in monotonic time) are
intersected: an oscillator drifting at ``p`` ppm moves about ``0.6 * p`` ms
in that time, which the interval then follows instead of pinning the old
offset. An answer whose interval is disjoint from the samples kept until
then (a server's answer far off, or, after more than ``keep_ms`` without
answers, drift past the error) starts the samples again from the newest
one, and counts as a step too.

Pure bookkeeping (no I/O, no clock of its own): the hooks that feed it from
botocore and ``copier.adapters.awsjson`` are in ``copier.adapters.clockhooks``.

A clock off by more than AWS's signature window (5 minutes) makes AWS refuse
every request of the host (``InvalidSignatureException`` "Signature expired"
or "not yet current", and the like): :func:`blames_the_clock` recognises
such a refusal, and :func:`clock_note` says what the measurement knows, so
that the error line names the clock instead of a credential or a permission.
"""

from __future__ import annotations

import calendar
import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from email.utils import parsedate_tz

from copier.core.errors import AwsError

__all__ = [
    "CLOCK_CODES",
    "DATE_RESOLUTION_MS",
    "KEEP_MS",
    "SIGNATURE_WINDOW_MS",
    "ClockBounds",
    "ClockSnapshot",
    "blames_the_clock",
    "clock_note",
    "naming_the_clock",
    "parse_http_date",
    "wall_minus_monotonic",
]

DATE_RESOLUTION_MS = 1000  # an HTTP date names a whole second
KEEP_MS = 10 * 60 * 1000
REPORT_THRESHOLD_MS = 100
STEP_TOLERANCE_MS = 2  # the two clocks are read one after the other: a change this small is that, not a step
SIGNATURE_WINDOW_MS = 5 * 60_000  # AWS refuses a request signed further than this from its own time
#: Error codes that say outright that the request's time is too far from AWS's (the SDKs' clock-skew codes that
#: are not also a wrong key's: SignatureDoesNotMatch and AuthFailure are).
CLOCK_CODES = frozenset({"RequestTimeTooSkewed", "RequestExpired", "RequestInTheFuture"})
#: What AWS says (InvalidSignatureException) of a request signed outside its window, behind or ahead.
_OUT_OF_WINDOW = ("signature expired", "signature not yet current")


def wall_minus_monotonic() -> int:
    """This host's wall clock minus its monotonic clock, in ms: it changes exactly when the wall clock steps."""
    return time.time_ns() // 1_000_000 - time.monotonic_ns() // 1_000_000


@functools.lru_cache(maxsize=4)
def parse_http_date(value: str) -> int | None:
    """The start of the second an RFC 7231 HTTP date names, in epoch milliseconds; None if it is not one.

    Accepts the three forms RFC 7231 asks a recipient to read (IMF-fixdate,
    which AWS sends, RFC 850 and asctime); a zone other than GMT is applied.
    Cached: every answer carries one, and answers within a second carry the same.
    """
    try:
        parts = parsedate_tz(value)
    except (TypeError, ValueError, IndexError):
        return None
    if parts is None:
        return None
    try:
        seconds = calendar.timegm(parts[:6]) - (parts[9] or 0)
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds * 1000


@dataclass(frozen=True)
class ClockSnapshot:
    """What :class:`ClockBounds` knows, for a log line or a metric (None: no sample yet).

    ``offset_ms`` is AWS time minus local time, ``error_ms`` how far the true
    offset can be from it, ``bound_ms`` the largest ``|local - AWS|``
    consistent with the samples; ``samples`` counts the answers used,
    ``steps`` the clock steps seen, ``ignored`` the answers without a usable
    date (or answered before they were sent: the local clock stepped back).
    """

    offset_ms: int | None
    error_ms: int | None
    bound_ms: int | None
    samples: int
    steps: int
    ignored: int

    @property
    def shown_skew_ms(self) -> int | None:
        """How far off AWS time the samples *prove* this host's clock is: the distance of the interval
        ``offset ± error`` from 0 (0 when it contains 0: the clock may be right, and the bound is the
        measurement's own error). None before any sample."""
        if self.offset_ms is None or self.error_ms is None:
            return None
        return max(0, abs(self.offset_ms) - self.error_ms)

    @property
    def cause(self) -> str | None:
        """Which cause the numbers show for the bound: ``skew`` (the interval excludes 0: the clock is off)
        or ``round_trip`` (it contains 0: only the measurement is wide: slow round trips, or too few answers
        yet, the ``Date`` header naming whole seconds); None before any sample."""
        shown = self.shown_skew_ms
        return None if shown is None else "skew" if shown > 0 else "round_trip"

    def explained(self) -> str:
        """The numbers and the cause they show, in words, for a log line's ``detail``."""
        if self.cause is None:
            return "not measured yet"
        numbers = f"offset {self.offset_ms} ms ± {self.error_ms} ms"
        if self.cause == "skew":
            return f"{numbers} excludes 0: this host's clock is at least {self.shown_skew_ms} ms off AWS time (skew)"
        return (
            f"{numbers} contains 0: no skew shown, only the measurement's error (slow round trips, or few answers "
            "yet: the Date header names whole seconds)"
        )


class ClockBounds:
    """The interval this host's offset from AWS time must lie in, from the answers of the last ``keep_ms``.

    Fed by :meth:`observe`; see the module docstring for the reasoning. Two
    monotonic queues keep the largest lower end and the smallest upper end
    of the samples still kept, so an observation costs O(1) amortised
    however many answers a busy shard receives. Thread-safe: botocore
    clients may be shared by threads.
    """

    def __init__(self, keep_ms: int = KEEP_MS, frame: Callable[[], int] | None = None) -> None:
        """``frame``: the local wall clock minus a clock that never steps, read now (default: the monotonic
        clock, :func:`wall_minus_monotonic`; tests give a host clock of their own)."""
        if keep_ms <= 0:
            raise ValueError(f"keep_ms must be positive, not {keep_ms}")
        self.keep_ms = keep_ms
        self._frame = frame if frame is not None else wall_minus_monotonic
        self._slack = STEP_TOLERANCE_MS if frame is None else 0  # two real clocks read one after the other
        self._last_frame: int | None = None
        self.samples = 0
        self.steps = 0
        self.ignored = 0
        # Both in the frame of the clock that never steps (AWS minus monotonic; received at, in monotonic ms):
        self._lows: deque[tuple[int, int]] = deque()  # (received at, low end): low ends decreasing
        self._highs: deque[tuple[int, int]] = deque()  # (received at, high end): high ends increasing
        self._reported: tuple[int, int] | None = None  # (bound_ms, steps) at the last report
        self._lock = threading.Lock()

    def observe(self, sent_ms: int, received_ms: int, date_header: str) -> None:
        """Narrow the interval with one answer: sent at local ``sent_ms``, received at ``received_ms``.

        Never raises: a date that cannot be read, or an answer received
        before it was sent (the local clock stepped back during the call), is
        counted in ``ignored`` and otherwise left out. Local times are whole
        milliseconds cut from the true time, so the low end gets 1 ms of slack.
        """
        date_ms = parse_http_date(date_header)
        frame = self._frame()
        with self._lock:
            if date_ms is None or received_ms < sent_ms:
                self.ignored += 1
                return
            self.samples += 1
            # The frame when the request was sent: this one, unless the wall clock stepped since the last answer,
            # perhaps during this request (then ``sent_ms`` may be of the frame before): either, the looser.
            sent_frame = frame
            if self._last_frame is not None and abs(frame - self._last_frame) > self._slack:
                self.steps += 1  # the wall clock stepped since the last answer (the samples stay right)
                sent_frame = max(frame, self._last_frame)
            self._last_frame = frame
            # In the never-stepping frame (+ frame), with the slack of reading two clocks one after the other.
            low = date_ms - received_ms - 1 + frame - self._slack
            high = date_ms + DATE_RESOLUTION_MS - sent_ms + sent_frame + self._slack
            received_at = received_ms - frame
            # Kept in nondecreasing order of time, even if answers come out of order, so both queues expire alike.
            at_ms = max(received_at, self._lows[-1][0]) if self._lows else received_at
            if self._lows and (low > self._highs[0][1] or high < self._lows[0][1]):
                self.steps += 1  # disjoint from the kept samples' intersection: start again from this one
                self._lows.clear()
                self._highs.clear()
                at_ms = received_at
            self._expire(at_ms - self.keep_ms)
            _push(self._lows, at_ms, low, largest=True)
            _push(self._highs, at_ms, high, largest=False)

    def _expire(self, cutoff_ms: int) -> None:
        """Forget samples received before ``cutoff_ms``, so that a drifting clock is followed."""
        for queue in (self._lows, self._highs):
            while queue and queue[0][0] < cutoff_ms:
                queue.popleft()

    def _interval(self) -> tuple[int, int] | None:
        """The closed interval ``[low, high]`` the offset lies in, or None before any sample (lock held)."""
        if not self._lows:
            return None
        return self._lows[0][1], self._highs[0][1]

    def offset_ms(self) -> int | None:
        """AWS time minus local time: the middle of the interval, rounded down (None before any sample)."""
        return self.snapshot().offset_ms

    def error_ms(self) -> int | None:
        """How far the true offset can be from :meth:`offset_ms`: half the interval, rounded up."""
        return self.snapshot().error_ms

    def bound_ms(self) -> int | None:
        """The largest ``|local - AWS|`` the samples allow (``|offset| + error``): what to hold against the skew.

        :meth:`snapshot`'s ``bound_ms`` without the rest: a processor reads it several times a delivery."""
        frame = self._frame()
        with self._lock:
            return self._bound(frame)

    def _bound(self, frame: int) -> int | None:
        """:meth:`bound_ms` as the wall clock of ``frame`` reads it (lock held)."""
        interval = self._interval()
        if interval is None:
            return None
        return max(abs(interval[0] - frame), abs(interval[1] - frame))

    def snapshot(self) -> ClockSnapshot:
        """Everything at once, taken together (a log line's numbers agree with each other)."""
        frame = self._frame()
        with self._lock:
            interval = self._interval()
            counts = (self.samples, self.steps, self.ignored)
        if interval is None:
            return ClockSnapshot(None, None, None, *counts)
        low, high = interval[0] - frame, interval[1] - frame  # in wall-clock terms, as the wall clock reads now
        offset = (low + high) // 2
        return ClockSnapshot(offset, high - offset, max(abs(low), abs(high)), *counts)

    def changed_since_report(self, threshold_ms: int = REPORT_THRESHOLD_MS) -> bool:
        """Whether a log line is due, and if so count it as made, so that the log follows the clock, not the calls.

        The rule: True when there is a bound and either none was reported
        yet, or the bound moved by more than ``threshold_ms`` from the one
        last reported, or a step was seen since; then the current bound is
        the one reported. False otherwise, and nothing changes.
        """
        frame = self._frame()
        with self._lock:
            bound, steps = self._bound(frame), self.steps  # taken together, as a snapshot takes them
        if bound is None:
            return False
        with self._lock:
            last = self._reported
            if last is not None and abs(bound - last[0]) <= threshold_ms and steps == last[1]:
                return False
            self._reported = (bound, steps)
            return True


def _push(queue: deque[tuple[int, int]], at_ms: int, value: int, *, largest: bool) -> None:
    """Append a sample's end to a monotonic queue whose front is the tightest end (the largest, or the smallest).

    A kept end no tighter than the new one, which expires no later, can never
    again be the tightest: it is dropped.
    """
    while queue and (queue[-1][1] <= value if largest else queue[-1][1] >= value):
        queue.pop()
    queue.append((at_ms, value))


def _far(snapshot: ClockSnapshot | None) -> bool:
    """Is this host's clock measured at least the signature window off AWS time (whatever the error)?"""
    if snapshot is None or snapshot.offset_ms is None:
        return False
    return abs(snapshot.offset_ms) - (snapshot.error_ms or 0) >= SIGNATURE_WINDOW_MS


def blames_the_clock(error: AwsError, snapshot: ClockSnapshot | None = None) -> bool:
    """Did AWS refuse the request because this host's clock is off AWS time (``snapshot``: what was measured)?

    * ``RequestTimeTooSkewed``, ``RequestExpired``, ``RequestInTheFuture``: said outright;
    * ``InvalidSignatureException`` "Signature expired: ..." or "Signature not yet current: ...": the
      request was signed more than 5 minutes from AWS time (a wrong key says "The request signature we
      calculated does not match": not the clock);
    * ``ExpiredTokenException``: the session token has expired by AWS's clock. The credentials are
      refreshed by the local clock, so a clock far behind keeps using ones it takes for fresh: the clock is
      blamed when it is measured at least the signature window off; otherwise the credentials really are
      expired, which no waiting mends.
    """
    if error.code in CLOCK_CODES:
        return True
    if error.code == "InvalidSignatureException":
        return any(phrase in error.message.lower() for phrase in _OUT_OF_WINDOW)
    return error.code == "ExpiredTokenException" and _far(snapshot)


def clock_note(snapshot: ClockSnapshot | None) -> str:
    """What an error line says of this host's clock when AWS refuses its requests for their time."""
    fix = "correct the host's time synchronisation (chronyc tracking, timedatectl)"
    if snapshot is None or snapshot.offset_ms is None:
        return (
            "this host's clock may be more than 5 minutes off AWS time, which AWS refuses a request's signature "
            f"for (not measured yet: no AWS answer carried a usable Date): {fix}"
        )
    offset = snapshot.offset_ms  # AWS time minus local time
    side = "behind" if offset > 0 else "ahead of"
    return (
        f"this host's clock is {abs(offset) / 1000:.1f} s {side} AWS time (±{snapshot.error_ms} ms, measured from "
        f"the Date of AWS's answers; clock_offset_ms {offset}); AWS refuses a request signed more than 5 minutes "
        f"off its time: {fix}"
    )


def naming_the_clock(error: AwsError, snapshot: ClockSnapshot | None) -> AwsError:
    """The error again, its message naming the clock when AWS refused the request for its time (else as is)."""
    if not blames_the_clock(error, snapshot):
        return error
    return type(error)(error.operation, error.code, f"{error.message}; {clock_note(snapshot)}")
