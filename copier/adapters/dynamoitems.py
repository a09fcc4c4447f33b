"""The state table's items: the PynamoDB model, and the conversions between its items and copier's values.

One model holds both kinds of item (the state item and the digest batches),
so a table needs one schema; ``copier.adapters.dynamo`` does the calls.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pynamodb.attributes import (
    BinaryAttribute,
    BooleanAttribute,
    MapAttribute,
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
)
from pynamodb.models import Model

from copier.core.config import Config
from copier.core.errors import IncompatibleStateError
from copier.core.packing import pack_digests, pack_uints, unpack_digests, unpack_uints
from copier.core.positions import Position
from copier.core.state import STATE_FORMAT, DigestBatch, ShardState

__all__ = ["STATE_SK", "batch_from", "batch_item", "make_model", "state_from", "state_item"]

STATE_SK = "state"


def make_model(config: Config) -> Any:
    """A PynamoDB model bound to the configured table, region and endpoint."""

    class CopierItem(Model):
        class Meta:
            table_name = config.state_table_name
            region = config.region
            host = config.state_endpoint
            max_retry_attempts = 3
            connect_timeout_seconds = 5
            read_timeout_seconds = 10

        pk = UnicodeAttribute(hash_key=True)
        sk = UnicodeAttribute(range_key=True)
        epoch = NumberAttribute(null=True)  # both kinds: the writer's epoch
        # state item
        fmt = NumberAttribute(null=True)
        version = NumberAttribute(null=True)
        owner = UnicodeAttribute(null=True)
        lease_until_ms = NumberAttribute(null=True)
        position = UnicodeAttribute(null=True)
        batches = NumberAttribute(null=True)
        redo_last = UnicodeAttribute(null=True)
        redo = BinaryAttribute(null=True, legacy_encoding=False)
        redo_settings = UnicodeAttribute(null=True)
        redo_suspect = BooleanAttribute(null=True)
        successor = UnicodeAttribute(null=True)
        closed = BooleanAttribute(null=True)
        counters: MapAttribute[str, Any] = MapAttribute(null=True)  # type: ignore[no-untyped-call]
        updated_ms = NumberAttribute(null=True)
        behind_ms = NumberAttribute(null=True)
        window_ids = NumberAttribute(null=True)
        window_oldest_ms = NumberAttribute(null=True)
        window_newest_ms = NumberAttribute(null=True)
        window_cut = BooleanAttribute(null=True)
        clock_bound_ms = NumberAttribute(null=True)  # both kinds: the writer's measured clock bound
        # digest batch
        last = UnicodeAttribute(null=True)
        started_ms = NumberAttribute(null=True)
        arrival_min_ms = NumberAttribute(null=True)
        arrival_max_ms = NumberAttribute(null=True)
        keyed = BinaryAttribute(null=True, legacy_encoding=False)
        unkeyed = BinaryAttribute(null=True, legacy_encoding=False)
        deadletter = BinaryAttribute(null=True, legacy_encoding=False)
        shards = BinaryAttribute(null=True, legacy_encoding=False)
        settings = UnicodeAttribute(null=True)
        dead_ids = BinaryAttribute(null=True, legacy_encoding=False)
        redo_ids = BinaryAttribute(null=True, legacy_encoding=False)
        batch_redo_settings = UnicodeAttribute(null=True)
        expires_at = TTLAttribute(null=True)

    return CopierItem


def _position_str(p: Position | None) -> str | None:
    return None if p is None else str(p)


def _position_from(text: str | None) -> Position | None:
    if not text:
        return None
    seq, _, sub = text.partition("/")
    return Position(int(seq), int(sub or 0))


def state_item(model: Any, key: str, s: ShardState) -> Any:
    """The state item of ``key`` as the model's item."""
    return model(
        key,
        STATE_SK,
        fmt=STATE_FORMAT,
        epoch=s.epoch,
        version=s.version,
        owner=s.owner,
        lease_until_ms=s.lease_until_ms,
        position=_position_str(s.position),
        batches=s.batches,
        redo_last=_position_str(s.redo_last),
        redo=pack_digests(s.redo_digests) or None,
        redo_settings=s.redo_settings or None,
        redo_suspect=s.redo_suspect or None,
        successor=s.successor,
        closed=s.closed or None,
        counters=dict(s.counters) or None,
        updated_ms=s.updated_ms,
        behind_ms=s.behind_ms,
        window_ids=s.window_ids or None,
        window_oldest_ms=s.window_oldest_ms or None,
        window_newest_ms=s.window_newest_ms or None,
        window_cut=s.window_cut or None,
        clock_bound_ms=s.clock_bound_ms,
    )


