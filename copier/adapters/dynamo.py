"""The DynamoDB state store (PynamoDB).

Table layout (hash key ``pk``, range key ``sk``, TTL on ``expires_at``):

* ``pk = <stream>/<shardId>, sk = "state"``: the shard's state item (under 1 KB
  while no redo set is pending, so a commit costs 1 write unit);
* ``pk = <stream>/<shardId>, sk = "batch#<index>"``: one digest batch per
  forwarded chunk, 10 bytes a digest (a 500-event chunk is about 5.3 KB, 6
  write units); expires ``copier.digestTtlHours`` after it was written.

Every write is a single-item write: a conditional PutItem. The two a chunk
makes (its digest batch and its commit) go through ``copier.adapters.awsjson`` rather
than PynamoDB's botocore call, which costs milliseconds of CPU each; the
item is still PynamoDB's serialisation of the same model. No transaction
(DynamoDB bills a transaction's items twice): the digest batch is written
first, conditioned only on no higher epoch holding its index, and counts
once a state write (conditioned on the owner's epoch) commits it; see
``copier.core.state`` for why leftovers of a fenced writer are harmless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import botocore.exceptions
from pynamodb.exceptions import PynamoDBException, TableError

from copier.adapters.aws import convert_aws_error, pynamodb_code
from copier.adapters.awsjson import JsonClient, usable
from copier.adapters.clockhooks import watch_botocore
from copier.adapters.dynamoitems import STATE_SK, batch_from, batch_item, make_model, state_from, state_item
from copier.adapters.leanstate import LeanStateStore, naming_the_table
from copier.adapters.sessions import host_session, share_loader
from copier.adapters.stateitems import board_fields, board_from_fields
from copier.adapters.statettl import ensure_ttl
from copier.core.clockcheck import ClockBounds
from copier.core.config import Config
from copier.core.errors import AwsError, FencedError, TransientAwsError
from copier.core.state import BoardItem, DigestBatch, ShardState, StateConflict, StateStore, batch_key
from copier.core.summaryboard import BOARD_SK

__all__ = ["DynamoStateStore", "make_model"]

T = TypeVar("T")
_BATCH_GET = 100  # BatchGetItem's limit
# What a call through PynamoDB can raise: its own errors, and botocore's, which it does not always wrap
# (a connection dropped during a PutItem arrives as botocore's ConnectionClosedError).
_AWS_ERRORS = (PynamoDBException, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError)


class DynamoStateStore(StateStore):
    """StateStore on a DynamoDB table; see the module docstring for the layout.

    Every answer the store receives, through PynamoDB or the lean client,
    feeds ``clock_bounds`` when given: this host's clock measured against
    AWS (``copier.core.clockcheck``).
    """

    def __init__(self, config: Config, clock_bounds: ClockBounds | None = None) -> None:
        self.config = config
        self.model = make_model(config)
        self.clock_bounds = clock_bounds
        self._watched: Any = None  # PynamoDB's botocore client that feeds clock_bounds
        self._fast: LeanStateStore | None = None
        self._fast_checked = False

    def _watch_pynamodb(self) -> None:
        """Hook PynamoDB's botocore client to ``clock_bounds``, before each call that goes through it.

        PynamoDB 6.1 takes no client or session of ours: it makes its own
        client on first use (``Connection.client``), and a new one when the
        old one has no credentials, so the current one is looked up each time
        and hooked when it is new (a property read: nothing next to a call).
        """
        connection = self.model._get_connection().connection
        share_loader(connection.session)  # before its client is made: the models loaded once a process
        if self.clock_bounds is not None:
            client = connection.client
            if client is not self._watched:
                self._watched = watch_botocore(client, self.clock_bounds)

    def _lean(self) -> LeanStateStore | None:
        """The hot writes' path, made on first use: the lean client (None where a proxy is configured)."""
        if not self._fast_checked:
            self._fast_checked = True
            session = host_session()
            endpoint = self.config.state_endpoint
            client = session.create_client("dynamodb", region_name=self.config.region, endpoint_url=endpoint)
            credentials = session.get_credentials()
            if credentials is not None and usable(client.meta.endpoint_url):
                on_answer = None if self.clock_bounds is None else self.clock_bounds.observe
                fast = JsonClient.for_botocore(client, credentials, 5.0, 10.0, on_answer)
                self._fast = None if fast is None else LeanStateStore(self.config, fast)
        return self._fast

    # -- calls ---------------------------------------------------------------

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        try:
            self._watch_pynamodb()
            return fn()
        except _AWS_ERRORS as exc:
            raise self._named(convert_aws_error(operation, exc)) from exc

    def _named(self, error: AwsError) -> AwsError:
        return naming_the_table(self.config, error)

    def _conditional_put(self, item: Any, condition: Any, conflict: Exception) -> None:
        """One conditional PutItem; ``conflict`` is raised when the condition fails, copier's errors otherwise."""
        try:
            self._watch_pynamodb()
            item.save(condition=condition, add_version_condition=False)
        except _AWS_ERRORS as exc:
            if isinstance(exc, PynamoDBException) and pynamodb_code(exc)[0] == "ConditionalCheckFailedException":
                raise conflict from None
            raise self._named(convert_aws_error("PutItem", exc)) from exc

    def create_table(self) -> tuple[bool, str]:
        """Create the table (on-demand) if absent, then make sure TTL is on ``expires_at``
        (``copier.adapters.statettl``): whether it was created, and what was found or done of its TTL.

        PynamoDB's ``create_table`` enables TTL itself; its failure there is left to :func:`ensure_ttl`, which
        reads the TTL and names the call that failed, so that a table created without it is not reported as a
        failed CreateTable (it exists) and a second ``copier init`` still enables it."""
        created = False
        if not self._call("DescribeTable", self.model.exists):
            try:
                self.model.create_table(billing_mode="PAY_PER_REQUEST", wait=True, ignore_update_ttl_errors=True)
                created = True
            except TableError as exc:
                if pynamodb_code(exc)[0] != "ResourceInUseException":
                    raise convert_aws_error("CreateTable", exc) from exc
        self._watch_pynamodb()
        return created, ensure_ttl(self.model._get_connection().connection.client, self.config, created)

    def get(self, key: str) -> ShardState | None:
        def read() -> ShardState | None:
            try:
                return state_from(self.model.get(key, STATE_SK, consistent_read=True), self.config.state_table_name)
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
            found.update((item.pk, state_from(item, self.config.state_table_name)) for item in items)
        return found

    def replace_if_unchanged(self, key: str, seen: ShardState | None, new: ShardState) -> None:
        m = self.model
        condition = m.pk.does_not_exist() if seen is None else (m.version == seen.version)
        self._conditional_put(state_item(self.model, key, new), condition, StateConflict(key))

    def write(self, key: str, owner: ShardState, new: ShardState) -> None:
        lean = self._lean()
        if lean is not None:
            return lean.write(key, owner, new)
        fenced = FencedError(f"{key}: epoch {owner.epoch} of {owner.owner} is fenced")
        m = self.model
        condition = (m.epoch == owner.epoch) & (m.owner == owner.owner) & m.successor.does_not_exist()
        condition &= m.version < new.version  # stateitems.WRITE_CONDITION says why
        self._conditional_put(state_item(self.model, key, new), condition, fenced)

    def get_posted(self, key: str) -> BoardItem | None:
        def read() -> BoardItem | None:
            try:
                item = self.model.get(key, BOARD_SK, consistent_read=True)
            except self.model.DoesNotExist:
                return None
            return board_from_fields({"version": item.version, "posted": item.posted})

        try:
            return self._call("GetItem", read)
        except TypeError as exc:
            raise TransientAwsError("GetItem", "Unreadable", str(exc)) from exc

    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        new = BoardItem(seen.version + 1 if seen is not None else 1, text)
        condition = self.model.pk.does_not_exist() if seen is None else (self.model.version == seen.version)
        item = self.model(key, BOARD_SK, **board_fields(new, expires_ms))
        self._conditional_put(item, condition, StateConflict(key))
        return new

    def put_batch(self, key: str, batch: DigestBatch) -> None:
        lean = self._lean()
        if lean is not None:
            return lean.put_batch(key, batch)
        fenced = FencedError(f"{key}: {batch.key} was written under an epoch above {batch.epoch} or re-planned")
        item = batch_item(self.model, key, batch, self.config.digest_ttl_hours)
        m = self.model
        same = (m.epoch == batch.epoch) & (m.revision.does_not_exist() | (m.revision <= batch.revision))
        condition = m.sk.does_not_exist() | (m.epoch < batch.epoch) | same  # stateitems.BATCH_CONDITION
        self._conditional_put(item, condition, fenced)

    def get_batch(self, key: str, index: int) -> DigestBatch | None:
        def read() -> DigestBatch | None:
            try:
                return batch_from(self.model.get(key, batch_key(index), consistent_read=True))
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
                yield batch_from(item)
        except _AWS_ERRORS as exc:
            raise convert_aws_error("Query", exc) from exc
