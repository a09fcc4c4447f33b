"""The state table's items as plain values and as DynamoDB JSON, without PynamoDB or botocore.

One definition of what each item holds (:func:`state_fields`,
:func:`batch_fields` and their inverses), used twice: by the PynamoDB model
(``copier.adapters.dynamoitems``, for the commands) and as DynamoDB's JSON
wire format (:func:`to_wire`, :func:`from_wire`) by the lean record processor
(``copier.adapters.leanstate``), which imports neither PynamoDB nor botocore.
``tests/test_state_contract.py`` checks that the two write the same items.
"""

from __future__ import annotations

import base64
import calendar
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from copier.core.errors import IncompatibleStateError
from copier.core.packing import pack_digests, pack_uints, unpack_digests, unpack_uints
from copier.core.positions import Position
from copier.core.state import STATE_FORMAT, BoardItem, DigestBatch, ShardState

__all__ = [
    "BATCH_CONDITION",
    "STATE_SK",
    "board_fields",
    "board_from_fields",
    "WRITE_CONDITION",
    "batch_fields",
    "batch_from_fields",
    "from_wire",
    "state_fields",
    "state_from_fields",
    "to_wire",
]

STATE_SK = "state"
# The conditions of the hot writes (docs/protocol.md): the owner's commit, and a digest batch. The version
# term refuses an owner's own older write that arrives late (a first attempt the client gave up on, applied
# after its retry and later commits): it would roll the item back to a position and index since passed.
WRITE_CONDITION = "#epoch = :epoch AND #owner = :owner AND attribute_not_exists(#successor) AND #version < :version"
#: A digest batch replaces one of a lower epoch, or of its own epoch and a revision no higher (copier.core.replan).
BATCH_CONDITION = (
    "attribute_not_exists(#sk) OR #epoch < :epoch OR "
    "(#epoch = :epoch AND (attribute_not_exists(#revision) OR #revision <= :revision))"
)
TTL_FIELD = "expires_at"  # a TTL attribute: epoch seconds on the wire, a datetime in PynamoDB


def _position_str(p: Position | None) -> str | None:
    return None if p is None else str(p)


def _position_from(text: str | None) -> Position | None:
    if not text:
        return None
    seq, _, sub = text.partition("/")
    return Position(int(seq), int(sub or 0))


def state_fields(s: ShardState) -> dict[str, Any]:
    """The state item's attributes (hash and range key aside) as plain values; None: not written."""
    return {
        "fmt": STATE_FORMAT,
        "epoch": s.epoch,
        "version": s.version,
        "owner": s.owner,
        "lease_until_ms": s.lease_until_ms,
        "position": _position_str(s.position),
        "batches": s.batches,
        "redo_last": _position_str(s.redo_last),
        "redo": pack_digests(s.redo_digests) or None,
        "redo_settings": s.redo_settings or None,
        "redo_suspect": s.redo_suspect or None,
        "successor": s.successor,
        "successor_bound_ms": s.successor_bound_ms,
        "closed": s.closed or None,
        "counters": dict(s.counters) or None,
        "updated_ms": s.updated_ms,
        "behind_ms": s.behind_ms,
        "window_ids": s.window_ids or None,
        "window_oldest_ms": s.window_oldest_ms or None,
        "window_newest_ms": s.window_newest_ms or None,
        "window_cut": s.window_cut or None,
        "window_ms": s.window_ms,
        "clock_bound_ms": s.clock_bound_ms,
        "prestart_ms": s.prestart_ms,
        "position_arrival_ms": s.position_arrival_ms,
        "position_age_ms": s.position_age_ms,
        "stall_reason": s.stall_reason,
        "stall_detail": s.stall_detail or None,
        "stall_since_ms": s.stall_since_ms,
    }


def _optional_int(value: Any) -> int | None:
    """A number that may be absent (an item an earlier copier wrote): None then."""
    return None if value is None else int(value)


