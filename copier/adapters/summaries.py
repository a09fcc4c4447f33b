"""A processor's DescribeStreamSummary answers: its own, the host's (``copier.adapters.summaryshare``) and the
application's (``copier.adapters.summaryboard``), and when it asks (``copier.core.summaryage``,
``copier.core.summaryboard``). ``copier.adapters.kinesis`` makes the call.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from copier.adapters.summaryboard import ApplicationAnswers
from copier.adapters.summaryshare import SummaryShare
from copier.core.config import Config
from copier.core.errors import AwsError
from copier.core.streamsettings import StreamSettings
from copier.core.summaryage import Answer, fresh, latest, may_ask
from copier.core.summaryboard import MAX_AGE_MS, RETRY_MS, adopt, host_answer, posted_fresh

__all__ = ["FIRST_ANSWER_WAIT_S", "StreamSummaries"]

FIRST_ANSWER_WAIT_S = 10.0  # the most a processor with no answer waits for another's call (see _ask)
_NO_ANSWER = Answer()


class StreamSummaries:
    """One processor's stream settings; ``ask_now`` is DescribeStreamSummary (an AwsError goes up)."""

    def __init__(
        self,
        config: Config,
        ask_now: Callable[[str], StreamSettings],
        monotonic: Callable[[], float],
        share: SummaryShare | None,
        board: ApplicationAnswers | None,
    ) -> None:
        self.config = config
        self._ask_now = ask_now
        self._monotonic = monotonic
        self._share = share
        self._board = board
        self._summaries: dict[str, Answer] = {}

    def held(self, stream: str) -> Answer | None:
        """The answer this processor acts on now (None: none yet)."""
        return self._summaries.get(stream)

    def describe(self, stream: str, keep: bool = False) -> StreamSettings:
        """The stream's settings from DescribeStreamSummary now, uncached (a put was just refused: a limit may
        have been lowered since any answer, the application's too); an AwsError goes up. ``keep``: the answer
        becomes this object's and the host's (``share``) as :meth:`settings` would keep it."""
        asked = self._monotonic()
        settings = self._ask_now(stream)
        if keep:
            self._keep(stream, Answer().answered(settings, asked, random.random()))  # noqa: S311 - jitter
        return settings

    def starting(self, stream: str) -> StreamSettings:
        """The stream's settings for ``copier run``'s checks, kept as :meth:`describe` keeps them: their answers
        are the processors' first (a fleet start then asks once per host and stream, not twice); with the
        application's answers (``board``), one at most ``SUMMARY_RETRY_S`` old is taken instead of asking, and
        one asked for is posted (a fleet start then asks once per stream). An AwsError goes up: this call's own
        (posted as the application's failure; asking again at once would spend the throttled account twice)."""
        if self._board is not None:
            failures: list[AwsError] = []

            def ask() -> StreamSettings:
                try:
                    return self._ask_now(stream)
                except AwsError as exc:
                    failures.append(exc)
                    raise

            posted = self._board.answer(stream, RETRY_MS, FIRST_ANSWER_WAIT_S, ask)
            if failures:
                raise failures[0]
            now, now_ms = self._monotonic(), self._board.wall_ms()
            if posted is not None and posted_fresh(posted, now_ms, RETRY_MS, self.config.clock_skew_millis):
                self._keep(stream, host_answer(posted, now_ms, now, random.random()))  # noqa: S311 - jitter
                assert posted.settings is not None, "a fresh answer"
                return posted.settings
        return self.describe(stream, keep=True)

    def _keep(self, stream: str, answer: Answer) -> None:
        self._summaries[stream] = answer
        if self._share is not None:
            self._share.write(stream, answer)

    def settings(self, stream: str, refresh: bool = False) -> StreamSettings | None:
        """The stream's settings from DescribeStreamSummary, as old as ``copier.core.summaryage`` allows (a
        change is seen within ``SUMMARY_MAX_AGE_S``; ``refresh``: within ``SUMMARY_RETRY_S``, when records
        suggest one). One answer per stream is shared by the host's processors (``share``), asked for by the
        first to find it stale while the others go on with the answer they have: never waiting on the call
        (DescribeStreamSummary allows 20 calls a second per account). The last known settings, or None, when
        they cannot be read (the caller falls back and says so), asked again after ``SUMMARY_RETRY_S``."""
        now = self._monotonic()
        held = self._summaries.get(stream, _NO_ANSWER)
        if fresh(held, now, refresh):
            return held.settings
        if self._share is not None:
            held = latest(held, self._share.read(stream))  # another processor's answer, if later
        if not fresh(held, now, refresh) and may_ask(held, now):
            held = self._ask(stream, held, now, refresh)
        self._summaries[stream] = held
        return held.settings

    def _ask(self, stream: str, held: Answer, now: float, refresh: bool) -> Answer:
        """DescribeStreamSummary for the host, when no other processor of it is asking (then: ``held``)."""
        if self._share is None:
            return self._answer(stream, held, now, refresh)
        # One with an answer goes on with it while another asks. One with none (a processor just started) waits
        # a bounded time for the asker's answer: never read, the target might ignore partition keys (AUTO) under
        # copier.ordering = partitionKey, and a guess is what the share must not add. A throttled call answers
        # at once (failed: then the share says so and this one goes on as after its own failure).
        first = held.settings is None and held.failed_s is None
        with self._share.turn(stream, FIRST_ANSWER_WAIT_S if first else 0.0) as mine:
            now = self._monotonic() if first else now  # after a wait: the asker's answer is not from the future
            if not mine:
                return self._answer(stream, held, now, refresh) if first else held  # the asker is stuck
            shared = self._share.read(stream)  # answered while this one waited for its turn?
            if shared is not None and (fresh(shared, now, refresh) or not may_ask(shared, now)):
                return shared
            answer = self._answer(stream, held, now, refresh)
            self._share.write(stream, answer)
            return answer

    def _answer(self, stream: str, held: Answer, now: float, refresh: bool = False) -> Answer:
        """The answer after ``held``: the application's (``board``) when it has one to give, else asked now."""
        if self._board is not None:
            max_age = RETRY_MS if refresh else MAX_AGE_MS
            first = held.settings is None and held.failed_s is None
            posted = self._board.answer(
                stream, max_age, FIRST_ANSWER_WAIT_S if first else 0.0, lambda: self._ask_now(stream)
            )
            now = self._monotonic() if first else now  # after a wait
            skew, draw = self.config.clock_skew_millis, random.random()  # noqa: S311 - jitter, not secrecy
            taken = adopt(posted, held, now, self._board.wall_ms(), max_age, skew, draw)
            if taken is not None:
                return taken
        try:
            return held.answered(self.describe(stream), now, random.random())  # noqa: S311 - jitter, not secrecy
        except AwsError:
            return held.failed(now)
