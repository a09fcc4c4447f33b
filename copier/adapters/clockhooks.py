"""Feeding a :class:`~copier.core.clockcheck.ClockBounds` from the answers copier's AWS clients already receive.

No request of its own: every answer carries a ``Date`` header, and the
time each request left and its answer came back is all the measurement
needs. Two kinds of client feed it:

* botocore clients (the Kinesis clients of ``copier.adapters.kinesis``, PynamoDB's
  DynamoDB client): :func:`watch_botocore` registers on the client's own
  event system. ``before-send`` stamps each attempt's send time into the
  request context (botocore's retries emit it once per attempt, so a retried
  call measures its last attempt), ``response-received`` reads ``Date``
  from each attempt's answer, error answers included; an attempt without an
  answer (a timeout, a dropped connection) has nothing to measure.
  ``response-received`` comes after botocore parsed the answer, so a large
  answer's sample is wider by the parse time: harmless, the intersection is
  set by the tightest samples.
* ``copier.adapters.awsjson.JsonClient``: its ``on_answer`` argument, for which
  :meth:`ClockBounds.observe` itself is the callback.

A handler never raises into botocore: an exception in ``before-send`` would
be taken for a failed send and retried, so measurement could never cost a call.
"""

from __future__ import annotations

import time
from typing import Any

from copier.core.clockcheck import ClockBounds

__all__ = ["wall_ms", "watch_botocore"]

_SENT_KEY = "copier_clock_sent_ms"  # in botocore's per-call request context


def wall_ms() -> int:
    """Local wall-clock time in epoch milliseconds: the clock copier's leases use, so the one to measure."""
    return time.time_ns() // 1_000_000


def watch_botocore(client: Any, bounds: ClockBounds) -> Any:
    """Feed ``bounds`` from every answer ``client`` receives; returns the client. Watching it twice is harmless."""
    events = client.meta.events
    unique = f"copier-clock-{id(bounds)}"
    events.register_last("before-send", _stamp_sent, unique_id=f"{unique}-sent")
    events.register("response-received", _observer(bounds), unique_id=f"{unique}-received")
    return client


def _stamp_sent(request: Any = None, **_: Any) -> None:
    """``before-send``: the attempt's send time, as late as possible (after signing and the other handlers).

    Returns None: a value would be taken as the answer and nothing would be sent.
    """
    try:
        context = getattr(request, "context", None)
        if isinstance(context, dict):
            context[_SENT_KEY] = wall_ms()
    except Exception:  # never cost a call
        pass


def _observer(bounds: ClockBounds) -> Any:
    """A ``response-received`` handler that gives ``bounds`` each answered attempt."""

    def observe(response_dict: Any = None, context: Any = None, **_: Any) -> None:
        try:
            if response_dict is None or not isinstance(context, dict):
                return  # no answer: nothing to measure
            sent_ms = context.get(_SENT_KEY)
            if isinstance(sent_ms, int):
                bounds.observe(sent_ms, wall_ms(), _date(response_dict.get("headers") or {}))
        except Exception:  # never cost a call
            pass

    return observe


def _date(headers: Any) -> str:
    """The ``Date`` header ("" if none): botocore's headers ignore case, a stubbed answer's plain dict may not."""
    return str(headers.get("Date") or headers.get("date") or "")
