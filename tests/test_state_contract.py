"""One contract, three stores: the in-memory fake behaves as the DynamoDB stores (PynamoDB's and the lean one) do."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import replace

import pytest

from copier.adapters.awsauth import lean_credentials
from copier.adapters.awsjson import JsonClient
from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.leanstate import LeanStateStore
from copier.adapters.statettl import NO_TTL_HERE
from copier.core.errors import FencedError
from copier.core.limits import MAX_CHUNK_EVENTS
from copier.core.packing import pack_digests, unpack_digests
from copier.core.positions import Position
from copier.core.state import BoardItem, DigestBatch, ShardState, StateConflict, StateStore
from copier.core.streamsettings import StreamSettings
from copier.core.summaryboard import Posted
from copier.local.backend import DUMMY_ENV
from copier.local.independent import Endpoints
from copier.testing import InMemoryStateStore
from tests.conftest import BACKENDS, backend_for
from tests.support.fakes import config

_tables = itertools.count(1)


def _table(backend: Endpoints) -> tuple[DynamoStateStore, LeanStateStore]:
    """A new table, and the two stores on it: PynamoDB's (the commands) and the lean one (the processor)."""
    cfg = config(stateTableName=f"contract-{next(_tables)}")
    endpoint = backend.dynamodb
    cfg = replace(cfg, kinesis_endpoint=backend.kinesis, target_endpoint=backend.kinesis)
    cfg = replace(cfg, dynamodb_endpoint=endpoint, state_endpoint=endpoint)
    dynamo = DynamoStateStore(cfg)
    ttl = NO_TTL_HERE if backend.impl == "independent" else "TTL on expires_at: enabled"  # dynalite has no TTL
    assert dynamo.create_table() == (True, ttl)
    assert dynamo.create_table() == (False, ttl), "create_table is idempotent"
    credentials = lean_credentials(DUMMY_ENV)
    return dynamo, LeanStateStore(cfg, JsonClient("dynamodb", cfg.region, endpoint, credentials, 5.0, 10.0))


# The in-memory fake, and PynamoDB's and the lean store on each local backend (moto; dynalite).
@pytest.fixture(params=["memory", *(f"{kind}-{impl}" for impl in BACKENDS for kind in ("dynamodb", "lean"))])
def store(request: pytest.FixtureRequest) -> Iterator[StateStore]:
    if request.param == "memory":
        yield InMemoryStateStore()
        return
    kind, impl = request.param.split("-")
    dynamo, lean = _table(backend_for(request, impl))
    yield dynamo if kind == "dynamodb" else lean


def _rich_state(rng: random.Random) -> ShardState:
    """A state with every field drawn, absent ones included (None, empty, zero)."""
    maybe = lambda value: value if rng.random() < 0.7 else None  # noqa: E731
    return ShardState(
        epoch=rng.randrange(1, 10**6),
        version=rng.randrange(1, 10**9),
        owner=maybe(f"host-{rng.randrange(99)}:{rng.randrange(10**5)}"),
        lease_until_ms=rng.randrange(2**42),
        position=maybe(Position(rng.getrandbits(180), rng.randrange(3))),
        batches=rng.randrange(10**6),
        redo_last=maybe(Position(rng.getrandbits(180))),
        redo_digests=tuple(rng.getrandbits(80) for _ in range(rng.choice([0, 1, 7]))),
        redo_settings=rng.choice(["", "k=json:eventId;u=forward"]),
        redo_suspect=rng.random() < 0.5,
        successor=maybe("host-9:1"),
        successor_bound_ms=maybe(rng.randrange(0, 20_000)),
        closed=rng.random() < 0.3,
        counters={name: rng.randrange(10**12) for name in rng.sample(["forwarded", "duplicates", "replayed"], 2)},
        updated_ms=rng.randrange(2**42),
        behind_ms=maybe(rng.randrange(10**8)),
        window_ids=rng.choice([0, rng.randrange(4_000_000)]),
        window_oldest_ms=rng.choice([0, rng.randrange(2**42)]),
        window_newest_ms=rng.choice([0, rng.randrange(2**42)]),
        window_cut=rng.random() < 0.3,
        window_ms=maybe(rng.choice([0, 3_600_000, rng.randrange(10**10)])),
        clock_bound_ms=maybe(rng.randrange(-5000, 5000)),
        prestart_ms=maybe(rng.randrange(2**42)),
        position_arrival_ms=maybe(rng.randrange(2**42)),
        position_age_ms=maybe(rng.randrange(10**9)),
        stall_reason=maybe(rng.choice(["rejected", "stream_settings"])),
        stall_detail=rng.choice(["", "PutRecords: ValidationException: é " + "x" * rng.randrange(300)]),
        stall_since_ms=maybe(rng.randrange(2**42)),
    )


