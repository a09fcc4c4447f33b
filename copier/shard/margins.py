"""How far this host's clock may be off AWS time and off another host's: the margins every lease comparison and
every verification read allow.

At least ``copier.clockSkewMillis``; more when the bounds measured against
the ``Date`` of AWS answers (``copier.core.clockcheck``, written into every state
write) say the clocks can differ by more. Said in the log when a margin
widens and when the measured bound moves, with the cause the numbers show
(``ClockSnapshot.cause``): a warning to fix the time sync only when they
prove this host's clock off by more than its share of the skew (half of
``copier.clockSkewMillis``, the protocol's assumption); a bound that is only
the measurement's error (the interval contains 0: slow round trips, or few
answers yet) widens the margin all the same, said at info. Before issue 45
every widening said "fix the hosts' time sync", on a clean start too
(the first answers leave the interval about a second wide).
"""

from __future__ import annotations

from typing import Any

from copier.core.clockcheck import ClockBounds, ClockSnapshot
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
            snap = self.bounds.snapshot() if self.bounds is not None else None
            skewed = self._skewed(snap)
            own_words = "this host's clock is not measured yet" if snap is None else snap.explained()
            (self.session.log.warning if skewed else self.session.log.info)(
                "clock_margin_widened",
                margin_ms=margin,
                configured_ms=skew,
                own_bound_ms=own,
                other_bound_ms=other_bound,
                cause=snap.cause if snap is not None else None,
                detail=f"the measured clock bounds could exceed copier.clockSkewMillis, so leases are given that "
                f"much more time; {own_words}"
                + ("; fix this host's time sync (chronyc tracking, timedatectl)" if skewed else "")
                + ("" if other_bound is None else "; the other host's bound is in its own clock_bound line"),
            )
        return margin

    def _skewed(self, snap: ClockSnapshot | None) -> bool:
        """Do the numbers prove this host's clock off by more than its share of the configured skew?"""
        shown = snap.shown_skew_ms if snap is not None else None
        return shown is not None and shown > self.skew_ms // 2

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
        log = self.session.log
        skewed = self._skewed(snap)
        (log.warning if skewed else log.info)(
            "clock_bound",
            offset_ms=snap.offset_ms,
            error_ms=snap.error_ms,
            bound_ms=snap.bound_ms,
            samples=snap.samples,
            steps=snap.steps,
            cause=snap.cause,
            detail=snap.explained() + (", more than half of copier.clockSkewMillis: fix this host's time sync "
                                       "(chronyc tracking, timedatectl)" if skewed else ""),
        )
