"""A new application started at a point in time: what "before the start" means, and what check-config says of it.

Adding a target (a second region, a migration) is a second copier application
(its own ``applicationName``, so its own KCL lease tables, and its own state
table) reading the same staging stream from a *start* and then live. The KCL
positions each shard there: ``initialPositionInStreamExtended = <epoch
seconds>`` makes a new lease start AT_TIMESTAMP, at the shard's first record
whose staging arrival time (Kinesis' ``ApproximateArrivalTimestamp``) is at or
after the start. So:

* an event is **before the start** when its first copy arrived in staging
  before the start (arrival < start), and **after** it otherwise. The new
  target gets every event after the start exactly once and none before;
* a record that arrived before the start is never forwarded, whoever delivers
  it (``copier.core.plan`` drops it as ``before_start`` and its ID is learned
  by the window, should the daemon deliver one: a lease created by an earlier
  run at TRIM_HORIZON, arrival stamps out of order in a shard); a record
  without an arrival time (:func:`before_start`) is never before the start:
  forwarded, and said (``no_arrival_time``);
* a producer retry after the start of an event before it is not a new event.
  The window recognises retries, and a new application's window is empty, so
  at a shard's first takeover the IDs of what arrived over ``[start -
  dedupWindowSeconds, start)`` are read from staging and kept like forwarded
  ones (``copier.shard.prestart``); the window's rule then holds across the
  start: a retry is dropped if it arrived within ``dedupWindowSeconds`` of its
  first copy, wherever the start falls between them, and forwarded if later
  (the window's horizon, as always).

The KCL takes the start in whole seconds (``Long.parseLong(value) * 1000``),
and only for a lease it creates: a lease table that holds checkpoints resumes
from them. Kinesis refuses an AT_TIMESTAMP later than its own clock.

Pure: :func:`parse_start` for ``copier.core.config``, :func:`judge_start` for
``copier check-config`` (``copier.commands.startcheck`` reads what it judges).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from copier.core.errors import ConfigError
from copier.core.streamsettings import Verdict

__all__ = ["EXTENDED", "NO_ARRIVAL", "Leases", "ShardStates", "before_start", "iso", "judge_start", "parse_start"]

EXTENDED = "initialPositionInStreamExtended"
POSITION = "initialPositionInStream"
_MAX_SECONDS = 10**10  # the year 2286: a larger value is milliseconds typed for seconds
SEQUENCE = "sequence"  # a lease checkpointed at a record (not one of the KCL's sentinels)
HOUR_MS = 3_600_000
# A record without an arrival time (the processor reads the daemon's missing approximateArrivalTimestamp as 0).
NO_ARRIVAL = 0


def before_start(arrival_ms: int, start_ms: int | None) -> bool:
    """Did a record arrive in staging before the application's start (None: no start)? A record without an
    arrival time (:data:`NO_ARRIVAL`) never did: the daemon stamps every Kinesis record, so one without a stamp is
    something else, and dropping it unseen could lose an event after the start; it is forwarded, and said."""
    return start_ms is not None and arrival_ms != NO_ARRIVAL and arrival_ms < start_ms


def parse_start(raw: Mapping[str, str], path: str, lines: Mapping[str, int] | None = None) -> int | None:
    """The application's start in ms from ``initialPositionInStreamExtended``, or None; a ConfigError for what
    the daemon would refuse or read otherwise than meant.

    The daemon takes the timestamp from that key alone (``initialPositionInStream = AT_TIMESTAMP`` stops it:
    "Invalid InitialPosition"), and sets the two keys in a Java Hashtable's order, not the file's: with both
    given, either may win. ``lines``: where each key is, for the error.
    """
    at = lines or {}
    position = raw.get(POSITION, "").strip()
    if position.upper() == "AT_TIMESTAMP":
        raise ConfigError(
            path, POSITION, f"the daemon refuses AT_TIMESTAMP here: give {EXTENDED} = <epoch seconds>", at.get(POSITION)
        )
    value = raw.get(EXTENDED, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 < int(value) < _MAX_SECONDS:
        raise ConfigError(
            path,
            EXTENDED,
            f"expected whole epoch seconds (the daemon multiplies them by 1000), got {value!r}",
            at.get(EXTENDED),
        )
    if position:
        raise ConfigError(
            path,
            POSITION,
            f"given with {EXTENDED}: the daemon applies them in no fixed order; keep {EXTENDED} alone",
            at.get(POSITION),
        )
    return int(value) * 1000


def iso(ms: int) -> str:
    """A time as ISO 8601 UTC to the second."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hours(ms: int) -> str:
    return f"{ms / HOUR_MS:.1f} h"


