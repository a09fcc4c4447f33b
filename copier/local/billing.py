"""What DynamoDB bills for the writes a backend received: item sizes and write units.

Used by the cost tests and the benchmarks to count the state table's cost
from the requests themselves (moto's request recorder writes them down),
not from what copier believes it sent. The rules are DynamoDB's published
ones ("Item sizes and formats", "Read/write capacity mode"):

* an item's size is the sum, over its attributes, of the name's UTF-8 length
  plus the value's size: a string's UTF-8 length, a binary's byte length, a
  number's ``(significant digits + 1) // 2 + 1`` bytes, 1 for a boolean or
  null, for a list or map 3 bytes plus 1 byte and the size of each element,
  for a set the sizes of its elements;
* a standard write costs one write unit per started KB (1,024 bytes) of the
  item, at least one; a write inside TransactWriteItems costs twice that;
* a write is billed at the larger of the item's size before and after it:
  :func:`billed_writes` follows every item it sees written, so an
  UpdateItem (``SET`` clauses) or a PutItem over an existing item is billed
  as DynamoDB bills it.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["BilledWrite", "attribute_size", "billed_writes", "item_size", "write_units"]

KB = 1024


def _number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").lstrip("0").rstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def attribute_size(value: dict[str, Any]) -> int:
    """Size of one value in DynamoDB's JSON form (``{"S": ...}``, ``{"N": ...}``, ...)."""
    ((kind, body),) = value.items()
    if kind == "S":
        return len(body.encode("utf-8"))
    if kind == "N":
        return _number_size(body)
    if kind == "B":
        return len(base64.b64decode(body))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(v.encode("utf-8")) for v in body)
    if kind == "NS":
        return sum(_number_size(v) for v in body)
    if kind == "BS":
        return sum(len(base64.b64decode(v)) for v in body)
    if kind == "L":
        return 3 + sum(1 + attribute_size(v) for v in body)
    if kind == "M":
        return 3 + sum(1 + len(k.encode("utf-8")) + attribute_size(v) for k, v in body.items())
    raise ValueError(f"unknown DynamoDB type {kind!r}")


def item_size(item: dict[str, dict[str, Any]]) -> int:
    """Bytes DynamoDB counts for an item: names plus values."""
    return sum(len(name.encode("utf-8")) + attribute_size(value) for name, value in item.items())


def write_units(size: int, transactional: bool = False) -> int:
    """Write units billed for writing an item of ``size`` bytes."""
    units = max(1, -(-size // KB))
    return 2 * units if transactional else units


@dataclass(frozen=True)
class BilledWrite:
    """One item written, as billed."""

    operation: str
    table: str
    sort_key: str
    size: int
    units: int


def billed_writes(recording_lines: Iterable[str]) -> Iterator[BilledWrite]:
    """Every item written to any table in a moto request recording (JSON lines), with its billed units."""
    items: dict[tuple[str, str], dict[str, Any]] = {}  # (table, key) -> the item as last written

    def write(
        operation: str, table: str, key: dict[str, Any], after: dict[str, Any], transactional: bool
    ) -> BilledWrite:
        ident = (table, json.dumps(key, sort_keys=True))
        before = items.get(ident)
        items[ident] = after
        size = max(item_size(after), item_size(before) if before else 0)
        sort_key = after.get("sk", {}).get("S", "")
        return BilledWrite(operation, table, sort_key, size, write_units(size, transactional))

    for line in recording_lines:
        entry = json.loads(line)
        target = {k.lower(): v for k, v in entry["headers"].items()}.get("x-amz-target", "")
        if not target.startswith("DynamoDB"):
            continue
        operation = target.rpartition(".")[2]
        raw = base64.b64decode(entry["body"]) if entry.get("body_encoded") else (entry.get("body") or "").encode()
        body = json.loads(raw or b"{}")
        if operation == "PutItem":
            yield write(operation, body["TableName"], _key(body["Item"]), body["Item"], False)
        elif operation == "BatchWriteItem":
            for table, requests in body["RequestItems"].items():
                for request in requests:
                    if "PutRequest" in request:
                        item = request["PutRequest"]["Item"]
                        yield write(operation, table, _key(item), item, False)
        elif operation == "TransactWriteItems":
            for action in body["TransactItems"]:
                put = action.get("Put")
                if put is not None:
                    yield write(operation, put["TableName"], _key(put["Item"]), put["Item"], True)
        elif operation == "UpdateItem":
            table, key = body["TableName"], body["Key"]
            before = items.get((table, json.dumps(key, sort_keys=True)), dict(key))
            after = {**before, **_set_clauses(body)}
            yield write(operation, table, key, after, False)


_KEY_NAMES = ("pk", "sk", "id")


def _key(item: dict[str, Any]) -> dict[str, Any]:
    """The key attributes of an item (copier's tables use pk/sk, the idempotency baseline id)."""
    return {name: item[name] for name in _KEY_NAMES if name in item}


def _set_clauses(body: dict[str, Any]) -> dict[str, Any]:
    """The attributes an UpdateItem's ``SET a = :v, #b = :w`` writes (the only form the baseline uses)."""
    expression = body.get("UpdateExpression", "")
    if not expression.strip().upper().startswith("SET "):
        raise ValueError(f"only SET update expressions are billed here, got {expression!r}")
    names = body.get("ExpressionAttributeNames", {})
    values = body.get("ExpressionAttributeValues", {})
    out: dict[str, Any] = {}
    for clause in expression.strip()[4:].split(","):
        name, _, value = clause.partition("=")
        out[names.get(name.strip(), name.strip())] = values[value.strip()]
    return out
