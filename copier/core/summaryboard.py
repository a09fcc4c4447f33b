"""One DescribeStreamSummary answer per application and stream, kept in the state table: when a host takes the
application's answer, when it asks for it, and how the turn to ask is taken. Pure rules, no I/O
(``copier.adapters.summaryboard`` reads and writes the item, ``copier.adapters.summaries`` asks through
it).

DescribeStreamSummary allows 20 calls a second per **account**. One answer per
host (``copier.core.summaryage``) made the account's rate grow with hosts: 625
hosts of 16 shards, asking for two streams every 150 to 300 s, made 5 calls a
second on average and 18 in the busiest second of a simulated day, over
copier's budget of half the limit. So the host that finds its answer stale
first reads the application's (a strongly consistent GetItem of one item of
the state table, one read unit), and only when that one is stale too asks
Kinesis, after taking the turn to ask with a conditional write: the
application asks once per stream per refresh interval, however many hosts it
runs on.

The item, ``pk = #summary/<scope>/<stream>``, ``sk = summary`` (``#`` is in no
stream name, so no shard's key is ever one of these; the scope is the same as
the host share's, ``copier.adapters.summaryshare``), holds a :class:`Posted`
as JSON and a version for the conditional write. Its times are wall-clock
milliseconds of the host that wrote them, so they are compared with another
host's clock: an answer is taken as at most ``SUMMARY_MAX_AGE_S`` plus the
hosts' clock difference old, which ``copier.clockSkewMillis`` bounds (the same
bound the lease protocol relies on). A time further in the future than that
bound is not trusted (a host with a clock far ahead cannot hold the others
off: its answer is asked again, its turn taken). Nothing here decides what
happens to a record: a setting seen late is one the records or a refused put
show first (``copier.core.streamsettings``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from copier.core.config import Config
from copier.core.streamsettings import SUMMARY_MAX_AGE_S, SUMMARY_RETRY_S, StreamSettings
from copier.core.summaryage import JITTER, Answer, settings_of

__all__ = [
    "BOARD_SK",
    "ITEM_LIFE_MS",
    "TURN_MS",
    "Posted",
    "adopt",
    "answered",
    "board_key",
    "host_answer",
    "mean_refresh_s",
    "failing",
    "posted_fresh",
    "answer_scope",
    "turn_taken",
]

BOARD_SK = "summary"
TURN_MS = 10_000  # a turn to ask, taken: the most one asker holds the others off (a call with its retries)
ITEM_LIFE_MS = 86_400_000  # the item's TTL after its last answer: an application gone a day leaves nothing
# A host's copy of the application's answer goes stale up to this much after the answer's own expiry (drawn by
# the host): the hosts that read one answer do not all look at the item again in the same second.
HOST_SPREAD_MS = 10_000
MAX_AGE_MS = int(SUMMARY_MAX_AGE_S * 1000)
RETRY_MS = int(SUMMARY_RETRY_S * 1000)
FORMAT = 1  # the item's format: another is not read


def answer_scope(config: Config) -> str:
    """16 hex digits naming what an answer is an answer for: the application, its staging and target endpoints
    and the target's account. Two configurations that differ in any of them never share an answer, in the
    state table or in a host's share (``copier.adapters.summaryshare``)."""
    parts = (
        config.application_name,
        config.region,
        config.kinesis_endpoint,
        config.target_region,
        config.target_endpoint,
        config.target_role_arn,
        config.target_external_id,
    )
    return hashlib.sha256("\n".join(str(part) for part in parts).encode()).hexdigest()[:16]


def board_key(scope: str, stream: str) -> str:
    """The item's partition key for ``stream`` under ``scope``."""
    return f"#summary/{scope}/{stream}"


@dataclass(frozen=True)
class Posted:
    """A stream's answer for the application: its settings (None: never answered), when it was asked for and
    when it goes stale, when the last call failed, and until when an asker holds the turn (wall-clock ms)."""

    settings: StreamSettings | None = None
    asked_ms: int | None = None
    expires_ms: int | None = None
    failed_ms: int | None = None
    turn_until_ms: int | None = None

    def encode(self) -> str:
        settings = asdict(self.settings) if self.settings is not None else None
        return json.dumps(
            {
                "format": FORMAT,
                "settings": settings,
                "asked": self.asked_ms,
                "expires": self.expires_ms,
                "failed": self.failed_ms,
                "turn": self.turn_until_ms,
            }
        )

    @classmethod
    def decode(cls, text: str) -> Posted | None:
        """What :meth:`encode` wrote; None for anything else (another version's, a field of another type): the
        item is then asked again and written over, never trusted."""
        try:
            raw: Any = json.loads(text)
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                return None
            settings = settings_of(raw["settings"]) if raw["settings"] is not None else None
            times = [_ms(raw[name]) for name in ("asked", "expires", "failed", "turn")]
            return cls(settings, *times)
        except (ValueError, TypeError, KeyError, RecursionError):
            return None


