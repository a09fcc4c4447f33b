"""``copier status``: one line per staging shard from the state table and ListShards.

Read-only: a scan of the state items and one ListShards, safe to run
against production at any time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from copier.state import ShardState

__all__ = ["ShardRow", "rows", "render"]


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


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.1f}s"


def _row(shard_id: str, open_: bool, state: ShardState | None, now_ms: int) -> ShardRow:
    kinesis = "open" if open_ else "closed"
    if state is None:
        return ShardRow(shard_id, kinesis, "-", 0, "-", "-", "-", 0, 0, 0, 0, 0, "-")
    c = state.counters
    if state.lease_until_ms > now_ms:
        lease = f"valid {_seconds(state.lease_until_ms - now_ms)}"
    else:
        lease = "released" if state.lease_until_ms == 0 else f"expired {_seconds(now_ms - state.lease_until_ms)} ago"
    behind = "-"
    if state.behind_ms is not None:
        behind = f"{_seconds(state.behind_ms)} ({_seconds(max(0, now_ms - state.updated_ms))} ago)"
    in_flight = "-"
    if state.pending is not None:
        in_flight = "pending batch"
    elif state.redo_last is not None:
        in_flight = f"redo {len(state.redo_digests)}"
    return ShardRow(
        shard=shard_id,
        shard_state="ended" if state.closed else kinesis,
        owner=state.owner or "-",
        epoch=state.epoch,
        lease=lease,
        position=str(state.position) if state.position else "-",
        behind=behind,
        forwarded=c.get("forwarded", 0),
        duplicates=c.get("duplicates", 0),
        replays=c.get("replays", 0),
        dead_lettered=c.get("dead_lettered", 0),
        unkeyed=c.get("unkeyed", 0),
        in_flight=in_flight,
    )


def rows(shards: list[dict[str, Any]], states: dict[str, ShardState], now_ms: int) -> list[ShardRow]:
    """Every shard ListShards knows, plus any with state only (expired from the stream)."""
    out = []
    seen = set()
    for shard in shards:
        shard_id = shard["ShardId"]
        seen.add(shard_id)
        open_ = "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {})
        out.append(_row(shard_id, open_, states.get(shard_id), now_ms))
    for shard_id, state in sorted(states.items()):
        if shard_id not in seen:
            out.append(_row(shard_id, False, state, now_ms))
    return out


HEADERS = (
    ("shard", "shard"),
    ("state", "shard_state"),
    ("owner", "owner"),
    ("epoch", "epoch"),
    ("lease", "lease"),
    ("committed position", "position"),
    ("behind", "behind"),
    ("forwarded", "forwarded"),
    ("duplicates", "duplicates"),
    ("replays", "replays"),
    ("dead-lettered", "dead_lettered"),
    ("unkeyed", "unkeyed"),
    ("in flight", "in_flight"),
)


def render(table: list[ShardRow], as_json: bool = False) -> str:
    """An aligned text table (or JSON lines), with a totals line."""
    if as_json:
        return "\n".join(json.dumps(r.__dict__) for r in table)
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