def _rich_batch(rng: random.Random, index: int) -> DigestBatch:
    return DigestBatch(
        index=index,
        epoch=rng.randrange(1, 10**6),
        last=Position(rng.getrandbits(180), rng.randrange(5)),
        started_ms=rng.randrange(2**42),
        keyed=digests(rng.choice([0, 3, 500]), rng.randrange(100)),
        unkeyed=digests(rng.choice([0, 2]), rng.randrange(100)),
        deadletter=digests(rng.choice([0, 1]), rng.randrange(100)),
        arrival_min_ms=rng.randrange(2**42),
        arrival_max_ms=rng.randrange(2**42),
        target_shards=tuple(sorted(rng.sample(range(400), rng.choice([0, 1, 5])))),
        settings=rng.choice(["", "k=json:eventId"]),
        dead_ids=digests(rng.choice([0, 2]), 7),
        redo_ids=digests(rng.choice([0, 4]), 8),
        redo_settings=rng.choice(["", "k=partitionKey"]),
        expires_ms=rng.choice([0, rng.randrange(2**41) // 1000 * 1000]),
        clock_bound_ms=rng.choice([None, rng.randrange(-900, 900)]),
        before_ids=digests(rng.choice([0, 6]), 9),
    )


def test_the_lean_store_and_pynamodb_write_and_read_the_same_items(backend_endpoints: Endpoints) -> None:
    """The processor writes through the lean store, the commands read through PynamoDB (and the other way
    round): every field of both kinds of item survives either way."""
    dynamo, lean = _table(backend_endpoints)
    rng = random.Random(25)
    for n in range(40):
        key = f"staging/shardId-{n:012d}"
        writer, reader = (lean, dynamo) if n % 2 else (dynamo, lean)
        state = _rich_state(rng)
        writer.replace_if_unchanged(key, None, state)
        assert reader.get(key) == state
        batch_ = _rich_batch(rng, 1 + n % 3)
        writer.put_batch(key, batch_)
        read = reader.get_batch(key, batch_.index)
        expected = batch_ if batch_.expires_ms else replace(batch_, expires_ms=read.expires_ms if read else 0)
        assert read == expected
        assert dynamo.get_many([key]) == lean.get_many([key]) == {key: state}


KEY = "staging/shardId-000000000000"


def owned(epoch: int = 1, owner: str = "w1") -> ShardState:
    return ShardState(epoch=epoch, version=1, owner=owner, lease_until_ms=1000)


def digests(n: int, seed: int = 0) -> bytes:
    rng = random.Random(seed)
    return pack_digests(rng.getrandbits(80) for _ in range(n))


def batch(index: int, epoch: int = 1, keyed: bytes = b"", **fields: object) -> DigestBatch:
    return DigestBatch(index=index, epoch=epoch, last=Position(index * 10), started_ms=index, keyed=keyed, **fields)  # type: ignore[arg-type]


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
    """Positions beyond 64 bits, the batch index, the redo set with its settings, window reach, the window the
    batches were written under, counters, the owner's clock bound, the start whose earlier events the shard
    loaded and a stall its owner is in survive."""
    store.replace_if_unchanged(KEY, None, owned())
    full = ShardState(
        epoch=1,
        version=2,
        owner="w1",
        lease_until_ms=123456789,
        position=Position(49_612_345_678_901_234_567_890_123_456_789_012_345_678_901_234_567_890, 7),
        batches=3,
        redo_last=Position(10**41, 0),
        redo_digests=(2**80 - 1, 1, 2**64),
        redo_settings='{"k":"json:id","u":"forward","d":null,"t":"target","m":1048576,"dm":1048576}',
        redo_suspect=True,
        closed=True,
        counters={"forwarded": 10, "duplicates": 2},
        updated_ms=5,
        behind_ms=7,
        window_ids=3_600_000,
        window_oldest_ms=1_700_000_000_000,
        window_newest_ms=1_700_003_600_000,
        window_cut=True,
        window_ms=259_200_000,
        clock_bound_ms=17,
        prestart_ms=1_699_999_000_000,
        position_arrival_ms=1_700_000_000_123,
        position_age_ms=2_500,
        stall_reason="rejected",
        stall_detail="PutRecords: ValidationException: record too large",
        stall_since_ms=1_700_000_000_456,
    )
    store.write(KEY, owned(), full)
    assert store.get(KEY) == full
    assert store.get_many([KEY, "staging/other"]) == {KEY: full}


def test_a_state_item_written_before_the_replication_checkpoint_is_read_and_written_on(
    backend_endpoints: Endpoints,
) -> None:
    """An item an earlier copier wrote has no position_arrival_ms nor position_age_ms: both stores read it with
    neither (None), and the next owner's commit adds them."""
    import boto3

    from copier.adapters.stateitems import STATE_SK, state_fields, to_wire

    dynamo, lean = _table(backend_endpoints)
    earlier = replace(owned(), position=Position(5), counters={"forwarded": 5})
    fields = {k: v for k, v in state_fields(earlier).items() if not k.startswith("position_")}
    assert "position" in fields and len(fields) == len(state_fields(earlier)) - 2
    client = boto3.client(
        "dynamodb",
        endpoint_url=backend_endpoints.dynamodb,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.put_item(TableName=dynamo.config.state_table_name, Item=to_wire(KEY, STATE_SK, fields))
    assert dynamo.get(KEY) == lean.get(KEY) == earlier
    later = replace(earlier, version=2, position=Position(9), position_arrival_ms=1_000, position_age_ms=20)
    lean.write(KEY, earlier, later)
    assert dynamo.get(KEY) == later


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


def test_an_owners_older_write_arriving_late_is_refused(store: StateStore) -> None:
    """A first attempt the client gave up on can reach the table after its retry and after later writes: it
    must not roll the item back (the next owner would forget what was committed since). Nor may a retry of a
    write that went through be applied twice: it is refused too, and the writer reads the item back."""
    v1 = owned()
    store.replace_if_unchanged(KEY, None, v1)
    v2 = replace(v1, version=2, batches=1, position=Position(10))
    store.write(KEY, v1, v2)
    v3 = replace(v2, version=3, batches=2, position=Position(20))
    store.write(KEY, v2, v3)
    with pytest.raises(FencedError):
        store.write(KEY, v1, v2)  # the late first attempt of the write of v2
    with pytest.raises(FencedError):
        store.write(KEY, v2, v3)  # a resend of the write of v3, which went through
    assert store.get(KEY) == v3


def test_a_digest_batch_round_trips_every_field(store: StateStore) -> None:
    """Packed digests of each kind, the arrival range, the target shard numbers, the plan settings, the redo
    identities, the expiry (in whole seconds, as DynamoDB's TTL keeps it), the writer's clock bound and the IDs of
    what arrived before the application's start survive."""
    full = DigestBatch(
        index=7,
        epoch=3,
        last=Position(10**45, 12),
        started_ms=1_700_000_000_123,
        keyed=digests(500),
        unkeyed=digests(3, seed=1),
        deadletter=digests(2, seed=2),
        arrival_min_ms=1_700_000_000_000,
        arrival_max_ms=1_700_000_000_999,
        target_shards=(0, 3, 130, 4000),
        settings='{"k":"json:eventId","u":"forward","d":"dlq","t":"target","m":1048576,"dm":1048576}',
        dead_ids=digests(1, seed=3),
        redo_ids=digests(505, seed=4),
        redo_settings='{"k":"json:id","u":"forward","d":null,"t":"target","m":1048576,"dm":1048576}',
        expires_ms=1_700_090_000_000,
        clock_bound_ms=42,
        revision=2,
        before_ids=digests(4, seed=5),
    )
    store.put_batch(KEY, full)
    assert store.get_batch(KEY, 7) == full
    assert store.get_batch(KEY, 8) is None
    assert len(full.target_digests()) == 503 and full.target_digests()[:500] == unpack_digests(full.keyed)


def test_a_digest_batch_of_arrivals_at_the_edges_of_a_long_is_written(store: StateStore) -> None:
    """A batch's expiry follows its newest staging arrival, which the daemon passes on as a Java long: at the
    largest long the expiry is past any datetime, and the write raised (the processor exited on every delivery).
    It is written, with an expiry far off (never, in practice), and its arrivals as they were."""
    huge = batch(1, arrival_min_ms=-(2**63), arrival_max_ms=2**63 - 1, expires_ms=2**63 - 1 + 3_600_000)
    store.put_batch(KEY, huge)
    stored = store.get_batch(KEY, 1)
    assert stored is not None and (stored.arrival_min_ms, stored.arrival_max_ms) == (-(2**63), 2**63 - 1)
    assert stored.expires_ms > 5_000 * 365 * 86_400_000  # past the year 6900


def test_a_lower_epoch_cannot_overwrite_a_digest_batch(store: StateStore) -> None:
    """A zombie's late write of an index a newer owner recorded fails; the same or a newer epoch may overwrite."""
    store.put_batch(KEY, batch(1, epoch=2, keyed=digests(1, seed=2)))
    with pytest.raises(FencedError):
        store.put_batch(KEY, batch(1, epoch=1, keyed=digests(1, seed=1)))
    store.put_batch(KEY, batch(1, epoch=2, keyed=digests(1, seed=2)))  # a retried write of one's own
    store.put_batch(KEY, batch(1, epoch=3, keyed=digests(1, seed=3)))  # a newer owner over a leftover
    stored = store.get_batch(KEY, 1)
    assert stored is not None and (stored.epoch, stored.keyed) == (3, digests(1, seed=3))


def test_a_late_first_write_of_a_re_planned_digest_batch_is_refused(store: StateStore) -> None:
    """copier.core.replan: a writer re-plans its chunk (revision 1) after its first write of the batch got no
    answer; the first attempt, landing late, must not put back the batch the re-plan replaced. Its own retries
    go through, and a newer owner's seal replaces any revision."""
    store.put_batch(KEY, batch(1, epoch=2, keyed=digests(2, seed=1)))
    replanned = batch(1, epoch=2, keyed=digests(1, seed=1), deadletter=digests(1, seed=2), revision=1)
    store.put_batch(KEY, replanned)
    with pytest.raises(FencedError):
        store.put_batch(KEY, batch(1, epoch=2, keyed=digests(2, seed=1)))  # the late first attempt
    store.put_batch(KEY, replanned)  # a retried write of the re-planned batch
    stored = store.get_batch(KEY, 1)
    assert stored is not None and (stored.keyed, stored.deadletter, stored.revision) == (
        replanned.keyed,
        replanned.deadletter,
        1,
    )
    store.put_batch(KEY, batch(1, epoch=3, keyed=digests(2, seed=1)))  # a successor's seal: revision 0, epoch 3
    stored = store.get_batch(KEY, 1)
    assert stored is not None and (stored.epoch, stored.keyed, stored.revision) == (3, digests(2, seed=1), 0)


def test_batches_lists_committed_indexes_newest_first_and_lazily(store: StateStore) -> None:
    """Only indexes at or below the committed one are listed, newest first; a caller may stop early."""
    for index in (1, 2, 3, 4):
        store.put_batch(KEY, batch(index))
    assert [b.index for b in store.batches(KEY, 3)] == [3, 2, 1]
    assert list(store.batches(KEY, 0)) == []
    assert next(iter(store.batches(KEY, 4))).index == 4


def test_a_full_chunk_fits_in_one_item(store: StateStore) -> None:
    """A chunk of MAX_CHUNK_EVENTS digests, and a redo set as large, stay within DynamoDB's item limit."""
    store.put_batch(KEY, batch(1, keyed=digests(MAX_CHUNK_EVENTS), target_shards=tuple(range(0, 2000, 3))))
    stored = store.get_batch(KEY, 1)
    assert stored is not None and stored.keyed_count == MAX_CHUNK_EVENTS
    store.replace_if_unchanged(KEY, None, owned())
    redo = tuple(unpack_digests(digests(MAX_CHUNK_EVENTS)))
    big = replace(owned(), version=2, redo_digests=redo, redo_last=Position(5))
    store.write(KEY, owned(), big)
    assert store.get(KEY) == big


def test_an_application_item_is_written_only_over_the_version_read(store: StateStore) -> None:
    """The application's answers (``copier.core.summaryboard``): created only where absent, replaced only
    over the version read, read back as written (a settings answer of every field); beside a shard's items,
    never one of them."""
    key = "#summary/0123456789abcdef/target"
    assert store.get_posted(key) is None
    text = Posted(
        StreamSettings("target", 86_400_000, 10 * 1024 * 1024, "AUTO", "KMS", "alias/k", "ON_DEMAND", 4096),
        1_800_000_000_000,
        1_800_000_290_000,
        None,
        1_800_000_010_000,
    ).encode()
    first = store.post(key, None, text, 1_800_086_400_000)
    assert first == BoardItem(1, text) and store.get_posted(key) == first
    with pytest.raises(StateConflict):
        store.post(key, None, "{}", 1_800_086_400_000)
    second = store.post(key, first, "second", 1_800_086_400_000)
    assert second.version == 2
    with pytest.raises(StateConflict):
        store.post(key, first, "late", 1_800_086_400_000)
    assert store.get_posted(key) == second
    assert store.get(key) is None, "not a shard's state"
    store.replace_if_unchanged(KEY, None, owned())
    assert store.get_posted(KEY) is None, "a shard's state is not an application item"
    assert store.get_posted(key) == second


def test_an_item_on_the_wire_types_every_value_as_it_always_did_subclasses_included() -> None:
    """``to_wire`` writes numbers and strings the short way, exactly ``int`` and ``str``: a bool stays BOOL,
    subclasses of int and str (an IntEnum, a StrEnum) are typed as ``_value`` types them, a None left out,
    and the attributes keep their order."""
    import enum
    from datetime import UTC, datetime

    from copier.adapters import stateitems

    class Level(enum.IntEnum):
        HIGH = 7

    class Name(enum.StrEnum):
        A = "a"

    fields = {
        "n": 5,
        "neg": -3,
        "s": "text",
        "t": True,
        "f": False,
        "none": None,
        "b": b"\x00\x01",
        "when": datetime(2026, 11, 24, tzinfo=UTC),
        "m": {"x": 1, "y": True},
        "level": Level.HIGH,
        "name": Name.A,
        "empty": "",
        "zero": 0,
    }
    expected = {"pk": {"S": "p"}, "sk": {"S": "s"}}
    expected.update((k, stateitems._value(v)) for k, v in fields.items() if v is not None)
    got = stateitems.to_wire("p", "s", fields)
    assert got == expected and list(got) == list(expected)
    assert got["t"] == {"BOOL": True} and got["n"] == {"N": "5"} and got["level"] == {"N": "7"}


def test_plan_settings_encode_each_distinct_settings_as_their_own() -> None:
    """``PlanSettings.encode`` is cached per distinct settings: settings that differ in any one field that is
    stored encode apart, and each decodes back to itself."""
    from copier.core.config import parse_dedup_key
    from copier.core.plan import PlanSettings

    base = PlanSettings(parse_dedup_key("json:eventId"), "forward", None, "staging", "shardId-0", "target", 1000, 1000)
    variants = [
        base,
        replace(base, max_record_bytes=999),
        replace(base, dead_letter_max_bytes=998),
        replace(base, unkeyed_policy="deadletter", dead_letter_stream="dlq"),
        replace(base, dedup_key=parse_dedup_key("partitionKey")),
        replace(base, typed_ids=False),
        replace(base, target_stream="other"),
    ]
    texts = [s.encode() for s in variants] + [s.encode() for s in variants]
    assert len(set(texts)) == len(variants)
    for settings in variants:
        assert PlanSettings.decode(settings.encode(), "staging", "shardId-0") == settings