def _ms(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"not a time in ms: {value!r}")
    return value


def posted_fresh(posted: Posted, now_ms: int, max_age_ms: int, skew_ms: int) -> bool:
    """May this host act on the application's answer ``now_ms``: answered, at most ``max_age_ms`` old, not past
    its expiry, and not asked for later than this host's clock allows (``skew_ms``: the hosts' clock bound)."""
    asked, expires = posted.asked_ms, posted.expires_ms
    if posted.settings is None or asked is None or expires is None:
        return False
    if asked > now_ms + skew_ms or expires - asked > MAX_AGE_MS - HOST_SPREAD_MS:  # a host's copy adds the spread
        return False
    return now_ms - asked <= max_age_ms and now_ms <= expires


def failing(posted: Posted, now_ms: int, skew_ms: int) -> bool:
    """Did the application's last call fail within ``SUMMARY_RETRY_S`` of ``now_ms``? Then nobody asks again
    before that (a throttled account is not asked by every host in turn)."""
    failed = posted.failed_ms
    return failed is not None and failed - skew_ms <= now_ms < failed + RETRY_MS


def turn_taken(posted: Posted, now_ms: int, skew_ms: int) -> bool:
    """Is another asker's turn running ``now_ms``? A turn further ahead than ``TURN_MS`` plus the clock bound
    was taken by a clock this host cannot trust: it is free."""
    until = posted.turn_until_ms
    return until is not None and now_ms < until <= now_ms + TURN_MS + skew_ms


def mean_refresh_s() -> float:
    """The mean time between the application's calls for one stream while they succeed (the expiry is drawn
    uniformly): what the capacity planner divides the streams by. The hosts' copies, up to
    ``HOST_SPREAD_MS`` later, do not lengthen it: the first host to find the answer stale asks."""
    return (MAX_AGE_MS - HOST_SPREAD_MS) / 1000 * (1 - JITTER / 2)


def answered(settings: StreamSettings, asked_ms: int, draw: float) -> Posted:
    """The application's answer, asked for at ``asked_ms``: it expires at a time ``draw`` (uniform in [0, 1))
    places between half and all of ``SUMMARY_MAX_AGE_S`` less ``HOST_SPREAD_MS`` later, so that a host's copy
    (:func:`host_answer`) is never acted on past ``SUMMARY_MAX_AGE_S``; the turn is given back."""
    life = (MAX_AGE_MS - HOST_SPREAD_MS) * (1 - JITTER * draw)
    return Posted(settings, asked_ms, asked_ms + int(life), None, None)


def host_answer(posted: Posted, now_ms: int, now_s: float, draw: float) -> Answer:
    """The host's copy of a fresh application answer (:func:`posted_fresh`), on the host's monotonic clock
    (``now_s`` is ``now_ms`` on it): as old as the answer is, going stale at its expiry plus up to
    ``HOST_SPREAD_MS`` (``draw``)."""
    assert posted.asked_ms is not None and posted.expires_ms is not None, "a fresh answer"
    age_s = max(0, now_ms - posted.asked_ms) / 1000
    left_s = (posted.expires_ms - now_ms + draw * HOST_SPREAD_MS) / 1000
    return Answer(posted.settings, now_s - age_s, now_s + left_s, None)


def adopt(
    posted: Posted | None, held: Answer, now_s: float, now_ms: int, max_age_ms: int, skew_ms: int, draw: float
) -> Answer | None:
    """What a host makes of the application's answer (``posted``; None: the item could not be used) when its
    own (``held``) is stale: a copy of it when fresh (:func:`host_answer`); its own marked failed when the
    application's last call failed (asked again after ``SUMMARY_RETRY_S``); its own, looked at again after
    ``LOOK_AGAIN_S``, while another host's call is out. None: it asks alone (no usable item, or no answer of
    its own while the other host's call did not come)."""
    if posted is None:
        return None
    if posted_fresh(posted, now_ms, max_age_ms, skew_ms):
        return host_answer(posted, now_ms, now_s, draw)
    if failing(posted, now_ms, skew_ms):
        return held.failed(now_s)
    if held.settings is not None and held.expires_s is not None:
        # Not looked at again before LOOK_AGAIN_S, under a refresh too (an answer over SUMMARY_RETRY_S old is
        # stale for it whatever its expiry): ``may_ask`` holds a look back SUMMARY_RETRY_S after a failed call,
        # so the look is dated that much before the next one. Without it, every chunk read the item.
        return replace(
            held, expires_s=max(held.expires_s, now_s + LOOK_AGAIN_S), failed_s=now_s + LOOK_AGAIN_S - RETRY_MS / 1000
        )
    return None


# A host whose answer is stale while another host asks goes on with it and looks at the item again this much
# later (not on its next batch): the turn lasts one call.
LOOK_AGAIN_S = 1.0
