"""When a stream's DescribeStreamSummary answer is asked again, and by whom: one answer per stream shared by a
host's processors, refreshed at jittered times. Pure rules, no I/O (``copier.adapters.summaryshare`` keeps
the shared answer in a file, ``copier.adapters.summaries`` decides when to ask).

DescribeStreamSummary allows 20 calls a second per **account**, shared with
the KCL and every other application of the account. Each processor asking
for itself made the account's rate grow with the number of shards (0.0029
calls a second per shard and stream, measured: 58 a second at 10,000
shards), and processors started together asked together, a burst every 5
minutes. So:

* **One answer per host.** The processors of a host read one answer per
  stream (:class:`Answer`); the first to find it stale asks, the others go
  on with the answer they have meanwhile (never waiting for the call). A
  host asks at most once per stream per refresh interval, however many
  shards it runs: the account's rate grows with hosts, not shards.
* **Jittered refreshes.** An answer expires at a time drawn when it is
  received (:func:`expiry`), between half and all of
  ``SUMMARY_MAX_AGE_S`` later: a switch is still seen within
  ``SUMMARY_MAX_AGE_S``, and hosts started together drift apart instead of
  asking in one burst every 5 minutes.
* **A failure is shared too.** A call that failed (throttled, denied) is
  asked again ``SUMMARY_RETRY_S`` after it by one processor of the host,
  not by each (:func:`may_ask`); the others go on with the last answer
  known, or none (``copier.core.streamsettings.planned_limit``: an unknown
  limit is never guessed).

Times are ``time.monotonic()`` seconds, the same clock for every process
of a host (Linux's ``CLOCK_MONOTONIC``); an answer stamped later than now
(kept across a reboot) is stale.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from copier.core.streamsettings import SUMMARY_MAX_AGE_S, SUMMARY_RETRY_S, StreamSettings

__all__ = ["JITTER", "Answer", "expiry", "fresh", "latest", "may_ask", "settings_of"]

JITTER = 0.5  # an answer expires between (1 - JITTER) and all of SUMMARY_MAX_AGE_S after it came


@dataclass(frozen=True)
class Answer:
    """A stream's last DescribeStreamSummary answer on this host: its settings (None: never answered), when it
    came and when it goes stale, and when the last call failed (None: it did not)."""

    settings: StreamSettings | None = None
    fetched_s: float | None = None
    expires_s: float | None = None
    failed_s: float | None = None

    def answered(self, settings: StreamSettings, now: float, draw: float) -> Answer:
        """This answer replaced by a new one received ``now``; ``draw`` in [0, 1) places its expiry."""
        return Answer(settings, now, expiry(now, draw), None)

    def failed(self, now: float) -> Answer:
        """A call failed ``now``: the last answer is kept, and asked again ``SUMMARY_RETRY_S`` later."""
        return replace(self, failed_s=now)

    def encode(self) -> str:
        """The answer as the host's share keeps it (JSON, with the format's version)."""
        settings = asdict(self.settings) if self.settings is not None else None
        return json.dumps(
            {
                "format": FORMAT,
                "settings": settings,
                "fetched": self.fetched_s,
                "expires": self.expires_s,
                "failed": self.failed_s,
            }
        )

    @classmethod
    def decode(cls, text: str) -> Answer | None:
        """What :meth:`encode` wrote; None for anything else (a file cut short, another version's, a field
        missing or of another type): asked again, never trusted. A processor of another copier version runs
        beside this one during an upgrade in place; a default filled in for a field it did not write (the
        record limit: 1 MiB) would act on a setting nobody read."""
        try:
            raw: Any = json.loads(text)
            if not isinstance(raw, dict) or raw.get("format") != FORMAT:
                return None
            settings = settings_of(raw["settings"]) if raw["settings"] is not None else None
            return cls(settings, _time(raw["fetched"]), _time(raw["expires"]), _time(raw["failed"]))
        except (ValueError, TypeError, KeyError):
            return None


FORMAT = 1  # the share's file format: another is not read
# The Python types of StreamSettings' annotations (a field of a type not here makes every answer untrusted:
# each processor then asks alone, as before the share; tests/test_control_plane_budget.py round-trips them).
_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "int | None": (int, type(None)),
    "str | None": (str, type(None)),
}


def settings_of(raw: Any) -> StreamSettings:
    """Exactly the fields of :class:`StreamSettings`, each of its type, or TypeError."""
    types = {f.name: f.type for f in fields(StreamSettings)}
    if not isinstance(raw, dict) or set(raw) != set(types):
        raise TypeError(f"not the settings of this version: {sorted(raw) if isinstance(raw, dict) else raw!r}")
    for name, value in raw.items():
        kinds = _KINDS.get(str(types[name]))
        if kinds is None or isinstance(value, bool) or not isinstance(value, kinds):
            raise TypeError(f"{name}: {value!r} is not {types[name]}")
    return StreamSettings(**raw)


def _time(value: Any) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"not a time: {value!r}")
    return float(value)


def expiry(now: float, draw: float) -> float:
    """When an answer received ``now`` goes stale: ``draw`` (uniform in [0, 1)) places it between
    ``(1 - JITTER) * SUMMARY_MAX_AGE_S`` and ``SUMMARY_MAX_AGE_S`` later."""
    return now + SUMMARY_MAX_AGE_S * (1 - JITTER * draw)


def fresh(answer: Answer, now: float, refresh: bool) -> bool:
    """May the answer be acted on ``now``? Not past its expiry; with ``refresh`` (records suggest a switch, or
    a setting blocks forwarding) at most ``SUMMARY_RETRY_S`` old. An answer from the future (a clock that
    restarted) is stale."""
    if answer.fetched_s is None or answer.expires_s is None or answer.fetched_s > now:
        return False
    if refresh and now - answer.fetched_s > SUMMARY_RETRY_S:
        return False
    return now <= answer.expires_s


def may_ask(answer: Answer, now: float) -> bool:
    """May DescribeStreamSummary be called for a stale answer ``now``? Not within ``SUMMARY_RETRY_S`` of a
    failed call (the account's budget is not spent on a call that fails on every batch)."""
    failed = answer.failed_s
    return failed is None or not failed <= now < failed + SUMMARY_RETRY_S


def latest(mine: Answer, shared: Answer | None) -> Answer:
    """The later of a processor's answer and the host's: the one received last, and of two received together
    the one whose call failed last (a failure one processor saw holds the others back too)."""
    if shared is None:
        return mine

    def when(answer: Answer) -> tuple[float, float]:
        return (
            answer.fetched_s if answer.fetched_s is not None else float("-inf"),
            answer.failed_s if answer.failed_s is not None else float("-inf"),
        )

    return shared if when(shared) >= when(mine) else mine
