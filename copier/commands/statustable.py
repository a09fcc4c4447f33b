"""``copier status``'s table: one row per staging shard (``copier.commands.status`` reads what it shows).

The *worker* column is the KCL worker holding the shard's lease and whether
it is alive (it reported within the KCL's own expiry: ``copier.core.health``);
*owner* is copier's processor on the shard and *lease* copier's own lease,
which an idle shard lets run out on a healthy worker (it is renewed by
writes). *behind* is what staging holds after the committed position: 0
when nothing waits, else how long the oldest record not yet forwarded has
waited (the records themselves are not counted: that would mean reading
them). *stalled* is a stall the owner recorded, with how long it has lasted.

The *window* column is the horizon of the dedup guarantee: a producer
duplicate of an event forwarded at or after the time shown is dropped; one
of an earlier event is forwarded. ``cut short`` means the count cap
(``copier.dedupWindowMaxEvents``) keeps the window shorter than
``copier.dedupWindowSeconds``.

The *arrived* and *age at landing* columns are the replication checkpoint:
every staging record up to the committed position, the last of which
arrived in staging at the time shown, is in the target (or decided:
dropped as a duplicate, dead-lettered), and that record's chunk had landed
in full the age shown after its arrival (AWS time on both sides,
``copier.core.recordage``). A consumer of the target may take everything
that arrived in staging by then as copied, on that shard.

The *start* column, for an application started at a point in time
(``initialPositionInStreamExtended``, ``copier.core.startpoint``), says where each shard is
against its start, from its state item alone: ``pre-start load`` until the
shard has read the IDs that arrived within the window before the start
(``copier.shard.prestart``: nothing is forwarded meanwhile), then how many
records it left out as arrived before the start (the ``before_start``
counter); ``no pre-start load`` for a shard that planned records before the
start was set. ``-`` without a start.

The *clock* column is the owner's clock measured against AWS time at its
last write (``copier.core.clockcheck``): ``±N ms`` bounds how far its clock can
be off; beyond half of ``copier.clockSkewMillis`` the copier widens its
lease margins and logs ``clock_margin_widened``.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from copier.core.health import Health, span
from copier.core.state import ShardState

__all__ = ["ShardRow", "owner_gone", "render", "rows"]


@dataclass(frozen=True)
class ShardRow:
    shard: str
    shard_state: str
    owner: str
    epoch: int
    lease: str
    position: str
    behind: str
    forwarded: int
    duplicates: int
    replays: int
    dead_lettered: int
    unkeyed: int
    in_flight: str
    window: str
    window_ids: int = 0
    window_oldest_ms: int = 0
    window_newest_ms: int = 0
    window_cut: bool = False
    clock: str = "-"
    clock_bound_ms: int | None = None
    arrived: str = "-"  # the replication checkpoint (_checkpoint)
    age_at_landing: str = "-"
    position_arrival_ms: int | None = None
    position_age_ms: int | None = None
    behind_at_commit_ms: int | None = None  # the daemon's MillisBehindLatest at the last commit
    worker: str = "-"  # the KCL lease's worker and whether it is alive (_liveness)
    worker_id: str | None = None
    worker_alive: bool | None = None
    worker_seen_ms: int | None = None
    waiting: bool | None = None  # records after the committed position (None: not read)
    lag_ms: int | None = None
    oldest_waiting_arrival_ms: int | None = None
    millis_behind_latest: int | None = None
    start: str = "-"  # against the application's start (_start)
    before_start: int = 0
    waiting_error: str | None = None
    stalled: str = "-"
    stall_reason: str | None = None
    stall_detail: str = ""
    stall_since_ms: int | None = None
    problems: tuple[str, ...] = ()


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f}s"


def _span(ms: int) -> str:
    minutes, seconds = divmod(max(0, ms) // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def _window(state: ShardState) -> str:
    """How far back the dedup guarantee reaches: '<ids> IDs since <time> (<span>)'."""
    if not state.window_newest_ms:
        return "-"
    try:
        since = datetime.fromtimestamp(state.window_oldest_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # an arrival no datetime holds (a Java long can)
        since = f"{state.window_oldest_ms} ms"
    cut = ", cut short" if state.window_cut else ""
    return f"{state.window_ids} IDs since {since} ({_span(state.window_newest_ms - state.window_oldest_ms)}{cut})"


def _instant(ms: int) -> str:
    """An epoch-ms time as UTC to the millisecond (one no datetime holds, a Java long can: as a number)."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (ValueError, OverflowError, OSError):
        return f"{ms} ms"


