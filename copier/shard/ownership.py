"""Who owns a shard: taking it over, taking it back, and giving it up (docs/protocol.md, "Ownership").

A processor owns a shard from a successful takeover (epoch + 1, conditioned
on the item being unchanged) until one of its conditional writes fails (a
fence: ``ShardSession.fence``). A successor that finds a valid lease
announces itself (so the owner's next write fails and it yields), sleeps out
the lease plus the clock margin, and only then takes over. A fenced
processor takes the shard back, the same way, once the owner that fenced it
is gone. When the processor will put nothing more (a requested shutdown,
the daemon's word that the KCL lease moved) the lease is given up, even
under an announced successor, and a waiting successor sees that at its next
look (every ``RELEASE_POLL_MS``): a lease move costs the new owner the time
until the old processor is told, not a whole lease.

Only the state item's transitions live here; what follows a takeover
(verifying a chunk in flight, loading the window) is the caller's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from copier.core.errors import AwsError, FencedError
from copier.core.positions import Position
from copier.core.state import ShardState, StateConflict
from copier.shard.session import ShardSession

__all__ = ["HOW", "RELEASE_POLL_MS", "Ownership", "SupersededError", "how_taken"]

# How often a successor waiting out a lease reads the state item again: a release ends its wait then. One
# strongly consistent read a second per waiting processor, only while it waits.
RELEASE_POLL_MS = 1000
# Conditional writes a release tries on the item as announced before it gives up (the successor then sleeps out
# the lease): each conflict is the successor raising its recorded bound, or the release's own lost answer.
RELEASE_ATTEMPTS = 3


class SupersededError(FencedError):
    """While this processor waited to take the shard over, another one took it (``Ownership.take_over``): it does
    not announce itself against that owner. ``state`` is the item as that owner wrote it."""

    def __init__(self, state: ShardState) -> None:
        super().__init__(f"epoch {state.epoch} of {state.owner} took the shard over while this processor waited")
        self.state = state


#: What each way of getting a shard says of the lease move that led to it (``how_taken``).
HOW = {
    "new": "the shard had no owner before",
    "released": "its owner gave the shard up (a graceful stop, or the daemon told it the KCL lease moved)",
    "waited": "its owner still held the lease when the KCL gave the shard to this worker (a KCL rebalance, or the "
    "owner's KCL lease ran out while it worked): the lease was waited out",
    "expired": "its owner's lease had run out (it stopped without releasing the shard, or was idle: an idle owner "
    "writes nothing, so its lease is not renewed)",
}


def how_taken(seen: ShardState | None, waited_ms: int | None, now_ms: int) -> dict[str, object]:
    """How a takeover got the shard, from the state it replaced (``seen``) and how long it waited out a lease
    (None: it did not): the ``took_over`` line's ``how`` and the numbers that go with it."""
    if seen is None or seen.owner is None:
        return {"how": "new", "detail": HOW["new"]}
    if seen.lease_until_ms == 0:
        return {"how": "released", "waited_ms": waited_ms, "detail": HOW["released"]}
    if waited_ms is not None:
        return {"how": "waited", "waited_ms": waited_ms, "detail": HOW["waited"]}
    return {"how": "expired", "expired_ms_ago": now_ms - seen.lease_until_ms, "detail": HOW["expired"]}


