"""A shard's end: closing it once everything is forwarded, whoever forwards it (docs/protocol.md, "Endings").

The daemon asks once: KCL 3.1.3 measured, a processor that answers
``shard_ended`` without a checkpoint has exited, and the daemon then retries
only its own end-of-shard check, once a second, holding the lease with no
processor behind it, forever (chaos seed 36). So a fenced processor does not
return until the shard is done: it waits until the owner that fenced it has
closed the shard (everything forwarded: the checkpoint is due) or is gone
(then it takes the shard back, forwards what it holds and closes the shard
itself).
"""

from __future__ import annotations

from dataclasses import replace

from copier.core.errors import FencedError
from copier.shard.holding import Holding
from copier.shard.ownership import Ownership
from copier.shard.session import ShardSession

__all__ = ["ShardEnd"]


class ShardEnd:
    """Closes the shard in its state item; see the module docstring."""

    def __init__(self, session: ShardSession, ownership: Ownership, holding: Holding) -> None:
        self.s = session
        self.ownership = ownership
        self.holding = holding

    def close(self) -> bool:
        """Mark the shard closed (what waits must have been forwarded first); True if the caller may checkpoint
        SHARD_END."""
        s = self.s
        if s.state is None:
            return False
        while True:
            if s.fenced and self._closed_by_other_owner():
                return True
            try:  # as its owner (taken back if it was fenced)
                s.write(replace(s.state, closed=True))
            except FencedError:
                s.fence("shard_ended")
                continue
            break
        s.log.info("shard_ended", position=str(s.state.position))
        s.emit(now=True)
        return True

    def _closed_by_other_owner(self) -> bool:
        """Fenced at the shard's end: True once the other owner has closed the shard, False once this processor
        has taken it back (and forwarded what it held); in between, sleep until the other owner's lease is over.

        The other owner either keeps its lease because it is at work, and then
        it reaches the end and closes the shard, or it is gone, and then its
        lease runs out. (If the daemon has moved this lease meanwhile, the
        checkpoint that follows fails harmlessly.)
        """
        s = self.s
        waiting_for: tuple[str | None, int] | None = None
        while True:
            seen = self.ownership.read()
            if seen is not None and seen.closed:
                held = len(self.holding.held)
                s.log.info("shard_ended_by_other_owner", owner=seen.owner, epoch=seen.epoch, held=held)
                self.holding.drop()
                return True
            self.holding.take_back(seen, None)
            if not s.fenced:
                return False
            wait = s.config.lease_millis
            if seen is not None:
                wait = min(max(self.ownership.gone_ms(seen) - s.clock.now_ms(), 100), wait)
                if waiting_for != (seen.owner, seen.epoch):
                    waiting_for = (seen.owner, seen.epoch)
                    held = len(self.holding.held)
                    s.log.info("waiting_to_end_shard", owner=seen.owner, epoch=seen.epoch, held=held)
            s.clock.sleep_ms(wait)
