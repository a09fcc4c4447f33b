"""Record age at the target: how old each forwarded event is when it lands, summarised per metrics interval.

The age of an event is the time its put was answered (the local clock at the
answer, corrected to AWS time by the host's measured offset,
``copier.core.clockcheck``) minus its staging arrival (Kinesis'
``ApproximateArrivalTimestamp``, AWS time): MirrorMaker 2's *record-age*. It
is what a consumer of the target waits, end to end, for an event the
producer wrote to staging.

Why a histogram and not a list of ages: a processor forwards tens of
thousands of events a second, and an interval is a minute. Keeping every age
would cost memory and a sort per interval; a reservoir would make the p99 of
a quiet minute a guess. :class:`AgeHistogram` counts ages in log-linear
buckets (HdrHistogram's layout, 2**SUB_BITS linear sub-buckets per power of
two): adding an age is a few integer operations and a dict increment, and
memory is bounded by the range of ages, not their number (at most a few
thousand buckets however long an interval).

Precision: ages below ``EXACT_BELOW_MS`` (128 ms) are counted exactly; above,
a bucket spans at most 1/64 of its lower end, and a percentile is reported
as its bucket's midpoint, so within 0.8 % of the true nearest-rank value
(and never above the exact maximum). The maximum is exact.

Pure bookkeeping: no clock and no I/O; the engine gives it the time of each
answer (``copier.shard.session.ShardSession.on_landed``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["EXACT_BELOW_MS", "SUB_BITS", "AgeHistogram", "AgeSummary"]

SUB_BITS = 7
EXACT_BELOW_MS = 1 << SUB_BITS  # 128: every age below it has a bucket of its own


def _midpoint(bucket: int) -> int:
    """The middle of the ages a bucket holds (its only age below EXACT_BELOW_MS)."""
    shift = bucket >> SUB_BITS
    if shift == 0:
        return bucket
    top = bucket & (EXACT_BELOW_MS - 1)
    return (top << shift) + ((1 << shift) - 1) // 2


@dataclass(frozen=True)
class AgeSummary:
    """One interval's ages: how many, and the percentiles the metrics report (milliseconds)."""

    count: int
    p50_ms: int
    p99_ms: int
    max_ms: int


class AgeHistogram:
    """Ages in log-linear buckets, cheap to add to and summarised on demand; see the module docstring."""

    __slots__ = ("_counts", "count", "max_ms")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.count = 0
        self.max_ms = 0

    def add_landed(self, landed_ms: int, arrivals: Iterable[int]) -> None:
        """Events that landed at ``landed_ms`` (AWS time), each of the staging arrival given.

        An arrival after the landing (a clock error larger than the measured
        one) counts as age 0; an arrival of 0 or less (the daemon gave none)
        is left out. Written for the hot path: one loop, locals only.
        """
        counts = self._counts
        top = self.max_ms
        n = 0
        for arrival in arrivals:
            if arrival <= 0:
                continue
            age = landed_ms - arrival
            if age < EXACT_BELOW_MS:  # its own bucket (a negative age: 0)
                bucket = age if age > 0 else 0
            else:  # the power of two it is in, and its top SUB_BITS bits within it
                shift = age.bit_length() - SUB_BITS
                bucket = (shift << SUB_BITS) + (age >> shift)
            if age > top:
                top = age
            counts[bucket] = counts.get(bucket, 0) + 1
            n += 1
        self.max_ms = top
        self.count += n

    def add(self, age_ms: int) -> None:
        """One age (tests, and callers with ages at hand)."""
        self.add_landed(age_ms + 1, (1,))

    def percentile(self, q: float) -> int:
        """The nearest-rank ``q`` quantile (0 < q <= 1) as its bucket's midpoint, at most the maximum; 0 if empty."""
        if not self.count:
            return 0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for bucket in sorted(self._counts):
            seen += self._counts[bucket]
            if seen >= rank:
                return min(_midpoint(bucket), self.max_ms)
        return self.max_ms  # not reached: the counts add up to count

    def summary(self) -> AgeSummary | None:
        """This interval's summary (None: nothing landed)."""
        if not self.count:
            return None
        return AgeSummary(self.count, self.percentile(0.5), self.percentile(0.99), self.max_ms)

    def take(self) -> AgeSummary | None:
        """The summary, and the histogram starts empty for the next interval."""
        summary = self.summary()
        self._counts = {}
        self.count = 0
        self.max_ms = 0
        return summary

    @property
    def buckets(self) -> int:
        """How many buckets are in use (what the histogram's memory grows with)."""
        return len(self._counts)
