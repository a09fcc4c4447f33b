"""What ``copier status`` says of redrives and repairs: one line per shard a run has worked on.

A redrive keeps a state item per dead-letter shard (``redrive:<stream>/<shard>``),
a repair one per staging shard (``repair:<stream>/<shard>``): the run's owner,
epoch and lease, the last position it committed, what it sent, and a chunk it
left in flight. From the lease: *running* (a run holds it now), *done* (the
run released it when it finished or was interrupted between chunks), or
*stopped* (a run died or was killed, or a second Ctrl-C stopped it mid-put:
the next run waits out the lease and verifies what it left in flight).
Read with the live shards' items (one BatchGetItem): no scan, no write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from copier.core.config import Config
from copier.core.ports import Streams
from copier.core.state import ShardState, StateStore, shard_key

__all__ = ["PREFIXES", "source_lines"]

PREFIXES = {"redrive": "redrive:", "repair": "repair:"}


def _what(state: ShardState, now_ms: int) -> str:
    if state.lease_until_ms > now_ms:
        return f"running (lease {(state.lease_until_ms - now_ms) / 1000:.1f}s)"
    if state.lease_until_ms == 0:
        return "done"
    return "stopped mid-run (the next run verifies what it left in flight)"


def source_lines(
    config: Config, store: StateStore, streams: Streams, staging: Iterable[str], now_ms: int, as_json: bool = False
) -> list[str]:
    """One line per shard with a redrive item (the dead-letter stream's shards, listed when one is configured) or
    a repair item (``staging``: the staging stream's shard IDs)."""
    shards: dict[str, tuple[str, Iterable[str]]] = {"repair": (config.stream_name, staging)}
    dlq = config.dead_letter_stream_name
    if dlq:
        shards["redrive"] = (dlq, [s["ShardId"] for s in streams.shards(dlq)])
    keys = {
        PREFIXES[kind] + shard_key(stream, shard_id): (kind, shard_id)
        for kind, (stream, ids) in shards.items()
        for shard_id in ids
    }
    found = store.get_many(keys) if keys else {}
    lines = []
    for key in sorted(found):
        kind, shard_id = keys[key]
        state = found[key]
        sent = state.counters.get("forwarded", 0)
        redo = len(state.redo_digests)
        if as_json:
            row = {
                "source": kind,
                "shard": shard_id,
                "run": _what(state, now_ms).split(" (")[0],
                "owner": state.owner,
                "epoch": state.epoch,
                "lease_until_ms": state.lease_until_ms,
                "position": str(state.position) if state.position else None,
                "sent": sent,
                "redo": redo,
            }
            lines.append(json.dumps(row))
            continue
        position = str(state.position) if state.position else "-"
        left = f", {redo} to send again (a run killed mid-put)" if redo else ""
        lines.append(
            f"{kind} {shard_id}: {_what(state, now_ms)}, owner {state.owner or '-'}, epoch {state.epoch}, "
            f"position {position}, sent {sent}{left}"
        )
    return lines