def state_from(item: Any, table: str) -> ShardState:
    """A state item read back; one in another state format is refused (IncompatibleStateError)."""
    if item.fmt != STATE_FORMAT:
        raise IncompatibleStateError(
            f"{table}: item {item.pk} is in state format {item.fmt or 1}, this copier "
            f"reads format {STATE_FORMAT}: point copier.stateTableName at a new table (see docs/protocol.md)"
        )
    counters = {k: int(v) for k, v in (item.counters.as_dict() if item.counters else {}).items()}
    return ShardState(
        epoch=int(item.epoch or 0),
        version=int(item.version or 0),
        owner=item.owner,
        lease_until_ms=int(item.lease_until_ms or 0),
        position=_position_from(item.position),
        batches=int(item.batches or 0),
        redo_last=_position_from(item.redo_last),
        redo_digests=tuple(unpack_digests(item.redo)),
        redo_settings=item.redo_settings or "",
        redo_suspect=bool(item.redo_suspect),
        successor=item.successor,
        closed=bool(item.closed),
        counters=counters,
        updated_ms=int(item.updated_ms or 0),
        behind_ms=None if item.behind_ms is None else int(item.behind_ms),
        window_ids=int(item.window_ids or 0),
        window_oldest_ms=int(item.window_oldest_ms or 0),
        window_newest_ms=int(item.window_newest_ms or 0),
        window_cut=bool(item.window_cut),
        clock_bound_ms=None if item.clock_bound_ms is None else int(item.clock_bound_ms),
    )


def batch_item(model: Any, key: str, b: DigestBatch, ttl_hours: int) -> Any:
    """A digest batch as the model's item (expiring at its own time, else ``ttl_hours`` after it started)."""
    return model(
        key,
        b.key,
        epoch=b.epoch,
        last=str(b.last),
        started_ms=b.started_ms,
        arrival_min_ms=b.arrival_min_ms,
        arrival_max_ms=b.arrival_max_ms,
        keyed=b.keyed or None,
        unkeyed=b.unkeyed or None,
        deadletter=b.deadletter or None,
        shards=pack_uints(b.target_shards) or None,
        settings=b.settings or None,
        dead_ids=b.dead_ids or None,
        redo_ids=b.redo_ids or None,
        batch_redo_settings=b.redo_settings or None,
        clock_bound_ms=b.clock_bound_ms,
        expires_at=datetime.fromtimestamp(b.expires_ms / 1000, UTC)
        if b.expires_ms
        else datetime.fromtimestamp(b.started_ms / 1000, UTC) + timedelta(hours=ttl_hours),
    )


def batch_from(item: Any) -> DigestBatch:
    """A digest batch read back."""
    last = _position_from(item.last)
    assert last is not None
    return DigestBatch(
        index=int(item.sk.partition("#")[2]),
        epoch=int(item.epoch or 0),
        last=last,
        started_ms=int(item.started_ms or 0),
        keyed=item.keyed or b"",
        unkeyed=item.unkeyed or b"",
        deadletter=item.deadletter or b"",
        arrival_min_ms=int(item.arrival_min_ms or 0),
        arrival_max_ms=int(item.arrival_max_ms or 0),
        target_shards=tuple(unpack_uints(item.shards)),
        settings=item.settings or "",
        dead_ids=item.dead_ids or b"",
        redo_ids=item.redo_ids or b"",
        redo_settings=item.batch_redo_settings or "",
        expires_ms=int(item.expires_at.timestamp() * 1000) if item.expires_at else 0,
        clock_bound_ms=None if item.clock_bound_ms is None else int(item.clock_bound_ms),
    )
