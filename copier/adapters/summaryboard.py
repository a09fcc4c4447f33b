"""The application's DescribeStreamSummary answers in the state table: read, the turn to ask taken, the answer
posted. The rules are ``copier.core.summaryboard``; this is their I/O.

Nothing here may stop forwarding: a state table that cannot be read or
written (throttled, denied, missing) leaves the host asking for itself
(``ApplicationAnswers.answer`` returns None), as it did before the item.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from copier.core.config import Config
from copier.core.errors import AwsError, CopierError
from copier.core.state import BoardItem, StateConflict, StateStore
from copier.core.streamsettings import StreamSettings
from copier.core.summaryboard import (
    ITEM_LIFE_MS,
    TURN_MS,
    Posted,
    answer_scope,
    answered,
    board_key,
    failing,
    posted_fresh,
    turn_taken,
)

__all__ = ["ApplicationAnswers", "POLL_S"]

MAX_LOST_TURNS = 3  # conditional writes lost to other hosts in a row before going on as if one were asking
POLL_S = 1.0  # how often a host waiting for another's call looks at the item again (one read unit each)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class ApplicationAnswers:
    """One answer per stream for every host of the application (``copier.core.summaryboard``)."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        wall_ms: Callable[[], int] = _wall_ms,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store = store
        self.scope = answer_scope(config)
        self.skew_ms = config.clock_skew_millis
        self._wall_ms = wall_ms
        self._sleep = sleep

    def wall_ms(self) -> int:
        """Now on the clock the item's times are compared with."""
        return self._wall_ms()

    def answer(self, stream: str, max_age_ms: int, wait_s: float, ask: Callable[[], StreamSettings]) -> Posted | None:
        """The application's answer for ``stream``, at most ``max_age_ms`` old: read from the item, or asked
        for (``ask``) by this host once it holds the turn, and posted. Otherwise what the item says: a call
        that failed (``failing``: asked again after ``SUMMARY_RETRY_S``), or another host's turn still running
        after waiting ``wait_s`` for its answer. None when the item cannot be used: the caller asks alone."""
        key = board_key(self.scope, stream)
        deadline = self._wall_ms() + wait_s * 1000
        lost = 0  # turns another host took first: read again at once (its turn, or its answer, is there now)
        try:
            while True:
                item, posted = self._read(key)
                now = self._wall_ms()
                if posted_fresh(posted, now, max_age_ms, self.skew_ms) or failing(posted, now, self.skew_ms):
                    return posted
                if not turn_taken(posted, now, self.skew_ms):
                    taken = self._take_turn(key, item, posted, now)
                    if taken is not None:
                        return self._ask(key, taken, posted, ask)
                    lost += 1
                    if lost <= MAX_LOST_TURNS:
                        continue  # never a sleep here: a host with an answer must not wait on another's write
                if now >= deadline:
                    return posted  # another host is asking: the caller goes on with what it has
                self._sleep(POLL_S)
        except (CopierError, StateConflict):
            return None

    def _read(self, key: str) -> tuple[BoardItem | None, Posted]:
        item = self.store.get_posted(key)
        posted = Posted.decode(item.text) if item is not None else None
        return item, posted if posted is not None else Posted()  # one not understood: never answered

    def _take_turn(self, key: str, item: BoardItem | None, posted: Posted, now: int) -> BoardItem | None:
        """The item with this host's turn in it (a conditional write), or None when another host wrote it first
        (read again: it may hold that host's turn, or its answer)."""
        turn = Posted(posted.settings, posted.asked_ms, posted.expires_ms, posted.failed_ms, now + TURN_MS)
        try:
            return self.store.post(key, item, turn.encode(), now + ITEM_LIFE_MS)
        except StateConflict:
            return None

    def _ask(self, key: str, turn: BoardItem, posted: Posted, ask: Callable[[], StreamSettings]) -> Posted:
        """DescribeStreamSummary for the application, its answer (or failure) posted; a failed post is
        forgotten (another host asks again after the turn)."""
        asked = self._wall_ms()
        try:
            result = answered(ask(), asked, random.random())  # noqa: S311 - jitter, not secrecy
        except AwsError:  # said to the others: nobody asks again before SUMMARY_RETRY_S
            result = Posted(posted.settings, posted.asked_ms, posted.expires_ms, self._wall_ms(), None)
        self._post(key, turn, result)
        return result

    def _post(self, key: str, turn: BoardItem, posted: Posted) -> None:
        try:
            self.store.post(key, turn, posted.encode(), self._wall_ms() + ITEM_LIFE_MS)
        except (CopierError, StateConflict):
            pass
