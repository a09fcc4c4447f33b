"""The DynamoDB state store (PynamoDB), and the one place its errors are converted.

Table layout (hash key ``pk``, range key ``sk``, TTL on ``expires_at``):

* ``pk = <stream>/<shardId>, sk = "state"``: the shard's state item;
* ``pk = <stream>/<shardId>, sk = "batch#<epoch>#<n>"``: one digest item per
  forwarded batch, zero-padded so that sort order is write order; expires
  after ``copier.digestTtlHours``.

A write as owner is one conditional PutItem, or one TransactWriteItems
when it also stores a batch's digests, with a client request token so that
botocore's own retry of an ambiguous transaction is idempotent.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import botocore.exceptions
from pynamodb.attributes import (
    BinaryAttribute,
    BooleanAttribute,
    MapAttribute,
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
)
from pynamodb.connection import Connection
from pynamodb.exceptions import PynamoDBException, TableError, TransactWriteError
from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

from copier.config import Config
from copier.errors import AwsError, FatalAwsError, FencedError, TransientAwsError
from copier.positions import Position
from copier.state import DigestBatch, Pending, ShardState, StateConflict, StateStore

__all__ = ["DynamoStateStore", "convert_aws_error", "make_model"]

STATE_SK = "state"
BATCH_PREFIX = "batch#"
T = TypeVar("T")

_FATAL = {
    "ResourceNotFoundException",
    "AccessDeniedException",
    "ValidationException",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "MissingAuthenticationTokenException",
    "ExpiredTokenException",
    "SerializationException",
    "KMSAccessDeniedException",
    "KMSDisabledException",
    "KMSInvalidStateException",
    "KMSNotFoundException",
    "KMSOptInRequired",
}


def convert_aws_error(operation: str, exc: BaseException) -> AwsError:
    """Map a botocore/PynamoDB failure to copier's tree, keeping the AWS error code."""
    code: str | None = None
    message = str(exc)
    if isinstance(exc, PynamoDBException):
        code = exc.cause_response_code
        message = exc.cause_response_message or message
        cause = exc.cause
        if code is None and cause is not None and cause is not exc:
            return convert_aws_error(operation, cause)
    elif isinstance(exc, botocore.exceptions.ClientError):
        code = exc.response.get("Error", {}).get("Code")
        message = exc.response.get("Error", {}).get("Message", message)
    if code is None:
        return TransientAwsError(operation, type(exc).__name__, message)
    if code in _FATAL:
        return FatalAwsError(operation, code, message)
    return TransientAwsError(operation, code, message)


def _pack(digests: tuple[bytes, ...]) -> bytes:
    return b"".join(digests)


def _unpack(blob: bytes | None, size: int = 12) -> tuple[bytes, ...]:
    if not blob:
        return ()
    return tuple(blob[i : i + size] for i in range(0, len(blob), size))


def make_model(config: Config) -> Any:
    """A PynamoDB model bound to the configured table, region and endpoint."""

    class CopierItem(Model):
        class Meta:
            table_name = config.state_table_name
            region = config.region
            host = config.dynamodb_endpoint
            max_retry_attempts = 3
            connect_timeout_seconds = 5
            read_timeout_seconds = 10

        pk = UnicodeAttribute(hash_key=True)
        sk = UnicodeAttribute(range_key=True)
        # state item
        epoch = NumberAttribute(null=True)
        version = NumberAttribute(null=True)
        owner = UnicodeAttribute(null=True)
        lease_until_ms = NumberAttribute(null=True)
        position_seq = UnicodeAttribute(null=True)
        position_subseq = NumberAttribute(null=True)
        pending = UnicodeAttribute(null=True)
        redo_last = UnicodeAttribute(null=True)
        redo_digests = BinaryAttribute(null=True, legacy_encoding=False)
        successor = UnicodeAttribute(null=True)
        closed = BooleanAttribute(null=True)
        batches = NumberAttribute(null=True)
        counters: MapAttribute[str, Any] = MapAttribute(null=True)  # type: ignore[no-untyped-call]
        updated_ms = NumberAttribute(null=True)
        behind_ms = NumberAttribute(null=True)
        # digest item
        target = BinaryAttribute(null=True, legacy_encoding=False)
        deadletter = BinaryAttribute(null=True, legacy_encoding=False)
        window = BinaryAttribute(null=True, legacy_encoding=False)
        created_ms = NumberAttribute(null=True)
        expires_at = TTLAttribute(null=True)

    return CopierItem


def _position_str(p: Position | None) -> str | None:
    return None if p is None else f"{p.seq}/{p.subseq}"


def _position_from(text: str | None) -> Position | None:
    if not text:
        return None
    seq, _, sub = text.partition("/")
    return Position(int(seq), int(sub or 0))