class Ownership:
    """The state item's ownership transitions for one processor."""

    def __init__(self, session: ShardSession) -> None:
        self.s = session
        self._gave_up: ShardState | None = None  # the state its last release wrote
        self.how: dict[str, object] = {}  # how the last takeover got the shard (``how_taken``), for its log line

    @property
    def given_up(self) -> bool:
        """Whether the lease this processor holds is released: the state it last wrote is its release (a later
        write, a renewal or a take-back, holds the shard again, and may be released again)."""
        return self._gave_up is not None and self.s.state == self._gave_up

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

        It announces itself only against an owner of the epoch it found at its
        first look. An owner of a later epoch took the shard over after this
        processor came (it lost the race for the item, or slept while another
        waiter took it): it is *superseded*, and announces nothing. A
        processor waiting here cannot hear that its KCL lease moved on (the
        daemon talks to it once it returns), so a worker whose KCL lease
        changed hands while its processors waited can hold several waiting
        for one shard; each announcing itself against whichever of them took
        the shard over last fenced every new owner before it committed
        anything, for as long as two waited (a chaos seed on the second
        backend, 5 minutes and 16 epochs without a commit). Superseded, it
        waits (reading the item every second) for the end of that owner's
        lease as it first saw it, plus the clock margin: released by then
        (that owner was the stale one, told so once its own takeover
        returned) or run out (it was killed), the shard is taken over here.
        Returning at once instead, it would be handed its backlog while that
        owner still held the item and hold it until a later delivery, which
        on a quiet shard may never come (the daemon calls no one on an empty
        poll unless configured to). Held still (renewed: an owner at work),
        it raises :class:`SupersededError`: the processor is fenced as any
        other (it holds what the daemon delivers and takes the shard back
        once that owner is gone), and its daemon can tell it if its own
        lease moved.
        """
        s = self.s
        told: tuple[str | None, int] | None = None  # the lease last reported waiting for
        began = s.clock.now_ms()
        waited = False
        first: int | None = None  # the epoch at this processor's first look
        beaten: int | None = None  # superseded: when the later owner's lease as first seen ends, with the margin
        while True:
            seen = self.read()
            now = s.clock.now_ms()
            if first is None:
                first = seen.epoch if seen is not None else 0
            margin = s.margins.between(seen.clock_bound_ms if seen is not None else None)
            held = seen is not None and seen.owner not in (None, s.owner) and seen.lease_until_ms + margin > now
            if seen is not None and held and seen.epoch > first:
                # Superseded: announce nothing. Released or run out within the lease first seen here (a stale
                # owner told so once its takeover returned, or one killed), the shard is taken below; still held
                # after it (an owner at work), this processor stands back.
                if beaten is None:
                    beaten = seen.lease_until_ms + margin
                    s.log.info("waiting_for_release", owner=seen.owner, epoch=seen.epoch, wait_ms=beaten - now)
                if now >= beaten:
                    raise SupersededError(seen)
                waited = True
                s.clock.sleep_ms(min(beaten - now, RELEASE_POLL_MS))
                continue
            if seen is not None and held:
                announced = self._announced(seen)
                if announced is None:
                    continue  # the item changed meanwhile: read it again
                seen = announced
                wait = seen.lease_until_ms + margin - now
                waited = True
                if told != (seen.owner, seen.epoch):
                    told = (seen.owner, seen.epoch)
                    s.log.info("waiting_for_lease", owner=seen.owner, epoch=seen.epoch, wait_ms=wait)
                s.clock.sleep_ms(min(wait, RELEASE_POLL_MS))  # then read again: released, or still held
                continue
            new = self._next_epoch(seen or ShardState(), now)
            try:
                s.retrying("take_over", lambda: s.store.replace_if_unchanged(s.key, seen, new))
            except StateConflict:
                current = self.read()
                if current is not None and current.owner == s.owner and current.epoch == new.epoch:
                    s.state = current  # our own write went through before an ambiguous failure
                    self.how = how_taken(seen, now - began if waited else None, now)
                    return seen
                continue
            s.state = new
            self.how = how_taken(seen, now - began if waited else None, now)
            return seen

    def _announced(self, seen: ShardState) -> ShardState | None:
        """Announce this processor as successor of ``seen``'s valid lease, or raise the successor bound it
        records when this host's is larger; the item as it now is (None: it changed, read it again).

        Announced already (by this processor or a rival), the owner cannot renew. The recorded bound is
        how long a fenced owner leaves the successors (``gone_ms``): the largest of any successor waiting,
        kept up as a bound grows (a clock stepped back, a host measured late) or a second successor waits
        on a slower clock than the one announced.
        """
        s = self.s
        mine = s.margins.own_bound()
        if seen.successor is None:
            new = replace(seen, successor=s.owner, successor_bound_ms=mine, version=seen.version + 1)
        else:
            recorded = s.margins.skew_ms // 2 if seen.successor_bound_ms is None else seen.successor_bound_ms
            # gone_ms' extra lease covers a bound that grew by less than half a lease (the successor's wait
            # moves by twice the growth); a bound creeping up by a millisecond a poll writes nothing
            if mine is None or mine <= recorded + s.config.lease_millis // 4:
                return seen
            new = replace(seen, successor_bound_ms=mine, version=seen.version + 1)
        try:
            s.retrying("announce", lambda: s.store.replace_if_unchanged(s.key, seen, new))
        except StateConflict:
            return None
        return new

    def gone_ms(self, seen: ShardState) -> int:
        """When the owner that fenced this processor is gone: its lease and the clock margin; with an announced
        successor, also the time that successor waits on its own clock, and one more lease period to take
        over first.

        The successor waits until its clock reads the lease's end plus *its* margin against the owner,
        which grows with its own measured bound: a successor on a host whose clock is seconds off waits
        seconds longer. A fenced owner that took the shard back before that wait ended would make the
        successor announce itself again, fencing it again, for ever: neither forwards. (A processor
        waiting in its takeover cannot hear that its KCL lease moved on meanwhile; once it has taken
        over, it hears it and releases.) So the owner waits for the latest moment the successor's clock
        can say so, in this host's clock: its margin, plus its own bound and this host's.
        """
        s = self.s
        margin = s.margins.between(seen.clock_bound_ms)
        if not seen.successor:
            return seen.lease_until_ms + margin
        half = s.margins.skew_ms // 2  # an unmeasured host's assumed bound (ClockMargins.between)
        successor = half if seen.successor_bound_ms is None else seen.successor_bound_ms
        owner = half if seen.clock_bound_ms is None else seen.clock_bound_ms
        own = s.margins.own_bound()
        waits = max(s.margins.skew_ms, successor + owner) + successor + (half if own is None else own)
        return seen.lease_until_ms + max(margin, waits) + s.config.lease_millis

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
            successor_bound_ms=None,
            lease_until_ms=now + s.config.lease_millis,
            updated_ms=now,
            clock_bound_ms=s.margins.own_bound(),
            **s.stalls.fields(),  # a stall an earlier owner recorded is not this one's
        )

    def release(self, retry: bool = True, why: str = "shutdown_requested") -> Position | None:
        """Give the lease up so a successor need not sleep it out; return the committed position.

        Only between the daemon's calls, when the processor puts nothing more
        and every request it sent has been answered (or its answer timed
        out: the ambiguous put, of which nothing lands or becomes readable
        after one more put timeout). A successor may have
        announced itself meanwhile (its wait is what the release shortens):
        the release then goes on the item as announced, conditioned on its
        version, as long as it still names this processor's epoch as owner.

        Not fenced, the last state write succeeded, so every chunk put is
        committed: ``lease_until = 0``, and the successor starts at once.
        Fenced by an announcement (a write after it was refused), a chunk may
        be in flight, put and not committed; its successor verifies it, and
        reads the target up to the lease's end (``InFlight``). So the lease is
        cut to now plus the put timeout, never to 0: every request of this
        processor was answered (or timed out) before now, so what it put is
        readable by then (the protocol's bound, the one an ambiguous put's
        check waits out too), before the successor, which waits for the new
        end and the clock margin, reads. Without this, a lease moved by the KCL while the old
        processor still wrote cost the new one a whole lease (a rolling
        deploy's longest pause).

        ``retry=False`` when the process is on its way out (the daemon is
        gone, or said the lease moved): one attempt, and a failure only costs
        the successor the wait.
        """
        s = self.s
        if s.state is None or s.state.lease_until_ms == 0 or self.given_up:
            return None
        owner, fenced = s.state, s.fenced
        position = owner.position
        try:
            released = self._released(owner, retry, fenced)
        except AwsError as exc:
            if retry:
                raise
            s.log.warning("release_failed", error=str(exc), detail="the next owner sleeps out the lease")
            return None
        if released is None:
            if not fenced:
                s.fence(why)
            return None
        s.emit(now=True)
        s.state = self._gave_up = released
        s.log.info(
            "released",
            position=str(position) if position else None,
            why=why,
            successor=released.successor,
            fenced=fenced,
        )
        return position

    def _released(self, owner: ShardState, retry: bool, fenced: bool) -> ShardState | None:
        """Write the release of ``owner``'s lease (cut to now plus the put timeout when ``fenced``, see
        ``release``); the state written (or found written: an answer lost), or None if another epoch owns the
        shard or a fenced release would not end the successor's wait sooner."""
        s = self.s
        until, bound = 0, owner.clock_bound_ms
        if fenced:
            now, now_bound = s.margins.start()  # a time and the bound of that same moment
            until = now + s.config.put_timeout_millis
            # read on this host's clock now, so with its bound now (a clock stepped since the lease was written)
            bound = max(bound or 0, now_bound) or None

        def attempt(fn: Callable[[], None]) -> None:
            if retry:
                s.retrying("release", fn)
            else:
                fn()

        if not fenced:  # the item as this processor last wrote it, unless a successor announced itself since
            released = replace(owner, lease_until_ms=0, version=owner.version + 1)
            try:
                attempt(lambda: s.store.write(s.key, owner, released))
                return released
            except FencedError:
                pass
        for _ in range(RELEASE_ATTEMPTS):  # on the item as announced (a successor may raise its bound meanwhile)
            current = self.read() if retry else s.store.get(s.key)
            if current is None or current.owner != owner.owner or current.epoch != owner.epoch:
                return None  # the successor took over
            if current.lease_until_ms + (current.clock_bound_ms or 0) <= until + (bound or 0):
                # Ends no later than this release would: released already by this processor (an answer lost;
                # only the owner's epoch changes the lease), or a fenced lease with nothing left to cut.
                return current if current.lease_until_ms < owner.lease_until_ms else None
            released = replace(current, lease_until_ms=until, clock_bound_ms=bound, version=current.version + 1)
            try:
                attempt(lambda: s.store.replace_if_unchanged(s.key, current, released))  # noqa: B023
                return released
            except StateConflict:
                continue  # changed meanwhile (its successor's bound, or this write's lost answer): look again
        return None
