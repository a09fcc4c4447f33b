"""Rows to events: JSON-safe payloads, event IDs and partition keys."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from copier.core.limits import MAX_PARTITION_KEY_CHARS, record_size
from copier.spark.settings import InvalidRowError, RecordTooLargeError, WriterSettings

__all__ = ["Entry", "canonical_json", "encode_row", "event_id_of", "json_safe", "partition_key_of"]


class Entry(NamedTuple):
    """One row, encoded: its event ID, partition key and JSON payload."""

    event_id: str
    partition_key: str
    data: bytes


def json_safe(value: Any) -> Any:
    """A JSON-serializable copy of a Spark value (the conversions are listed in copier.spark)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, tuple) and hasattr(value, "asDict"):  # a pyspark Row
        return json_safe(value.asDict(recursive=True))
    if isinstance(value, Mapping):
        return {_json_key(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, dt.datetime):
        return (value.astimezone(dt.UTC) if value.tzinfo else value).isoformat()
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value // dt.timedelta(microseconds=1)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "toJson"):  # pyspark VariantVal
        return json.loads(value.toJson())
    raise TypeError(f"cannot convert a {type(value).__name__} to JSON")


def _json_key(key: Any) -> str:
    safe = json_safe(key)
    return safe if isinstance(safe, str) else json.dumps(safe, sort_keys=True, separators=(",", ":"))


def canonical_json(value: Any) -> bytes:
    """UTF-8 JSON with sorted keys and compact separators: one byte string per value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def event_id_of(row: Mapping[str, Any]) -> str:
    """The derived event ID of a row: SHA-256 hex of its canonical JSON.

    Canonical JSON is :func:`json_safe` of the row (a dict, e.g.
    ``Row.asDict(recursive=True)``) dumped with sorted keys, separators
    ``","`` and ``":"``, non-ASCII characters as themselves, encoded as
    UTF-8. The same row gives the same ID in every task attempt and every
    replayed micro-batch; two rows with identical values get the same ID
    (they are one event as far as the copier is concerned: it forwards one).
    Used only for rows that carry no field at the dedup path: a row that
    has one is identified by it (see :func:`encode_row`).
    """
    return hashlib.sha256(canonical_json(json_safe(row))).hexdigest()


def partition_key_of(text: str) -> str:
    """A valid Kinesis partition key for ``text``: itself, or its SHA-256 hex when over 256 characters."""
    if not text:
        raise ValueError("empty partition key")
    if len(text) > MAX_PARTITION_KEY_CHARS:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    return text


def _text(value: Any, what: str) -> str:
    if value is None:
        raise ValueError(f"{what} is null")
    safe = json_safe(value)
    if isinstance(safe, bool | dict | list):
        raise ValueError(f"{what} is a {type(value).__name__}, not a string or number")
    text = safe if isinstance(safe, str) else str(safe)
    if not text:
        raise ValueError(f"{what} is empty")
    return text


def _get_path(payload: Mapping[str, Any], path: Sequence[str]) -> tuple[bool, Any]:
    """(whether the row has a field at ``path``, its value): a null field counts as present."""
    node: Any = payload
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _set_path(payload: dict[str, Any], path: Sequence[str], value: str) -> None:
    node = payload
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"cannot set the event ID at {'.'.join(path)}: {'.'.join(path[: i + 1])} is not an object")
        node = child
    node[path[-1]] = value


def encode_row(row: Any, settings: WriterSettings, position: int, partition: int | None = None) -> Entry:
    """A row (a pyspark Row or a mapping) as an event; errors name the row's position in its partition."""
    where = f"row {position}" + ("" if partition is None else f" of partition {partition}")
    try:
        values = row.asDict(recursive=True) if hasattr(row, "asDict") else dict(row)
        payload = json_safe(values)
        carried, value = _get_path(payload, settings.id_path)
        if settings.id_column is None and carried and value is not None:
            # The row already has an ID where the copier looks for it: that is its ID (never overwritten).
            event_id = _text(value, f"the row's {'.'.join(settings.id_path)} (the dedup path)")
        elif settings.id_column is None and settings.require_id:
            raise ValueError(f"the row has no {'.'.join(settings.id_path)} (the dedup path), and an ID is required")
        elif settings.id_column is None:
            # No ID, or a null one (Spark reads a column some rows lack as null): the derived ID, the same for
            # the same row in every attempt and replay.
            event_id = hashlib.sha256(canonical_json(payload)).hexdigest()
        else:
            if settings.id_column not in values:
                raise ValueError(f"no column {settings.id_column!r} (columns: {', '.join(map(str, values))})")
            event_id = _text(values[settings.id_column], f"the ID column {settings.id_column!r}")
        if settings.partition_key_column is None:
            key = event_id
        else:
            key = _text(
                values.get(settings.partition_key_column), f"partition key column {settings.partition_key_column!r}"
            )
        _set_path(payload, settings.id_path, event_id)
        entry = Entry(event_id, partition_key_of(key), canonical_json(payload))
    except (TypeError, ValueError) as exc:
        raise InvalidRowError(f"{where}: {exc}") from exc
    size = record_size(entry.partition_key, entry.data)
    if size > settings.max_record_bytes:
        raise RecordTooLargeError(event_id, size, settings.max_record_bytes)
    return entry
