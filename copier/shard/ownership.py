"""Who owns a shard: taking it over, taking it back, and giving it up (docs/protocol.md, "Ownership").

A processor owns a shard from a successful takeover (epoch + 1, conditioned
on the item being unchanged) until one of its conditional writes fails (a
fence: ``ShardSession.fence``). A successor that finds a valid lease
announces itself (so the owner's next write fails and it yields), sleeps out
the lease plus the clock margin, and only then takes over. A fenced
processor takes the shard back, the same way, once the owner that fenced it
is gone. On a requested shutdown the lease is given up so that a successor
need not sleep.

Only the state item's transitions live here; what follows a takeover
(verifying a chunk in flight, loading the window) is the caller's.
"""

from __future__ import annotations

from dataclasses import replace

from copier.core.errors import AwsError, FencedError
from copier.core.positions import Position
from copier.core.state import ShardState, StateConflict
from copier.shard.session import ShardSession

__all__ = ["Ownership"]


class Ownership:
    """The state item's ownership transitions for one processor."""

    def __init__(self, session: ShardSession) -> None:
        self.s = session

    def read(self) -> ShardState | None:
        s = self.s
        return s.retrying("get_state", lambda: s.store.get(s.key))

    def take_over(self) -> ShardState | None:
        """Announce this processor as successor of a valid lease and sleep it out, then take the shard; the
        state seen before (None: a new shard).

        The announced owner can no longer renew (its writes are conditioned
        on no successor), so its lease only runs out; the wait ends when this
        host's clock says so, checked again after every sleep (a clock that
        stepped back during it makes the wait longer, never shorter).
        """
        s = self.s
        while True:
            seen = self.read()
            now = s.clock.now_ms()
            margin = s.margins.between(seen.clock_bound_ms if seen is not None else None)
            held = seen is not None and seen.owner not in (None, s.owner) and seen.lease_until_ms + margin > now
            if seen is not None and held:
                if seen.successor != s.owner:
                    try:
                        announced = replace(seen, successor=s.owner, version=seen.version + 1)
                        s.retrying("announce", lambda: s.store.replace_if_unchanged(s.key, seen, announced))
                    except StateConflict:
                        continue
                    seen = announced
                wait = seen.lease_until_ms + margin - now
                s.log.info("waiting_for_lease", owner=seen.owner, epoch=seen.epoch, wait_ms=wait)
                s.clock.sleep_ms(wait)
                continue
            new = self._next_epoch(seen or ShardState(), now)
            try:
                s.retrying("take_over", lambda: s.store.replace_if_unchanged(s.key, seen, new))
            except StateConflict:
                current = self.read()
                if current is not None and current.owner == s.owner and current.epoch == new.epoch:
                    s.state = current  # our own write went through before an ambiguous failure
                    return seen
                continue
            s.state = new
            return seen

    def gone_ms(self, seen: ShardState) -> int:
        """When the owner that fenced this processor is gone: its lease, the clock margin, and for an announced
        successor one more lease period to take over first."""
        margin = self.s.margins.between(seen.clock_bound_ms)
        return seen.lease_until_ms + margin + (self.s.config.lease_millis if seen.successor else 0)

    def take_back(self, seen: ShardState | None) -> bool:
        """A fenced processor takes the shard back from ``seen`` if its owner is gone (a takeover like any
        other: epoch + 1 conditioned on the version read); True if it did."""
        s = self.s
        now = s.clock.now_ms()
        if seen is None or self.gone_ms(seen) > now:
            return False  # the other owner (or an announced successor) may still be at work
        new = self._next_epoch(seen, now)
        try:
            s.retrying("take_back", lambda: s.store.replace_if_unchanged(s.key, seen, new))
        except StateConflict:
            return False
        s.state = new
        s.fenced = False
        s.log = s.log.bind(epoch=new.epoch)
        return True

    def _next_epoch(self, base: ShardState, now: int) -> ShardState:
        s = self.s
        return replace(
            base,
            epoch=base.epoch + 1,
            version=base.version + 1,
            owner=s.owner,
            successor=None,
            lease_until_ms=now + s.config.lease_millis,
            updated_ms=now,
            clock_bound_ms=s.margins.own_bound(),
        )

    def release(self, retry: bool = True) -> Position | None:
        """On a requested shutdown: give the lease up so a successor need not sleep; return the position.

        ``retry=False`` when the process is on its way out (the daemon is
        gone): one attempt, and a failure only costs the successor the wait.
        """
        s = self.s
        if s.fenced or s.state is None or s.state.lease_until_ms == 0:
            return None
        owner = s.state
        position = owner.position
        released = replace(owner, lease_until_ms=0, version=owner.version + 1)
        try:
            if retry:
                s.retrying("release", lambda: s.store.write(s.key, owner, released))
            else:
                s.store.write(s.key, owner, released)
        except FencedError:
            s.fence("shutdown_requested")
            return None
        except AwsError as exc:
            if retry:
                raise
            s.log.warning("release_failed", error=str(exc), detail="the next owner sleeps out the lease")
            return None
        s.emit(now=True)
        s.state = released
        s.log.info("released", position=str(position) if position else None)
        return position
