"""The DynamoDB state store (PynamoDB).

Table layout (hash key ``pk``, range key ``sk``, TTL on ``expires_at``):

* ``pk = <stream>/<shardId>, sk = "state"``: the shard's state item (under 1 KB
  while no redo set is pending, so a commit costs 1 write unit);
* ``pk = <stream>/<shardId>, sk = "batch#<index>"``: one digest batch per
  forwarded chunk, 10 bytes a digest (a 500-event chunk is about 5.3 KB, 6
  write units); expires ``copier.digestTtlHours`` after it was written.

Every write is a single-item write: a conditional PutItem. The two a chunk
makes (its digest batch and its commit) go through ``copier.awsjson`` rather
than PynamoDB's botocore call, which costs milliseconds of CPU each; the
item is still PynamoDB's serialisation of the same model. No transaction
(DynamoDB bills a transaction's items twice): the digest batch is written
first, conditioned only on no higher epoch holding its index, and counts
once a state write (conditioned on the owner's epoch) commits it; see
``copier.state`` for why leftovers of a fenced writer are harmless.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import boto3
import botocore.exceptions
from pynamodb.attributes import (
    BinaryAttribute,
    BooleanAttribute,
    MapAttribute,
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
)
from pynamodb.exceptions import PynamoDBException, TableError
from pynamodb.models import Model

from copier.aws import convert_aws_error, pynamodb_code
from copier.awsjson import ConditionFailed, JsonClient, usable
from copier.clockcheck import ClockBounds
from copier.clockhooks import watch_botocore
from copier.config import Config
from copier.errors import FencedError, IncompatibleStateError
from copier.packing import pack_digests, pack_uints, unpack_digests, unpack_uints
from copier.positions import Position
from copier.state import STATE_FORMAT, DigestBatch, ShardState, StateConflict, StateStore, batch_key

__all__ = ["DynamoStateStore", "make_model"]

STATE_SK = "state"
T = TypeVar("T")
_BATCH_GET = 100  # BatchGetItem's limit
# What a call through PynamoDB can raise: its own errors, and botocore's, which it does not always wrap
# (a connection dropped during a PutItem arrives as botocore's ConnectionClosedError).
_AWS_ERRORS = (PynamoDBException, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


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


class DynamoStateStore(StateStore):
    """StateStore on a DynamoDB table; see the module docstring for the layout.

    Every answer the store receives, through PynamoDB or the lean client,
    feeds ``clock_bounds`` when given: this host's clock measured against
    AWS (``copier.clockcheck``).
    """

    def __init__(self, config: Config, clock_bounds: ClockBounds | None = None) -> None:
        self.config = config
        self.model = make_model(config)
        self.clock_bounds = clock_bounds
        self._watched: Any = None  # PynamoDB's botocore client that feeds clock_bounds
        self._fast: JsonClient | None = None
        self._fast_checked = False

    def _watch_pynamodb(self) -> None:
        """Hook PynamoDB's botocore client to ``clock_bounds``, before each call that goes through it.

        PynamoDB 6.1 takes no client or session of ours: it makes its own
        client on first use (``Connection.client``), and a new one when the
        old one has no credentials, so the current one is looked up each time
        and hooked when it is new (a property read: nothing next to a call).
        """
        if self.clock_bounds is not None:
            client = self.model._get_connection().connection.client
            if client is not self._watched:
                self._watched = watch_botocore(client, self.clock_bounds)

    def _fast_client(self) -> JsonClient | None:
        """The lean client for the hot writes, made on first use (None where a proxy is configured)."""
        if not self._fast_checked:
            self._fast_checked = True
            session = boto3.session.Session()
            endpoint = self.config.state_endpoint
            client = session.client("dynamodb", region_name=self.config.region, endpoint_url=endpoint)
            credentials = session.get_credentials()
            if credentials is not None and usable(client.meta.endpoint_url):
                on_answer = None if self.clock_bounds is None else self.clock_bounds.observe
                self._fast = JsonClient(client, credentials, 5.0, 10.0, on_answer)
        return self._fast

    def _fast_put(
        self, fast: JsonClient, item: Any, condition: str, values: dict[str, Any], conflict: Exception
    ) -> None:
        """A conditional PutItem of a model item through the lean client (binaries in base64, as JSON wants)."""
        attributes = item.serialize()
        for value in attributes.values():
            if "B" in value:
                value["B"] = base64.b64encode(value["B"]).decode()
        names = {f"#{n}": n for n in ("sk", "epoch", "owner", "successor") if f"#{n}" in condition}
        body = {
            "TableName": self.config.state_table_name,
            "Item": attributes,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
        try:
            fast.call("PutItem", json.dumps(body).encode())
        except ConditionFailed:
            raise conflict from None

    # -- conversions -------------------------------------------------------

    def _to_item(self, key: str, s: ShardState) -> Any:
        return self.model(
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

    def _from_item(self, item: Any) -> ShardState:
        if item.fmt != STATE_FORMAT:
            raise IncompatibleStateError(
                f"{self.config.state_table_name}: item {item.pk} is in state format {item.fmt or 1}, this copier "
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

    def _batch_item(self, key: str, b: DigestBatch) -> Any:
        return self.model(
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
            else datetime.fromtimestamp(b.started_ms / 1000, UTC) + timedelta(hours=self.config.digest_ttl_hours),
        )

    @staticmethod
    def _batch_from(item: Any) -> DigestBatch:
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

    # -- calls ---------------------------------------------------------------

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        try:
            self._watch_pynamodb()
            return fn()
        except _AWS_ERRORS as exc:
            raise convert_aws_error(operation, exc) from exc

    def _conditional_put(self, item: Any, condition: Any, conflict: Exception) -> None:
        """One conditional PutItem; ``conflict`` is raised when the condition fails, copier's errors otherwise."""
        try:
            self._watch_pynamodb()
            item.save(condition=condition, add_version_condition=False)
        except _AWS_ERRORS as exc:
            if isinstance(exc, PynamoDBException) and pynamodb_code(exc)[0] == "ConditionalCheckFailedException":
                raise conflict from None
            raise convert_aws_error("PutItem", exc) from exc

    def create_table(self) -> bool:
        """Create the table (on-demand, TTL on) if absent; True if it was created."""
        if self._call("DescribeTable", self.model.exists):
            return False
        try:
            self.model.create_table(billing_mode="PAY_PER_REQUEST", wait=True)
        except TableError as exc:
            if pynamodb_code(exc)[0] == "ResourceInUseException":
                return False
            raise convert_aws_error("CreateTable", exc) from exc
        return True

    def get(self, key: str) -> ShardState | None:
        def read() -> ShardState | None:
            try:
                return self._from_item(self.model.get(key, STATE_SK, consistent_read=True))
            except self.model.DoesNotExist:
                return None

        return self._call("GetItem", read)

    def get_many(self, keys: Iterable[str]) -> dict[str, ShardState]:
        """BatchGetItem in groups of 100 (eventually consistent: this is for display)."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, ShardState] = {}
        for first in range(0, len(wanted), _BATCH_GET):
            group = [(key, STATE_SK) for key in wanted[first : first + _BATCH_GET]]
            items = self._call("BatchGetItem", lambda: list(self.model.batch_get(group)))
            found.update((item.pk, self._from_item(item)) for item in items)
        return found

    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        m = self.model
        condition = m.pk.does_not_exist() if seen is None else (m.version == seen.version)
        self._conditional_put(self._to_item(key, new), condition, StateConflict(key))

    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        fenced = FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
        fast = self._fast_client()
        if fast is not None and owner.owner is not None:
            condition = "#epoch = :epoch AND #owner = :owner AND attribute_not_exists(#successor)"
            values = {":epoch": {"N": str(owner.epoch)}, ":owner": {"S": owner.owner}}
            return self._fast_put(fast, self._to_item(key, new), condition, values, fenced)
        m = self.model
        condition = (m.epoch == owner.epoch) & (m.owner == owner.owner) & m.successor.does_not_exist()
        self._conditional_put(self._to_item(key, new), condition, fenced)

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        fenced = FencedError(f"{key}: {batch.key} was written under an epoch above {batch.epoch}")
        fast = self._fast_client()
        if fast is not None:
            condition = "attribute_not_exists(#sk) OR #epoch <= :epoch"
            values = {":epoch": {"N": str(batch.epoch)}}
            return self._fast_put(fast, self._batch_item(key, batch), condition, values, fenced)
        m = self.model
        condition = m.sk.does_not_exist() | (m.epoch <= batch.epoch)
        self._conditional_put(self._batch_item(key, batch), condition, fenced)

    def get_batch(self, key: str, index: int) -> DigestBatch | None:
        def read() -> DigestBatch | None:
            try:
                return self._batch_from(self.model.get(key, batch_key(index), consistent_read=True))
            except self.model.DoesNotExist:
                return None

        return self._call("GetItem", read)

    def batches(self, key: str, upto: int, page_size: int | None = None) -> Iterator[DigestBatch]:
        if upto < 1:
            return
        query = self.model.query(
            key,
            self.model.sk.between(batch_key(1), batch_key(upto)),
            scan_index_forward=False,
            consistent_read=True,
            page_size=page_size,
        )
        try:
            self._watch_pynamodb()
            for item in query:
                yield self._batch_from(item)
        except _AWS_ERRORS as exc:
            raise convert_aws_error("Query", exc) from exc
