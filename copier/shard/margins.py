"""How far this host's clock may be off AWS time and off another host's: the margins every lease comparison and
every verification read allow.

At least ``copier.clockSkewMillis``; more when the bounds measured against
the ``Date`` of AWS answers (``copier.core.clockcheck``, written into every state
write) say the clocks can differ by more. Said in the log when a margin
widens and when the measured bound moves.
"""

from __future__ import annotations

from typing import Any

from copier.core.clockcheck import ClockBounds
from copier.core.ports import Clock

__all__ = ["ClockMargins"]


class ClockMargins:
    """The margins of one processor's host; ``log`` is read at each use (the session rebinds it)."""

    def __init__(self, skew_ms: int, clock: Clock, bounds: ClockBounds | None, session: Any) -> None:
        self.skew_ms = skew_ms
        self.clock = clock
        self.bounds = bounds
        self.session = session  # for its log
        self._widened = 0  # the last widened margin logged

    def own_bound(self) -> int | None:
        """This host's measured clock bound against AWS time (None: not measured)."""
        return self.bounds.bound_ms() if self.bounds is not None else None

    def aws_ms(self, local_ms: int) -> int:
        """A local time as AWS time (the clock of Kinesis' arrival stamps): plus the measured offset, known to
        within its error (``ClockSnapshot.error_ms``); as is before anything was measured (then off by as much
        as the host's clock is, which ``ClockBoundMs`` shows once measured)."""
        offset = self.bounds.snapshot().offset_ms if self.bounds is not None else None
        return local_ms + (offset or 0)

    def arrival(self) -> int:
        """How far this host's clock may be off Kinesis' arrival stamps (AWS time): the configured skew, or the
        measured bound when it is larger."""
        return max(self.skew_ms, self.own_bound() or 0)

    def between(self, other_bound: int | None) -> int:
        """How far this host's clock and another's (bound ``other_bound``) may differ: at least
        ``copier.clockSkewMillis``; more when the two measured bounds say so (an unmeasured host counts
        half the configured skew, the protocol's assumption)."""
        skew = self.skew_ms
        own = self.own_bound()
        margin = max(skew, (skew // 2 if own is None else own) + (skew // 2 if other_bound is None else other_bound))
        if margin > skew and margin != self._widened:
            self._widened = margin
            self.session.log.warning(
                "clock_margin_widened",
                margin_ms=margin,
                configured_ms=skew,
                own_bound_ms=own,
                other_bound_ms=other_bound,
                detail="the measured clock offsets could exceed copier.clockSkewMillis: leases are given that "
                "much more time (fix the hosts' time sync)",
            )
        return margin

    def start(self) -> tuple[int, int]:
        """This host's clock reading and the bound on its offset from AWS time *at that moment*: read around
        it, so that a step between the two reads is counted (the larger bound). Pairing a time with a bound
        measured later, after a step back, would make a verification read start after what landed."""
        before = self.own_bound() or 0
        now = self.clock.now_ms()
        return now, max(before, self.own_bound() or 0)

    def latest_aws_ms(self) -> int:
        """The latest AWS time it can be now, so the latest Kinesis arrival a put that ended before now can
        carry: this host's clock plus the larger of the configured skew and its bound, read together
        (:meth:`start`), so that a step between the two cannot pair one clock's time with another's bound."""
        now, bound = self.start()
        return now + max(self.skew_ms, bound)

    def note(self) -> None:
        """Log the measured clock bound when it moved (``copier.core.clockcheck``)."""
        bounds = self.bounds
        if bounds is None or not bounds.changed_since_report():
            return
        snap = bounds.snapshot()
        half = self.skew_ms // 2
        log = self.session.log
        level = log.warning if snap.bound_ms is not None and snap.bound_ms > half else log.info
        level(
            "clock_bound",
            offset_ms=snap.offset_ms,
            error_ms=snap.error_ms,
            bound_ms=snap.bound_ms,
            samples=snap.samples,
            steps=snap.steps,
        )