def state_from_fields(f: Mapping[str, Any], table: str) -> ShardState:
    """A state item read back (plain values); one in another state format is refused (IncompatibleStateError)."""
    if f.get("fmt") != STATE_FORMAT:
        raise IncompatibleStateError(
            f"{table}: item {f.get('pk')} is in state format {f.get('fmt') or 1}, this copier "
            f"reads format {STATE_FORMAT}: point copier.stateTableName at a new table (see docs/protocol.md)"
        )
    behind, bound, successor_bound = f.get("behind_ms"), f.get("clock_bound_ms"), f.get("successor_bound_ms")
    window = f.get("window_ms")
    prestart = f.get("prestart_ms")
    return ShardState(
        epoch=int(f.get("epoch") or 0),
        version=int(f.get("version") or 0),
        owner=f.get("owner"),
        lease_until_ms=int(f.get("lease_until_ms") or 0),
        position=_position_from(f.get("position")),
        batches=int(f.get("batches") or 0),
        redo_last=_position_from(f.get("redo_last")),
        redo_digests=tuple(unpack_digests(f.get("redo"))),
        redo_settings=f.get("redo_settings") or "",
        redo_suspect=bool(f.get("redo_suspect")),
        successor=f.get("successor"),
        successor_bound_ms=None if successor_bound is None else int(successor_bound),
        closed=bool(f.get("closed")),
        counters={k: int(v) for k, v in (f.get("counters") or {}).items()},
        updated_ms=int(f.get("updated_ms") or 0),
        behind_ms=None if behind is None else int(behind),
        window_ids=int(f.get("window_ids") or 0),
        window_oldest_ms=int(f.get("window_oldest_ms") or 0),
        window_newest_ms=int(f.get("window_newest_ms") or 0),
        window_cut=bool(f.get("window_cut")),
        window_ms=None if window is None else int(window),
        clock_bound_ms=None if bound is None else int(bound),
        prestart_ms=None if prestart is None else int(prestart),
        position_arrival_ms=_optional_int(f.get("position_arrival_ms")),
        position_age_ms=_optional_int(f.get("position_age_ms")),
        stall_reason=f.get("stall_reason"),
        stall_detail=f.get("stall_detail") or "",
        stall_since_ms=_optional_int(f.get("stall_since_ms")),
    )


def batch_fields(b: DigestBatch, ttl_hours: int) -> dict[str, Any]:
    """A digest batch's attributes (hash and range key aside), expiring at its own time, else ``ttl_hours``
    after it started (``expires_at``: a datetime, as PynamoDB's TTL attribute takes it)."""
    return {
        "epoch": b.epoch,
        "last": str(b.last),
        "started_ms": b.started_ms,
        "arrival_min_ms": b.arrival_min_ms,
        "arrival_max_ms": b.arrival_max_ms,
        "keyed": b.keyed or None,
        "unkeyed": b.unkeyed or None,
        "deadletter": b.deadletter or None,
        "shards": pack_uints(b.target_shards) or None,
        "settings": b.settings or None,
        "dead_ids": b.dead_ids or None,
        "redo_ids": b.redo_ids or None,
        "batch_redo_settings": b.redo_settings or None,
        "clock_bound_ms": b.clock_bound_ms,
        "revision": b.revision or None,
        "before_ids": b.before_ids or None,
        TTL_FIELD: _expiry(b.expires_ms) if b.expires_ms else _expiry(b.started_ms) + timedelta(hours=ttl_hours),
    }


#: The latest expiry a TTL attribute holds here (a datetime, as PynamoDB's ``TTLAttribute`` takes it).
_LATEST_EXPIRY = datetime(9000, 1, 1, tzinfo=UTC)


def board_fields(item: BoardItem, expires_ms: int) -> dict[str, Any]:
    """An application item's attributes (``copier.core.summaryboard``): its version, its text, its TTL."""
    return {"version": item.version, "posted": item.text, TTL_FIELD: _expiry(expires_ms)}


def board_from_fields(f: Mapping[str, Any]) -> BoardItem:
    """An application item read back; TypeError for one copier did not write (a version or text missing)."""
    version, text = f.get("version"), f.get("posted")
    if not isinstance(version, int) or isinstance(version, bool) or not isinstance(text, str):
        raise TypeError(f"not an application item: version {version!r}, posted {type(text).__name__}")
    return BoardItem(version, text)


