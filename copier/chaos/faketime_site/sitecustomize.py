"""Run at the start of a chaos ``copier process`` under libfaketime (the wrapper puts this directory on PYTHONPATH).

libfaketime 0.9.10 (Debian 12's), with ``FAKETIME_DONT_FAKE_MONOTONIC=1``,
shifts the deadline of ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``
by the wall-clock offset, and the kernel refuses the negative time: Python
3.11's ``time.sleep``, which sleeps that way, fails with EINVAL (libfaketime
issue #426, fixed in 0.9.11). Only where a probe shows that failure,
``time.sleep`` is replaced by a sleep on relative ``select`` timeouts
against the real monotonic clock, which libfaketime leaves as they are; a
fixed libfaketime leaves ``time.sleep`` alone. See ``copier.chaos.clocks``.
"""

from __future__ import annotations

import errno
import select
import time
from typing import SupportsIndex

__all__ = ["monotonic_sleep"]


def monotonic_sleep(seconds: float | SupportsIndex) -> None:
    """``time.sleep`` without ``clock_nanosleep``: at least ``seconds`` of the real monotonic clock."""
    length = float(seconds)  # what time.sleep takes: a number, or an object with __index__
    if length < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + length
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


def _sleep_is_broken() -> bool:
    try:
        time.sleep(0)
    except OSError as error:
        return error.errno == errno.EINVAL
    return False


if _sleep_is_broken():
    time.sleep = monotonic_sleep
