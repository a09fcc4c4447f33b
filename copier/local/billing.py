"""What DynamoDB bills for the requests a backend received: item sizes, write and read units.

Used by the cost tests and the benchmarks to count the state table's cost
from the requests themselves (moto's request recorder writes them down),
not from what copier believes it sent. The rules are DynamoDB's published
ones ("Item sizes and formats", CapacityUnitCalculations.html; "Read and
write operations", read-write-operations.html; "Capacity units consumed by
conditional writes", WorkingWithItems.html):

* an item's size is the sum, over its attributes, of the name's UTF-8 length
  plus the value's size: a string's UTF-8 length, a binary's byte length, a
  number's size (below), 1 for a boolean or null, for a list or map 3 bytes
  plus 1 byte and the size of each element, for a set the sizes of its
  elements;
* a number: AWS documents "approximately 1 byte per two significant digits,
  plus 1 byte". The exact form counted here is the one dynalite implements:
  the significant digits are paired from the decimal point (base 100), so
  ``120`` (``01|20``) is 3 bytes where a plain ``(digits + 1) // 2 + 1``
  says 2; a negative number takes one byte more; zero is 1 byte.
  ``tests/test_billing_crosscheck.py`` holds the two to each other;
* a standard write costs one write unit per started KB (1,024 bytes) of the
  item, at least one; a write inside TransactWriteItems costs twice that;
* a write is billed at the larger of the item's size before and after it:
  :class:`Ledger` follows every item it sees written, so an UpdateItem
  (``SET`` clauses) or a PutItem over an existing item is billed as DynamoDB
  bills it. A conditional write whose condition fails is billed too (the
  same units: AWS's "Read and write operations" page bills it by the larger
  item; its WorkingWithItems page names the existing item's size, or 1 unit
  when there is none, so this is the upper of AWS's two descriptions), and
  leaves the item as it was;
* a read costs one read unit per started 4 KB of each item (BatchGetItem:
  each item rounded on its own; Query: the items' sizes summed, then
  rounded), half that when eventually consistent; a GetItem of no item
  costs as a 4 KB one.

moto's request recorder keeps the requests and not the answers, so
:func:`billed_writes` over a recording takes every write as succeeded: a
failed conditional write is then billed right but its item is followed as
if written. The benchmarks' steady-state runs make no write that fails.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

__all__ = [
    "BilledWrite",
    "Ledger",
    "attribute_size",
    "billed_writes",
    "item_size",
    "query_units",
    "read_units",
    "write_units",
]

KB = 1024
READ_KB = 4 * KB


def _number_size(text: str) -> int:
    """Bytes of a number: its significant digits in base 100 (paired from the decimal point), a byte for the
    exponent, one more when negative (the module docstring)."""
    sign, all_digits, exponent = Decimal(text).as_tuple()  # exact: no context rounds (38 digits exceed its 28)
    assert isinstance(exponent, int)  # a finite number (DynamoDB has no NaN or infinity)
    digits = "".join(map(str, all_digits)).lstrip("0")
    if not digits:
        return 1
    exponent += len(digits) - len(digits := digits.rstrip("0"))  # trailing zeros into the exponent
    # The digits padded so that they start and end on a pair boundary counted from the decimal point.
    lead = (len(digits) + exponent) % 2  # an odd count of digits before the point: one pad digit in front
    trail = exponent % 2  # an odd exponent: the last digit stands alone in its pair
    pairs = (lead + len(digits) + trail) // 2
    return 1 + pairs + (1 if sign else 0)


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


def read_units(size: int | None, consistent: bool) -> float:
    """Read units billed for reading one item of ``size`` bytes (None: no such item, billed as a 4 KB one)."""
    units = max(1, -(-(size or 0) // READ_KB))
    return units if consistent else units / 2


def query_units(sizes: Iterable[int], consistent: bool) -> float:
    """Read units billed for a Query page returning items of these sizes: their sum, rounded up to 4 KB once."""
    units = -(-sum(sizes) // READ_KB)
    return units if consistent else units / 2


class Ledger:
    """The items of every table as the requests seen so far left them, and what each request is billed.

    Why a ledger: a write is billed at the larger of the item before and after it, and a read by the size of
    the item it finds, so the figure for one request depends on the requests before it.
    """

    def __init__(self) -> None:
        self.items: dict[tuple[str, str], dict[str, Any]] = {}  # (table, key) -> the item as last written

    def _ident(self, table: str, key: dict[str, Any]) -> tuple[str, str]:
        return (table, json.dumps(key, sort_keys=True))

    def _write(
        self, operation: str, table: str, key: dict[str, Any], after: dict[str, Any], transactional: bool, failed: bool
    ) -> BilledWrite:
        ident = self._ident(table, key)
        before = self.items.get(ident)
        if not failed:
            self.items[ident] = after
        size = max(item_size(after), item_size(before) if before else 0)
        sort_key = after.get("sk", {}).get("S", "")
        return BilledWrite(operation, table, sort_key, size, write_units(size, transactional))

    def write(self, operation: str, body: dict[str, Any], failed: bool = False) -> list[BilledWrite]:
        """The items a write request writes, billed; ``failed``: its condition did not hold (nothing changes)."""
        if operation == "PutItem":
            return [self._write(operation, body["TableName"], _key(body["Item"]), body["Item"], False, failed)]
        if operation == "BatchWriteItem":
            return [
                self._write(operation, table, _key(r["PutRequest"]["Item"]), r["PutRequest"]["Item"], False, failed)
                for table, requests in body["RequestItems"].items()
                for r in requests
                if "PutRequest" in r
            ]
        if operation == "TransactWriteItems":
            puts = [action["Put"] for action in body["TransactItems"] if "Put" in action]
            return [self._write(operation, p["TableName"], _key(p["Item"]), p["Item"], True, failed) for p in puts]
        if operation == "UpdateItem":
            table, key = body["TableName"], body["Key"]
            before = self.items.get(self._ident(table, key), dict(key))
            return [self._write(operation, table, key, {**before, **_set_clauses(body)}, False, failed)]
        return []

    def size_of(self, table: str, key: dict[str, Any]) -> int | None:
        """The size of the item under ``key`` as the writes seen left it (None: no such item)."""
        item = self.items.get(self._ident(table, key))
        return None if item is None else item_size(item)

    def read(self, operation: str, body: dict[str, Any], answer: dict[str, Any]) -> float:
        """Read units billed for a read request (GetItem, BatchGetItem, Query), given its answer: the items a
        Query found, the keys a BatchGetItem left unprocessed (not read, not billed)."""
        consistent = bool(body.get("ConsistentRead"))
        if operation == "GetItem":
            return read_units(self.size_of(body["TableName"], body["Key"]), consistent)
        if operation == "BatchGetItem":
            left = answer.get("UnprocessedKeys") or {}
            return sum(
                read_units(self.size_of(table, key), bool(wanted.get("ConsistentRead")))
                for table, wanted in body["RequestItems"].items()
                for key in wanted["Keys"]
                if key not in left.get(table, {}).get("Keys", [])
            )
        if operation == "Query":
            table = body["TableName"]
            return query_units((self.size_of(table, _key(item)) or 0 for item in answer.get("Items", [])), consistent)
        raise ValueError(f"{operation} is not a read billed here")


def billed_writes(recording_lines: Iterable[str]) -> Iterator[BilledWrite]:
    """Every item written to any table in a moto request recording (JSON lines), with its billed units."""
    ledger = Ledger()
    for line in recording_lines:
        entry = json.loads(line)
        target = {k.lower(): v for k, v in entry["headers"].items()}.get("x-amz-target", "")
        if not target.startswith("DynamoDB"):
            continue
        raw = base64.b64decode(entry["body"]) if entry.get("body_encoded") else (entry.get("body") or "").encode()
        yield from ledger.write(target.rpartition(".")[2], json.loads(raw or b"{}"))


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