def _checkpoint(state: ShardState) -> dict[str, Any]:
    """The replication checkpoint's columns: when the committed position's record arrived in staging, and how
    long after that its chunk had landed in the target ("-": committed by an earlier copier, or never)."""
    arrival, age = state.position_arrival_ms, state.position_age_ms
    return {
        "arrived": "-" if arrival is None else _instant(arrival),
        "age_at_landing": "-" if age is None else _seconds(age),
        "position_arrival_ms": arrival,
        "position_age_ms": age,
    }


def _start(state: ShardState | None, start_ms: int | None) -> str:
    """Where a shard is against the application's start (module docstring)."""
    if start_ms is None:
        return "-"
    if state is None or (state.prestart_ms is None and state.position is None):
        return "pre-start load"
    left_out = f"{state.counters.get('before_start', 0)} before start left out"
    if state.prestart_ms is None:
        return f"no pre-start load; {left_out}"
    if state.prestart_ms != start_ms:
        return f"loaded for a start at {_instant(state.prestart_ms)}; {left_out}"
    return left_out


def owner_gone(state: ShardState, now_ms: int) -> bool:
    """No live owner: its lease ran out or was released (a batch it left in flight waits for the next)."""
    return state.lease_until_ms <= now_ms


def _liveness(health: Health | None, now_ms: int) -> dict[str, Any]:
    """The worker column: the KCL lease's worker, alive or how long since it reported (and the raw values)."""
    if health is None:
        return {}
    if health.ended:
        text = "- (ended)"
    elif not health.known:  # the KCL's tables could not be read: said below the table
        text = "?" if health.worker is None else f"{health.worker} (?)"
    elif health.worker is None:
        text = "none"
    elif health.alive:
        text = f"{health.worker} alive"
    elif health.worker_seen_ms is None:
        text = f"{health.worker} stopped"
    else:
        text = f"{health.worker} dead ({span(now_ms - health.worker_seen_ms)})"
    return {
        "worker": text,
        "worker_id": health.worker,
        "worker_alive": health.alive,
        "worker_seen_ms": health.worker_seen_ms,
    }


def _behind(health: Health | None) -> dict[str, Any]:
    """The behind column: 0 when nothing waits after the committed position, else the oldest record's wait."""
    waiting = health.waiting if health is not None else None
    if health is None or waiting is None:
        return {}
    if waiting.error is not None:
        text = "cannot read"
    elif not waiting.any:
        text = "0"
    else:
        text = f"{span(health.lag_ms or 0)}" + ("" if waiting.arrival_ms is not None else " or more")
    return {
        "behind": text,
        "waiting": None if waiting.error is not None else waiting.any,
        "lag_ms": health.lag_ms,
        "oldest_waiting_arrival_ms": waiting.arrival_ms,
        "millis_behind_latest": waiting.millis_behind,
        "waiting_error": waiting.error,
    }


def _stall(state: ShardState, now_ms: int) -> dict[str, Any]:
    if not state.stall_reason:
        return {}
    since = state.stall_since_ms
    return {
        "stalled": state.stall_reason + ("" if since is None else f" {span(now_ms - since)}"),
        "stall_reason": state.stall_reason,
        "stall_detail": state.stall_detail,
        "stall_since_ms": since,
    }


