"""A shard that stops forwarding: why, since when, said in the journal, the metrics and the state item.

A stall is AWS refusing this shard's request as final (``rejected``: a
``ValidationException`` and the like), AWS refusing this host's requests for
their time (``clock``), or a stream setting that makes exactly-once
impossible (``stream_settings``, ``copier.shard.guard``). The shard keeps its
lease and retries; nothing is skipped.

``copier status`` must tell a stalled shard from a quiet one, and the
journal is on another host: so the stall also goes into the shard's state
item (``stall_reason``, ``stall_detail``, ``stall_since_ms``) with every
owner write (:meth:`StallWatch.fields`). A stall of a Kinesis call is
written at once, once per stall, since the state table takes writes then.
One of the state table's own calls, or of this host's clock, cannot be
written (the write would meet the same refusal): ``copier status`` sees
those by their symptoms instead, the lease and the records waiting in
staging. The fields are cleared when the call that stalled goes through, or
the shard commits again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from copier.core.clockcheck import clock_note
from copier.core.errors import AwsError

if TYPE_CHECKING:
    from copier.shard.session import ShardSession

__all__ = ["STATE_CALLS", "Stall", "StallWatch"]

DETAIL_CHARS = 300  # what a state item keeps of the stalled call's error

#: The calls ``ShardSession.retrying`` makes to the state table: a stall of one of them is not written to it.
STATE_CALLS = frozenset(
    {
        "announce",
        "get_batch",
        "get_parent_state",
        "get_state",
        "load_window",
        "put_batch",
        "release",
        "seal_batch",
        "take_back",
        "take_over",
        "write_state",
    }
)


@dataclass(frozen=True)
class Stall:
    """Why a shard stopped forwarding (``reason``), the call that stalls (for a stream setting: the stream), what
    AWS said or what the setting is (``detail``), and since when (this host's clock, ms)."""

    reason: str
    call: str
    detail: str
    since_ms: int


class StallWatch:
    """One processor's stall, if it is in one; see the module docstring."""

    def __init__(self, session: ShardSession) -> None:
        self.s = session
        self.current: Stall | None = None
        self._recording = False

    def fields(self) -> dict[str, Any]:
        """The state item's stall fields as the stall is now (every owner write carries them)."""
        stall = self.current
        if stall is None:
            return {"stall_reason": None, "stall_detail": "", "stall_since_ms": None}
        return {"stall_reason": stall.reason, "stall_detail": stall.detail, "stall_since_ms": stall.since_ms}

    def begin(self, reason: str, call: str, detail: str) -> None:
        """The shard stops forwarding: in the metrics at once, in the state item with the next owner write; a
        stall that goes on for the same reason keeps the time it began."""
        s = self.s
        s.metrics.stalled = True
        s.metrics.stall_reason = reason
        going_on = self.current is not None and self.current.reason == reason
        since = self.current.since_ms if self.current is not None and going_on else s.clock.now_ms()
        self.current = Stall(reason, call, detail[:DETAIL_CHARS], since)

    def over(self) -> None:
        """The shard moves again: no longer stalled, in the metrics now and in the state item's next write."""
        self.s.metrics.stalled = False
        self.current = None

    def passed(self, call: str) -> None:
        """``call`` went through: if it was what stalled the shard, the stall is over."""
        if self.current is not None and self.current.call == call:
            self.over()

    def refused(self, call: str, error: AwsError, attempt: int) -> None:
        """AWS refuses the request as final: the shard stalls, said each time with why (``reason``: "clock"
        when AWS refused it for this host's clock, the clock's measured offset with it; else "rejected"), and
        written to the state item when it can be."""
        s = self.s
        clock = s.blames_clock(error)
        self.begin("clock" if clock else "rejected", call, f"{call}: {error.code}: {error.message}")
        s.emit()
        said: dict[str, Any] = {}
        detail = "AWS rejects this shard's request; retrying every copier.maxBackoffMillis, nothing is skipped"
        if clock:
            snapshot = s.clock_snapshot()
            said = {"clock_offset_ms": snapshot.offset_ms, "clock_error_ms": snapshot.error_ms} if snapshot else {}
            detail = (
                f"AWS refuses this host's requests for their time: {clock_note(snapshot)}. The shard is kept and "
                "retried every copier.maxBackoffMillis; nothing is skipped"
            )
        s.log.error(
            "shard_stalled",
            call=call,
            code=error.code,
            error=str(error),
            attempt=attempt,
            reason=s.metrics.stall_reason,
            **said,
            detail=detail,
        )
        self._record()

    def _record(self) -> None:
        """Write a new stall to the state item at once, so that ``copier status`` shows it while the call is
        retried: only a stall of a call that is not the state table's and not of this host's clock, by the
        shard's owner, once per stall, never from within that write (a FencedError goes up, as from any owner
        write)."""
        stall, state = self.current, self.s.state
        if stall is None or stall.reason == "clock" or stall.call in STATE_CALLS or self._recording:
            return
        if state is None or self.s.fenced or state.owner != self.s.owner or state.lease_until_ms == 0:
            return  # not the owner (a dry run's look, fenced), or the lease given up: no owner write
        if (state.stall_reason, state.stall_detail) == (stall.reason, stall.detail):
            return  # written already
        self._recording = True
        try:
            self.s.write(state)
        finally:
            self._recording = False