@dataclass(frozen=True)
class Leases:
    """What a scan of the KCL lease table found: leases by checkpoint (a sentinel such as ``AT_TIMESTAMP``, or
    :data:`SEQUENCE`); ``complete``: every lease was read (else the first page only)."""

    table: str
    exists: bool
    checkpoints: Counter[str] = field(default_factory=Counter)
    complete: bool = True

    @property
    def resumed(self) -> int:
        """Leases the KCL resumes from a checkpoint of its own (the start no longer applies to them)."""
        return self.checkpoints[SEQUENCE] + self.checkpoints["SHARD_END"]


@dataclass(frozen=True)
class ShardStates:
    """What the state table holds for the staging shards listed now."""

    table: str
    shards: int
    # state items with a committed position, by the start they loaded the events before (None: none loaded)
    positions: Counter[int | None] = field(default_factory=Counter)
    loaded: Counter[int] = field(default_factory=Counter)  # prestart_ms recorded -> shards
    other_target: str | None = None  # a digest batch found there was put to this other target


def judge_start(
    start_ms: int,
    now_ms: int,
    retention_ms: int | None,
    window_ms: int,
    staging: str,
    target: str,
    leases: Leases,
    states: ShardStates,
) -> list[Verdict]:
    """What the start means against the staging retention and the application's tables (module docstring)."""
    seconds, window = start_ms // 1000, window_ms // 1000
    out = [
        Verdict(
            staging,
            "ok",
            f"start {iso(start_ms)} ({EXTENDED} = {seconds}): forwards every event that arrived in {staging} at or "
            "after it, none that arrived before; a producer retry after the start of an event that arrived in the "
            f"{window} s before it is dropped until {window} s after the start (each shard reads their IDs from "
            "staging at its first takeover), a retry of an older event, or a later one, is forwarded",
        )
    ]
    new = leases.resumed == 0
    if new:
        out += _against_retention(start_ms, now_ms, retention_ms, window_ms, staging)
    out += _leases(leases)
    out += _states(start_ms, target, new, states)
    return out


def _against_retention(
    start_ms: int, now_ms: int, retention_ms: int | None, window_ms: int, staging: str
) -> list[Verdict]:
    if start_ms > now_ms:
        return [
            Verdict(
                staging,
                "error",
                f"start {iso(start_ms)} is {_hours(start_ms - now_ms)} from now: Kinesis refuses GetShardIterator "
                "AT_TIMESTAMP later than its own clock, and the KCL could start no shard. Start the application "
                "once the start has passed",
            )
        ]
    if retention_ms is None:
        unknown = f"the retention of {staging} could not be read: whether it still holds the records from the start on"
        return [Verdict(staging, "warning", f"{unknown} is unknown")]
    trim = now_ms - retention_ms
    if start_ms < trim:
        return [
            Verdict(
                staging,
                "error",
                f"start {iso(start_ms)} is {_hours(now_ms - start_ms)} ago and {staging} keeps "
                f"{_hours(retention_ms)}: what arrived from the start to {iso(trim)} (the trim horizon) is gone, and "
                "the KCL would start each shard at its oldest record, not at the start. Choose a start after "
                f"{iso(trim)}",
            )
        ]
    out = [
        Verdict(
            staging,
            "ok",
            f"start is {_hours(now_ms - start_ms)} ago, {_hours(start_ms - trim)} inside the retention of {staging} "
            f"({_hours(retention_ms)}): each shard's backlog from the start must be read within that, before the "
            "trim horizon passes it",
        )
    ]
    if start_ms - window_ms < trim:
        out.append(
            Verdict(
                staging,
                "warning",
                f"the {window_ms // 1000} s before the start reach back past the trim horizon ({iso(trim)}): what "
                "arrived before it is gone from staging, so a producer retry after the start of such an event is "
                "forwarded",
            )
        )
    return out