def _expiry(ms: int) -> datetime:
    """An expiry in epoch milliseconds as a TTL datetime, at most ``_LATEST_EXPIRY``. A digest batch expires
    after its newest staging arrival (``copier.shard.pipeline``), and an arrival is a number the daemon passes
    on as a Java long: one far past a datetime's year 9999 must not fail the batch's write (the processor would
    exit on every delivery, as ``tests/test_protocol.py`` found with the largest long). Such a batch never
    expires."""
    if ms >= _LATEST_EXPIRY.timestamp() * 1000:
        return _LATEST_EXPIRY
    return datetime.fromtimestamp(max(ms, 0) / 1000, UTC)


def batch_from_fields(f: Mapping[str, Any]) -> DigestBatch:
    """A digest batch read back (plain values; ``expires_at`` a datetime or None)."""
    last = _position_from(f.get("last"))
    if last is None:
        raise ValueError(f"digest batch {f.get('sk')} has no last position")
    bound, expires = f.get("clock_bound_ms"), f.get(TTL_FIELD)
    return DigestBatch(
        index=int(str(f["sk"]).partition("#")[2]),
        epoch=int(f.get("epoch") or 0),
        last=last,
        started_ms=int(f.get("started_ms") or 0),
        keyed=f.get("keyed") or b"",
        unkeyed=f.get("unkeyed") or b"",
        deadletter=f.get("deadletter") or b"",
        arrival_min_ms=int(f.get("arrival_min_ms") or 0),
        arrival_max_ms=int(f.get("arrival_max_ms") or 0),
        target_shards=tuple(unpack_uints(f.get("shards"))),
        settings=f.get("settings") or "",
        dead_ids=f.get("dead_ids") or b"",
        redo_ids=f.get("redo_ids") or b"",
        redo_settings=f.get("batch_redo_settings") or "",
        expires_ms=int(expires.timestamp() * 1000) if expires else 0,
        clock_bound_ms=None if bound is None else int(bound),
        revision=int(f.get("revision") or 0),
        before_ids=f.get("before_ids") or b"",
    )


def _value(value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, int):
        return {"N": str(value)}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, bytes):
        return {"B": base64.b64encode(value).decode()}
    if isinstance(value, datetime):  # a TTL attribute: whole epoch seconds, as PynamoDB writes it
        return {"N": str(calendar.timegm(value.utctimetuple()))}
    if isinstance(value, dict):
        return {"M": {k: _value(v) for k, v in value.items()}}
    raise TypeError(f"no DynamoDB type for {type(value).__name__}")


def to_wire(pk: str, sk: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """An item in DynamoDB's JSON (binaries in base64), attributes that are None left out.

    Numbers and strings, most of an item, are written here (exactly ``int`` and ``str``: a subclass, such as
    ``bool``, goes through :func:`_value` as before): two writes of about thirty attributes a delivery."""
    item = {"pk": {"S": pk}, "sk": {"S": sk}}
    for name, value in fields.items():
        if value is None:
            continue
        kind = type(value)
        if kind is int:
            item[name] = {"N": str(value)}
        elif kind is str:
            item[name] = {"S": value}
        else:
            item[name] = _value(value)
    return item


def _plain(name: str, value: Mapping[str, Any]) -> Any:
    ((kind, raw),) = value.items()
    if kind == "N":
        number = int(raw) if raw.lstrip("-").isdigit() else float(raw)
        return datetime.fromtimestamp(number, UTC) if name == TTL_FIELD else number
    if kind == "B":
        return base64.b64decode(raw)
    if kind == "M":
        return {k: _plain(k, v) for k, v in raw.items()}
    if kind in ("S", "BOOL"):
        return raw
    if kind == "NULL":
        return None
    raise ValueError(f"attribute {name}: DynamoDB type {kind} is not one copier writes")


def from_wire(item: Mapping[str, Any]) -> dict[str, Any]:
    """An item from DynamoDB's JSON as plain values (the inverse of :func:`to_wire`)."""
    return {name: _plain(name, value) for name, value in item.items()}
