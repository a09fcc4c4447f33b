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
  item, at least one; a write inside TransactWriteItems costs twice that.
  (DynamoDB bills the larger of the item's size before and after a write;
  the recorder sees only what is written, which is what copier sends.)
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
    for line in recording_lines:
        entry = json.loads(line)
        target = {k.lower(): v for k, v in entry["headers"].items()}.get("x-amz-target", "")
        if not target.startswith("DynamoDB"):
            continue
        operation = target.rpartition(".")[2]
        raw = base64.b64decode(entry["body"]) if entry.get("body_encoded") else (entry.get("body") or "").encode()
        body = json.loads(raw or b"{}")
        if operation == "PutItem":
            yield _billed(operation, body["TableName"], body["Item"], False)
        elif operation == "BatchWriteItem":
            for table, requests in body["RequestItems"].items():
                for request in requests:
                    if "PutRequest" in request:
                        yield _billed(operation, table, request["PutRequest"]["Item"], False)
        elif operation == "TransactWriteItems":
            for action in body["TransactItems"]:
                put = action.get("Put")
                if put is not None:
                    yield _billed(operation, put["TableName"], put["Item"], True)
        elif operation in ("UpdateItem", "DeleteItem"):
            raise ValueError(f"{operation} is not billed here: its size depends on the stored item")


def _billed(operation: str, table: str, item: dict[str, Any], transactional: bool) -> BilledWrite:
    size = item_size(item)
    sort_key = next((v.get("S", "") for k, v in item.items() if k == "sk"), "")
    return BilledWrite(operation, table, sort_key, size, write_units(size, transactional))