def _leases(leases: Leases) -> list[Verdict]:
    table = f"lease table {leases.table}"
    if not leases.exists or not leases.checkpoints:
        return [Verdict(leases.table, "ok", f"{table}: no lease yet: every shard starts at the start")]
    some = "" if leases.complete else f" (of the first {sum(leases.checkpoints.values())} read)"
    out = []
    if leases.resumed:
        out.append(
            Verdict(
                leases.table,
                "ok",
                f"{table}: {leases.resumed} leases{some} have checkpoints: the KCL resumes those shards from them "
                f"and ignores {EXTENDED}, which applies to a lease without one only",
            )
        )
    if leases.checkpoints["AT_TIMESTAMP"]:
        waiting = leases.checkpoints["AT_TIMESTAMP"]
        out.append(
            Verdict(leases.table, "ok", f"{table}: {waiting} leases{some} not read yet: they start at the start")
        )
    if leases.checkpoints["TRIM_HORIZON"]:
        out.append(
            Verdict(
                leases.table,
                "warning",
                f"{table}: {leases.checkpoints['TRIM_HORIZON']} leases{some} start at TRIM_HORIZON, not at the "
                "start (created by a run without the start): those shards are read from their oldest record, and "
                "copier forwards nothing that arrived before the start, at the cost of reading it",
            )
        )
    if leases.checkpoints["LATEST"]:
        out.append(
            Verdict(
                leases.table,
                "error",
                f"{table}: {leases.checkpoints['LATEST']} leases{some} start at LATEST, not at the start (created "
                "by a run without it): what arrived after the start and before those shards are first read would "
                "never be forwarded. Give the new target a new applicationName (new lease tables) and state table",
            )
        )
    return out


def _states(start_ms: int, target: str, new: bool, states: ShardStates) -> list[Verdict]:
    table = f"state table {states.table}"
    if states.other_target is not None and states.other_target != target:
        return [
            Verdict(
                states.table,
                "error",
                f"{table} holds the digest batches of a copy to {states.other_target}, not to {target}: it is "
                "another application's. Give this one its own (copier.stateTableName, default "
                "<applicationName>-copier-state; copier init)",
            )
        ]
    # positions this application committed after loading the events before its start are its own (a restart
    # before the KCL's first checkpoint); others, with no lease checkpoint, are another application's
    foreign = sum(n for at, n in states.positions.items() if at != start_ms)
    if new and foreign:
        return [
            Verdict(
                states.table,
                "error",
                f"{table} holds committed positions of {foreign} staging shards, and the lease table no "
                "checkpoint: it is another application's. Its processors would take those shards over from it "
                "(fencing it) and go on from its positions, not from the start. A new target needs a new state "
                "table (copier.stateTableName; copier init)",
            )
        ]
    out = []
    moved = sum(n for at, n in states.loaded.items() if at != start_ms)
    if moved:
        others = ", ".join(iso(at) for at in sorted(states.loaded) if at != start_ms)
        out.append(
            Verdict(
                states.table,
                "error",
                f"{table}: {moved} shards began at {others}, not at {iso(start_ms)}: the start was changed after the "
                "application began. Their processors refuse it (a lowered start loses the events between the two, "
                "a raised one forwards retries of events before it): set it back; a new start is a new "
                "application (its own applicationName and state table)",
            )
        )
    began = states.loaded[start_ms]
    out.append(
        Verdict(
            states.table,
            "ok",
            f"{table}: {began} of {states.shards} staging shards hold the events from before the start"
            if began
            else f"{table}: no shard has begun yet",
        )
    )
    return out
