"""The state table's PynamoDB model, over the item definitions of ``copier.adapters.stateitems``.

One model holds both kinds of item (the state item and the digest batches),
so a table needs one schema; ``copier.adapters.dynamo`` does the calls.
"""

from __future__ import annotations

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

from copier.adapters.stateitems import STATE_SK, batch_fields, batch_from_fields, state_fields, state_from_fields
from copier.core.config import Config
from copier.core.state import DigestBatch, ShardState

__all__ = ["STATE_SK", "batch_from", "batch_item", "make_model", "state_from", "state_item"]


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
        successor_bound_ms = NumberAttribute(null=True)
        closed = BooleanAttribute(null=True)
        counters: MapAttribute[str, Any] = MapAttribute(null=True)  # type: ignore[no-untyped-call]
        updated_ms = NumberAttribute(null=True)
        behind_ms = NumberAttribute(null=True)
        window_ids = NumberAttribute(null=True)
        window_oldest_ms = NumberAttribute(null=True)
        window_newest_ms = NumberAttribute(null=True)
        window_cut = BooleanAttribute(null=True)
        window_ms = NumberAttribute(null=True)
        clock_bound_ms = NumberAttribute(null=True)  # both kinds: the writer's measured clock bound
        prestart_ms = NumberAttribute(null=True)
        position_arrival_ms = NumberAttribute(null=True)  # the replication checkpoint (ShardState)
        position_age_ms = NumberAttribute(null=True)
        stall_reason = UnicodeAttribute(null=True)  # a stall its owner is in (ShardState)
        stall_detail = UnicodeAttribute(null=True)
        stall_since_ms = NumberAttribute(null=True)
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
        revision = NumberAttribute(null=True)
        before_ids = BinaryAttribute(null=True, legacy_encoding=False)
        posted = UnicodeAttribute(null=True)  # an application item's (copier.core.summaryboard)
        expires_at = TTLAttribute(null=True)

    return CopierItem


def _fields(item: Any) -> dict[str, Any]:
    """A model item's attributes as plain values (a map as a dict)."""
    out = {name: getattr(item, name) for name in item.get_attributes()}
    return {k: v.as_dict() if isinstance(v, MapAttribute) else v for k, v in out.items()}  # type: ignore[no-untyped-call]


def state_item(model: Any, key: str, s: ShardState) -> Any:
    """The state item of ``key`` as the model's item."""
    return model(key, STATE_SK, **state_fields(s))


def state_from(item: Any, table: str) -> ShardState:
    """A state item read back; one in another state format is refused (IncompatibleStateError)."""
    return state_from_fields(_fields(item), table)


def batch_item(model: Any, key: str, b: DigestBatch, ttl_hours: int) -> Any:
    """A digest batch as the model's item."""
    return model(key, b.key, **batch_fields(b, ttl_hours))


def batch_from(item: Any) -> DigestBatch:
    """A digest batch read back."""
    return batch_from_fields(_fields(item))
