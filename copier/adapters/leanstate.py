"""The state store over the lean JSON client: every call a record processor makes, without PynamoDB.

The same table, items and conditions as ``copier.adapters.dynamo`` (which
keeps PynamoDB for the commands: init, status, verify): items are written
and read through ``copier.adapters.stateitems``, and the conditional writes
are the ones docs/protocol.md states. ``copier.adapters.dynamo`` sends its hot
writes (a commit, a digest batch) through this class too, so each condition
is written once.

Retries: reads (GetItem, Query, BatchGetItem) are retried here on a
transient error, a few times with backoff, as PynamoDB's client would. A
conditional write is not: the caller retries it (``copier.shard.session``),
knowing that an unanswered write may have applied.

An answer whose items cannot be read (an attribute of a type copier does not
write, a number that is not one, a field of the wrong shape) is a
``copier.adapters.awsjson.Unreadable`` error, transient, never a plain
Python exception; an item of another state format stays
IncompatibleStateError.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from copier.adapters.awserrors import naming_the_resource, place
from copier.adapters.awsjson import ConditionFailed, JsonClient, reading
from copier.adapters.stateitems import (
    BATCH_CONDITION,
    STATE_SK,
    WRITE_CONDITION,
    batch_fields,
    batch_from_fields,
    board_fields,
    board_from_fields,
    from_wire,
    state_fields,
    state_from_fields,
    to_wire,
)
from copier.core import fastjson
from copier.core.config import Config
from copier.core.errors import AwsError, FencedError, TransientAwsError
from copier.core.state import BoardItem, DigestBatch, ShardState, StateConflict, StateStore, batch_key
from copier.core.summaryboard import BOARD_SK

__all__ = ["LeanStateStore", "naming_the_table"]

READ_ATTEMPTS = 3
_BATCH_GET = 100  # BatchGetItem's limit


def naming_the_table(config: Config, error: AwsError) -> AwsError:
    """A missing table named, with where it was looked for and the command that creates it."""
    what = f"the state table {config.state_table_name}"
    where = place(config.region, config.state_endpoint)
    return naming_the_resource(error, what, where, f"`copier init --properties {config.path}`")


class LeanStateStore(StateStore):
    """StateStore on the state table through a :class:`JsonClient` for DynamoDB."""

    def __init__(self, config: Config, client: JsonClient, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.table = config.state_table_name
        self.client = client
        self._sleep = sleep

    def _send(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            return self.client.call(operation, fastjson.dumps(body))
        except ConditionFailed:
            raise
        except AwsError as exc:
            raise naming_the_table(self.config, exc) from exc

    def _read(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(READ_ATTEMPTS):
            try:
                return self._send(operation, body)
            except TransientAwsError:
                if attempt == READ_ATTEMPTS - 1:
                    raise
                self._sleep(random.uniform(0, 0.05 * 2**attempt))  # noqa: S311 - jitter, not secrecy
        raise AssertionError("unreachable")

    def _put(self, item: dict[str, Any], condition: str, values: dict[str, Any], conflict: Exception) -> None:
        named = ("pk", "sk", "epoch", "owner", "successor", "version", "revision")
        names = {f"#{n}": n for n in named if f"#{n}" in condition}
        body: dict[str, Any] = {
            "TableName": self.table,
            "Item": item,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
        }
        if values:
            body["ExpressionAttributeValues"] = values
        try:
            self._send("PutItem", body)
        except ConditionFailed:
            raise conflict from None

    def _get(self, key: str, sk: str) -> dict[str, Any] | None:
        body = {"TableName": self.table, "Key": {"pk": {"S": key}, "sk": {"S": sk}}, "ConsistentRead": True}
        return reading("GetItem", _item_of, self._read("GetItem", body))

    def get(self, key: str) -> ShardState | None:
        fields = self._get(key, STATE_SK)
        return None if fields is None else reading("GetItem", state_from_fields, fields, self.table)

    def get_many(self, keys: Iterable[str]) -> dict[str, ShardState]:
        """BatchGetItem in groups of 100, unprocessed keys asked again (eventually consistent: for display)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, ShardState] = {}
        for first in range(0, len(wanted), _BATCH_GET):
            request: dict[str, Any] = {
                self.table: {
                    "Keys": [{"pk": {"S": k}, "sk": {"S": STATE_SK}} for k in wanted[first : first + _BATCH_GET]]
                }
            }
            while request:
                answer = self._read("BatchGetItem", {"RequestItems": request})
                states, request = reading("BatchGetItem", _batch_got, answer, self.table)
                found.update(states)
                if request:
                    self._sleep(0.05)
        return found

    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        item = to_wire(key, STATE_SK, state_fields(new))
        if seen is None:
            self._put(item, "attribute_not_exists(#pk)", {}, StateConflict(key))
        else:
            self._put(item, "#version = :version", {":version": {"N": str(seen.version)}}, StateConflict(key))

    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        fenced = FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
        who = {"S": owner.owner} if owner.owner is not None else {"NULL": True}
        values = {":epoch": {"N": str(owner.epoch)}, ":owner": who, ":version": {"N": str(new.version)}}
        self._put(to_wire(key, STATE_SK, state_fields(new)), WRITE_CONDITION, values, fenced)

    def get_posted(self, key: str) -> BoardItem | None:
        fields = self._get(key, BOARD_SK)
        return None if fields is None else reading("GetItem", board_from_fields, fields)

    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        new = BoardItem(seen.version + 1 if seen is not None else 1, text)
        item = to_wire(key, BOARD_SK, board_fields(new, expires_ms))
        if seen is None:
            self._put(item, "attribute_not_exists(#pk)", {}, StateConflict(key))
        else:
            self._put(item, "#version = :version", {":version": {"N": str(seen.version)}}, StateConflict(key))
        return new

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        fenced = FencedError(f"{key}: {batch.key} was written under an epoch above {batch.epoch} or re-planned")
        item = to_wire(key, batch.key, batch_fields(batch, self.config.digest_ttl_hours))
        values = {":epoch": {"N": str(batch.epoch)}, ":revision": {"N": str(batch.revision)}}
        self._put(item, BATCH_CONDITION, values, fenced)

    def get_batch(self, key: str, index: int) -> DigestBatch | None:
        fields = self._get(key, batch_key(index))
        return None if fields is None else reading("GetItem", batch_from_fields, fields)

    def batches(self, key: str, upto: int, page_size: int | None = None) -> Iterator[DigestBatch]:
        if upto < 1:
            return
        body: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#pk = :pk AND #sk BETWEEN :first AND :last",
            "ExpressionAttributeNames": {"#pk": "pk", "#sk": "sk"},
            "ExpressionAttributeValues": {
                ":pk": {"S": key},
                ":first": {"S": batch_key(1)},
                ":last": {"S": batch_key(upto)},
            },
            "ScanIndexForward": False,
            "ConsistentRead": True,
        }
        if page_size is not None:
            body["Limit"] = page_size
        while True:
            found, after = reading("Query", _batches_of, self._read("Query", body))
            yield from found
            if not after:
                return
            body = {**body, "ExclusiveStartKey": after}


def _item_of(answer: dict[str, Any]) -> dict[str, Any] | None:
    """A GetItem answer's item as plain values (None: no such item)."""
    item = answer.get("Item")
    return None if item is None else from_wire(item)


def _batch_got(answer: dict[str, Any], table: str) -> tuple[dict[str, ShardState], dict[str, Any]]:
    """A BatchGetItem answer: the states found by key, and the keys to ask again."""
    found: dict[str, ShardState] = {}
    for item in answer.get("Responses", {}).get(table, []):
        fields = from_wire(item)
        found[str(fields["pk"])] = state_from_fields(fields, table)
    again = answer.get("UnprocessedKeys") or {}
    if not isinstance(again, dict):
        raise TypeError(f"UnprocessedKeys is {again!r}")
    return found, again


def _batches_of(page: dict[str, Any]) -> tuple[list[DigestBatch], dict[str, Any] | None]:
    """A Query page of digest batches, and where the next page starts (None: the last page)."""
    found = [batch_from_fields(from_wire(item)) for item in page.get("Items", [])]
    after = page.get("LastEvaluatedKey") or None
    if after is not None and not isinstance(after, dict):
        raise TypeError(f"LastEvaluatedKey is {after!r}")
    return found, after
