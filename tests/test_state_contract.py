"""One contract, two stores: the in-memory fake behaves as the DynamoDB store does."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

import pytest

from copier.dynamo import DynamoStateStore
from copier.errors import FencedError
from copier.positions import Position
from copier.state import DigestBatch, Pending, ShardState, StateConflict, StateStore
from copier.testing import InMemoryStateStore
from tests.support.fakes import config

_tables = itertools.count(1)


@pytest.fixture(params=["memory", "dynamodb"])
def store(request: pytest.FixtureRequest) -> Iterator[StateStore]:
    if request.param == "memory":
        yield InMemoryStateStore()
        return
    endpoint = request.getfixturevalue("endpoint")
    cfg = config(stateTableName=f"contract-{next(_tables)}")
    cfg = replace(cfg, dynamodb_endpoint=endpoint)
    dynamo = DynamoStateStore(cfg)
    assert dynamo.create_table() is True
    assert dynamo.create_table() is False, "create_table is idempotent"
    yield dynamo


KEY = "staging/shardId-000000000000"


def owned(epoch: int = 1, owner: str = "w1") -> ShardState:
    return ShardState(epoch=epoch, version=1, owner=owner, lease_until_ms=1000)


def test_absent_shard_reads_as_none(store: StateStore) -> None:
    """A shard never seen has no state."""
    assert store.get(KEY) is None


def test_take_over_requires_the_item_unchanged(store: StateStore) -> None:
    """Creation requires absence; replacement requires the version read."""
    first = owned()
    store.replace_if_unchanged(KEY, None, first)
    with pytest.raises(StateConflict):
        store.replace_if_unchanged(KEY, None, owned(owner="w2"))
    second = replace(first, epoch=2, version=2, owner="w2")
    store.replace_if_unchanged(KEY, first, second)
    with pytest.raises(StateConflict):
        store.replace_if_unchanged(KEY, first, replace(first, epoch=3, version=3, owner="w3"))
    assert store.get(KEY) == second


def test_state_round_trips_every_field(store: StateStore) -> None:
    """Positions beyond 64 bits, pending, redo digests and counters survive a write and a read."""
    store.replace_if_unchanged(KEY, None, owned())
    full = ShardState(
        epoch=1,
        version=2,
        owner="w1",
        lease_until_ms=123456789,
        position=Position(49_612_345_678_901_234_567_890_123_456_789_012_345_678_901_234_567_890, 7),
        pending=Pending("batch#000000000001#000000000003", Position(10**40, 2), 99),
        redo_last=Position(10**41, 0),
        redo_digests=(b"a" * 12, b"b" * 12),
        closed=True,
        batches=3,
        counters={"forwarded": 10, "duplicates": 2},
        updated_ms=5,
    )
    store.write(KEY, owned(), full)
    assert store.get(KEY) == full


def test_owner_writes_are_fenced_by_epoch_owner_and_successor(store: StateStore) -> None:
    """A stale epoch, another owner or an announced successor makes an owner's write fail."""
    mine = owned()
    store.replace_if_unchanged(KEY, None, mine)
    with pytest.raises(FencedError):
        store.write(KEY, owned(epoch=0), mine)
    with pytest.raises(FencedError):
        store.write(KEY, owned(owner="w2"), mine)
    announced = replace(mine, version=2, successor="w2")
    store.replace_if_unchanged(KEY, mine, announced)
    with pytest.raises(FencedError):
        store.write(KEY, mine, replace(mine, version=3))
    assert store.get(KEY) == announced


def test_digest_batches_are_written_with_the_state_and_listed_newest_first(store: StateStore) -> None:
    """The batch goes in with the owner's write, and a failed write stores no batch."""
    mine = owned()
    store.replace_if_unchanged(KEY, None, mine)
    for n in (1, 2, 3):
        batch = DigestBatch(f"batch#000000000001#{n:012d}", (bytes([n]) * 12,), (), (bytes([n]) * 12,), n)
        store.write(KEY, mine, mine, batch)
    with pytest.raises(FencedError):
        store.write(KEY, owned(epoch=9), mine, DigestBatch("batch#000000000009#000000000001", (), (), (), 0))
    keys = [b.batch_key for b in store.digests(KEY)]
    assert keys == [f"batch#000000000001#{n:012d}" for n in (3, 2, 1)]
    assert store.digest_batch(KEY, keys[0]) == DigestBatch(keys[0], (b"\x03" * 12,), (), (b"\x03" * 12,), 3)
    assert [k for k, _ in store.window_batches(KEY, 2)] == keys[:2]