class DynamoStateStore(StateStore):
    """StateStore on a DynamoDB table; see the module docstring for the layout."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.model = make_model(config)
        self._connection = Connection(region=config.region, host=config.dynamodb_endpoint, max_retry_attempts=3)

    # -- conversions -------------------------------------------------------

    def _to_item(self, key: str, s: ShardState) -> Any:
        pending = None
        if s.pending is not None:
            pending = json.dumps(
                {"batch": s.pending.batch_key, "last": _position_str(s.pending.last), "started": s.pending.started_ms}
            )
        return self.model(
            key,
            STATE_SK,
            epoch=s.epoch,
            version=s.version,
            owner=s.owner,
            lease_until_ms=s.lease_until_ms,
            position_seq=None if s.position is None else str(s.position.seq),
            position_subseq=None if s.position is None else s.position.subseq,
            pending=pending,
            redo_last=_position_str(s.redo_last),
            redo_digests=_pack(s.redo_digests) or None,
            successor=s.successor,
            closed=s.closed or None,
            batches=s.batches,
            counters=dict(s.counters) or None,
            updated_ms=s.updated_ms,
            behind_ms=s.behind_ms,
        )

    @staticmethod
    def _from_item(item: Any) -> ShardState:
        pending = None
        if item.pending:
            raw = json.loads(item.pending)
            last = _position_from(raw["last"])
            assert last is not None
            pending = Pending(raw["batch"], last, int(raw["started"]))
        position = None
        if item.position_seq is not None:
            position = Position(int(item.position_seq), int(item.position_subseq or 0))
        counters = {k: int(v) for k, v in (item.counters.as_dict() if item.counters else {}).items()}
        return ShardState(
            epoch=int(item.epoch or 0),
            version=int(item.version or 0),
            owner=item.owner,
            lease_until_ms=int(item.lease_until_ms or 0),
            position=position,
            pending=pending,
            redo_last=_position_from(item.redo_last),
            redo_digests=_unpack(item.redo_digests),
            successor=item.successor,
            closed=bool(item.closed),
            batches=int(item.batches or 0),
            counters=counters,
            updated_ms=int(item.updated_ms or 0),
            behind_ms=None if item.behind_ms is None else int(item.behind_ms),
        )

    def _batch_item(self, key: str, b: DigestBatch) -> Any:
        return self.model(
            key,
            b.batch_key,
            target=_pack(b.target) or None,
            deadletter=_pack(b.deadletter) or None,
            window=_pack(b.window) or None,
            created_ms=b.created_ms,
            expires_at=datetime.fromtimestamp(b.created_ms / 1000, UTC) + timedelta(hours=self.config.digest_ttl_hours),
        )

    def _batch_from(self, item: Any) -> DigestBatch:
        return DigestBatch(
            item.sk, _unpack(item.target), _unpack(item.deadletter), _unpack(item.window), int(item.created_ms or 0)
        )

    # -- calls ---------------------------------------------------------------

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except (PynamoDBException, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise convert_aws_error(operation, exc) from exc

    def create_table(self) -> bool:
        """Create the table (on-demand, TTL on) if absent; True if it was created."""
        if self._call("DescribeTable", self.model.exists):
            return False
        try:
            self.model.create_table(billing_mode="PAY_PER_REQUEST", wait=True)
        except TableError as exc:
            if exc.cause_response_code == "ResourceInUseException":
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

    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        m = self.model
        condition = m.pk.does_not_exist() if seen is None else (m.version == seen.version)
        try:
            self._to_item(key, new).save(condition=condition, add_version_condition=False)
        except PynamoDBException as exc:
            if exc.cause_response_code == "ConditionalCheckFailedException":
                raise StateConflict(key) from None
            raise convert_aws_error("PutItem", exc) from exc

    def write(self, key: str, owner: ShardState, new: ShardState, batch: DigestBatch | None = None) -> None:
        m = self.model
        condition = (m.epoch == owner.epoch) & (m.owner == owner.owner) & m.successor.does_not_exist()
        fenced = FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
        item = self._to_item(key, new)
        try:
            if batch is None:
                item.save(condition=condition, add_version_condition=False)
                return
            with TransactWrite(connection=self._connection, client_request_token=uuid.uuid4().hex) as tx:
                tx.save(item, condition=condition)
                tx.save(self._batch_item(key, batch))
        except TransactWriteError as exc:
            reasons = [r.code for r in exc.cancellation_reasons if r is not None]
            if "ConditionalCheckFailed" in reasons:
                raise fenced from None
            raise convert_aws_error("TransactWriteItems", exc) from exc
        except PynamoDBException as exc:
            if exc.cause_response_code == "ConditionalCheckFailedException":
                raise fenced from None
            raise convert_aws_error("PutItem", exc) from exc

    def digests(self, key: str, newest_first: bool = True) -> Iterator[DigestBatch]:
        query = self.model.query(
            key, self.model.sk.startswith(BATCH_PREFIX), scan_index_forward=not newest_first, consistent_read=True
        )
        try:
            for item in query:
                yield self._batch_from(item)
        except (PynamoDBException, botocore.exceptions.BotoCoreError) as exc:
            raise convert_aws_error("Query", exc) from exc

    def digest_batch(self, key: str, batch_key: str) -> DigestBatch | None:
        def read() -> DigestBatch | None:
            try:
                return self._batch_from(self.model.get(key, batch_key, consistent_read=True))
            except self.model.DoesNotExist:
                return None

        return self._call("GetItem", read)

    def shard_states(self) -> Iterator[tuple[str, ShardState]]:
        """Every shard's state (a scan; for ``copier status``)."""
        try:
            for item in self.model.scan(self.model.sk == STATE_SK):
                yield item.pk, self._from_item(item)
        except (PynamoDBException, botocore.exceptions.BotoCoreError) as exc:
            raise convert_aws_error("Scan", exc) from exc