def _row(
    shard_id: str,
    open_: bool,
    state: ShardState | None,
    now_ms: int,
    unverified: bool,
    health: Health | None,
    start_ms: int | None = None,
) -> ShardRow:
    kinesis = "open" if open_ else "closed"
    judged = {**_liveness(health, now_ms), **_behind(health), "problems": health.problems if health else ()}
    if state is None:
        return ShardRow(
            shard_id,
            kinesis,
            "-",
            0,
            "-",
            "-",
            judged.pop("behind", "-"),
            0,
            0,
            0,
            0,
            0,
            "-",
            "-",
            start=_start(None, start_ms),
            **judged,
        )
    c = state.counters
    if state.lease_until_ms > now_ms:
        lease = f"valid {_seconds(state.lease_until_ms - now_ms)}"
    else:
        lease = "released" if state.lease_until_ms == 0 else f"expired {_seconds(now_ms - state.lease_until_ms)} ago"
    in_flight = "-"
    if unverified:
        in_flight = "unverified batch"
    elif state.redo_last is not None:
        in_flight = f"redo {len(state.redo_digests)}" + (" (possible duplicates)" if state.redo_suspect else "")
    return ShardRow(
        shard=shard_id,
        shard_state="ended" if state.closed else kinesis,
        owner=state.owner or "-",
        epoch=state.epoch,
        lease=lease,
        position=str(state.position) if state.position else "-",
        behind=judged.pop("behind", "-"),
        forwarded=c.get("forwarded", 0),
        duplicates=c.get("duplicates", 0),
        replays=c.get("replays", 0),
        dead_lettered=c.get("dead_lettered", 0),
        unkeyed=c.get("unkeyed", 0),
        in_flight=in_flight,
        window=_window(state),
        window_ids=state.window_ids,
        window_oldest_ms=state.window_oldest_ms,
        window_newest_ms=state.window_newest_ms,
        window_cut=state.window_cut,
        clock="-" if state.clock_bound_ms is None else f"±{state.clock_bound_ms} ms",
        clock_bound_ms=state.clock_bound_ms,
        behind_at_commit_ms=state.behind_ms,
        **_checkpoint(state),
        **_stall(state, now_ms),
        **judged,
        start=_start(state, start_ms),
        before_start=c.get("before_start", 0),
    )


def rows(
    shards: list[dict[str, Any]],
    states: dict[str, ShardState],
    now_ms: int,
    unverified: Collection[str] = (),
    health: dict[str, Health] | None = None,
    start_ms: int | None = None,
) -> list[ShardRow]:
    """Every shard ListShards knows (open, and closed within the stream's retention).

    ``unverified``: shards whose gone owner left a batch in flight; ``health``: each shard's judged health
    (``copier.core.health``; absent: the worker, behind and problem columns say nothing); ``start_ms``: the
    application's start (``copier.core.config.Config.start_ms``), None when it has none.
    """
    out = []
    for shard in shards:
        shard_id = shard["ShardId"]
        open_ = "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {})
        judged = (health or {}).get(shard_id)
        out.append(_row(shard_id, open_, states.get(shard_id), now_ms, shard_id in unverified, judged, start_ms))
    return out


HEADERS = (
    ("shard", "shard"),
    ("state", "shard_state"),
    ("worker", "worker"),
    ("owner", "owner"),
    ("epoch", "epoch"),
    ("lease", "lease"),
    ("committed position", "position"),
    ("arrived", "arrived"),
    ("age at landing", "age_at_landing"),
    ("behind", "behind"),
    ("stalled", "stalled"),
    ("forwarded", "forwarded"),
    ("duplicates", "duplicates"),
    ("replays", "replays"),
    ("dead-lettered", "dead_lettered"),
    ("unkeyed", "unkeyed"),
    ("in flight", "in_flight"),
    ("start", "start"),
    ("window", "window"),
    ("clock", "clock"),
)


def render(table: list[ShardRow], as_json: bool = False) -> str:
    """An aligned text table (or JSON lines), with a totals line."""
    if as_json:
        return "\n".join(json.dumps({**r.__dict__, "problems": list(r.problems)}) for r in table)
    cells = [[title for title, _ in HEADERS]]
    cells += [[str(getattr(r, attr)) for _, attr in HEADERS] for r in table]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADERS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    total = {attr: sum(getattr(r, attr) for r in table) for attr in ("forwarded", "duplicates", "replays")}
    lines.append(
        f"{len(table)} shards; forwarded {total['forwarded']}, duplicates dropped {total['duplicates']}, "
        f"replays dropped {total['replays']}"
    )
    return "\n".join(lines)
