"""Nothing in a record's bytes, key or arrival ends the process: every record is forwarded or dead-lettered.

The processor's whole record path in process: the daemon's JSON lines read by
amazon-kclpy's loop through :class:`copier.kcl.processor.FastIO`, the real
:class:`CopierRecordProcessor` and ``ShardWorker``, on the fakes of
``copier.testing`` (whose Kinesis refuses what Kinesis refuses: an empty key,
one over 256 code points, one that is not Unicode text, a record over the
stream's limit). Records are drawn with keys of any code points (lone
surrogates too) and lengths around 256 counted both ways, payloads of any
bytes, JSON objects or not, event IDs of every JSON type, KPL aggregates with
odd user keys and explicit hash keys (as the daemon de-aggregates them), and
arrival times 0, negative and huge. ``tests/test_protocol.py`` runs a corpus
of the same through ``copier process`` itself.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from copier.core import kpl
from copier.core.errors import ProtocolError
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.kcl.processor import CopierRecordProcessor, _records, kcl_process
from copier.local.multilang import Rec
from copier.shard import ShardWorker
from tests.support.fakes import SHARD, World, config
from tests.support.records import check_outcome, kinesis_takes

FULL_RANGE = (0, 2**128 - 1)
LONG_MS = 2**63 - 1  # the daemon's arrival is a Java long


# -- what is drawn ---------------------------------------------------------------------------------------------

ANY_CHAR = st.characters(exclude_categories=[])  # every code point, lone surrogates included
EMOJI = "\U0001f600"


def _around(n: int) -> list[int]:
    return [n - 1, n, n + 1]


KEYS = st.one_of(
    st.text(ANY_CHAR, max_size=300),
    st.builds(lambda n, c: c * n, st.sampled_from([0, 1, *_around(128), *_around(256), 300]), st.sampled_from("k\xe9")),
    st.builds(lambda n: EMOJI * n, st.sampled_from([*_around(128), *_around(256), 300])),  # 2 UTF-16 units each
    st.builds(lambda a, b: a + "\ud800" + b, st.text(max_size=5), st.text(max_size=5)),
    st.sampled_from(["\udc00", "\udbff\udfff", "\ud83d\ude00", "a\x00b", "\ufffd"]),
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.floats(allow_nan=True),
    st.integers(-(2**70), 2**70),
    st.text(ANY_CHAR, max_size=10),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _json(value: object) -> bytes:
    return json.dumps(value).encode()  # ASCII: a lone surrogate is written \\ud800, which Python reads back


@st.composite
def payloads(draw: st.DrawFn, n: int) -> bytes:
    """Record ``n``'s bytes: any bytes, JSON that is or is not an object, or an object whose ``eventId`` (the
    configured dedup key) is any JSON value; a string or integer ID made unique by ``n`` (an ID seen twice would
    rightly go once)."""
    kind = draw(st.sampled_from(["bytes", "json", "id", "string id", "integer id"]))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    if kind == "json":
        return _json(draw(JSON_VALUES))
    extra = draw(st.dictionaries(st.text(max_size=3), JSON_SCALARS, max_size=2))
    extra.pop("eventId", None)
    if kind == "id":
        event_id = draw(st.one_of(st.none(), st.booleans(), st.floats(), st.lists(JSON_SCALARS, max_size=2)))
    elif kind == "string id":
        event_id = draw(st.text(ANY_CHAR, max_size=8)) + f"#{n}"
    else:
        event_id = draw(st.sampled_from([1, -1, 2**64])) * (n + 1)
    return _json({**extra, "eventId": event_id})


HASH_KEYS = st.sampled_from(["5", "0005", " 5", "5_0", "-1", "\u0663", "1" * 50, str(2**128 - 1), str(2**128), "x"])


@st.composite
def aggregate(draw: st.DrawFn, first: int) -> bytes:
    """A KPL aggregate built by hand: user keys written as UTF-8 (a lone surrogate as its three bytes, as a
    non-Java producer writes it) or as bytes that are not UTF-8, explicit hash keys of every form."""
    raw_keys = draw(
        st.lists(
            st.one_of(
                KEYS.map(lambda k: k.encode("utf-8", "surrogatepass")),
                st.binary(max_size=6),
                st.sampled_from([b"\xed\xa0\x80", b"\xff"]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    hash_keys = draw(st.lists(HASH_KEYS, max_size=2))
    count = draw(st.integers(1, 4))
    parts = [kpl._delimited(1, k) for k in raw_keys] + [kpl._delimited(2, h.encode()) for h in hash_keys]
    for i in range(count):
        record = b"\x08" + kpl._varint(draw(st.integers(0, len(raw_keys) - 1)))
        if hash_keys and draw(st.booleans()):
            record += b"\x10" + kpl._varint(draw(st.integers(0, len(hash_keys) - 1)))
        record += kpl._delimited(3, draw(payloads(first + i)))
        parts.append(kpl._delimited(3, record))
    message = b"".join(parts)
    return kpl.MAGIC + message + hashlib.md5(message).digest()


ARRIVALS = st.one_of(
    st.sampled_from([None, 0, -1, -LONG_MS - 1, LONG_MS, 1_700_000_000_000]),
    st.integers(-LONG_MS - 1, LONG_MS),
)


@st.composite
def batches(draw: st.DrawFn, unique_keys: bool) -> list[list[Rec]]:
    """One to three deliveries of records as the daemon hands them over: plain records and de-aggregated
    aggregates (what ``copier.core.kpl.as_daemon_delivers``, checked against the KCL, gives), in shard order.
    ``unique_keys``: no two records share a valid key (``dedupKey = partitionKey``: a key seen twice is one
    event, rightly forwarded once)."""
    out: list[list[Rec]] = []
    seq = draw(st.integers(1, 10**30))
    n = 0
    seen: set[str] = set()
    for _ in range(draw(st.integers(1, 3))):
        delivery: list[Rec] = []
        for _ in range(draw(st.integers(1, 8))):
            seq += draw(st.integers(1, 10**6))
            arrival = draw(ARRIVALS)
            if draw(st.integers(0, 4)) == 0:
                data = draw(aggregate(n))
                view = kpl.as_daemon_delivers(data, draw(st.sampled_from(["outer", EMOJI * 200])), FULL_RANGE)
                users = [] if view.problem == "bad_index" else view.records  # the KCL 3.1.3 fails on those
                records = [(k, d, i if view.aggregated else 0) for i, (k, d) in enumerate(users)]
            else:
                records = [(draw(KEYS), draw(payloads(n)), 0)]
            for drawn, data, subseq in records:
                n += 1
                key = json.loads(json.dumps(drawn))  # as the processor reads it: "\ud83d\ude00" is one character
                if unique_keys and kinesis_takes(key) and key in seen:
                    continue
                seen.add(key)
                delivery.append(Rec(seq, data, key, subseq, arrival))
        out.append(delivery)
    return out


SETUPS = st.sampled_from(
    [
        {},
        {"dedupKey": "partitionKey"},
        {"deadLetterStreamName": "dlq"},
        {"deadLetterStreamName": "dlq", "unkeyedPolicy": "deadletter"},
        {"deadLetterStreamName": "dlq", "dedupKey": "partitionKey", "unkeyedPolicy": "deadletter"},
    ]
)


# -- running the processor as the daemon does -------------------------------------------------------------------


def daemon_lines(deliveries: Sequence[Sequence[Rec]]) -> str:
    """What the daemon writes to a processor's stdin: initialize, then a processRecords line a delivery."""
    lines = [
        json.dumps({"action": "initialize", "shardId": SHARD, "sequenceNumber": "TRIM_HORIZON", "subSequenceNumber": 0})
    ]
    for delivery in deliveries:
        message = {"action": "processRecords", "records": [r.to_json() for r in delivery], "millisBehindLatest": 0}
        lines.append(json.dumps(message))
    return "".join(line + "\n" for line in lines)


def run_processor(world: World, deliveries: Sequence[Sequence[Rec]]) -> str:
    """amazon-kclpy's loop over the daemon's lines, as ``copier process`` runs it; returns what it wrote to the
    daemon. A SystemExit (the process ending, every shard on the host with it) goes up to the test."""

    def make_worker() -> ShardWorker:
        return ShardWorker(world.config, world.store, world.streams, world.clock, owner="w")

    processor = CopierRecordProcessor(make_worker, checkpoint_interval_ms=10**12)
    out, err = io.StringIO(), io.StringIO()
    kcl_process(processor, io.StringIO(daemon_lines(deliveries)), out, err).run()
    assert "Caught exception" not in err.getvalue(), err.getvalue()  # amazon-kclpy swallowed one: a loss
    return out.getvalue()


def outcome(world: World, delivered: Sequence[Rec]) -> None:
    """Each record forwarded or dead-lettered once, nothing else (``tests.support.records.check_outcome``)."""
    target = [(pk, data) for pk, data, _, _ in world.streams.records.get("target", [])]
    check_outcome(delivered, target, world.streams.data("dlq"))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_no_record_ends_the_process_and_each_is_forwarded_or_dead_lettered_once(data: st.DataObject) -> None:
    """Arbitrary records through the processor's whole path: it never exits, acknowledges every delivery, and
    every record is forwarded (a key Kinesis takes as it is, any other under the replacement key) or
    dead-lettered, exactly once."""
    setup = data.draw(SETUPS)
    small_target = "deadLetterStreamName" in setup and data.draw(st.booleans())  # without one: a stall
    world = World(cfg=config(**setup), stall_after=1)
    if small_target:
        world.streams.max_record_bytes["target"] = 120
    deliveries = data.draw(batches(unique_keys=setup.get("dedupKey") == "partitionKey"))
    said = run_processor(world, deliveries)
    assert said.count('"responseFor": "processRecords"') == len(deliveries)
    records = [r for delivery in deliveries for r in delivery]
    outcome(world, records)
    for what, seen in [
        ("a lone surrogate", any("\ud800" <= c <= "\udfff" for r in records for c in r.partition_key)),
        (
            "a key of 257 to 512 UTF-16 units Kinesis takes",
            any(kinesis_takes(r.partition_key) and len(r.partition_key.encode("utf-16-le")) > 512 for r in records),
        ),
        ("a user record of an aggregate", any(r.subseq for r in records)),
        ("dead-lettered", bool(world.streams.data("dlq"))),
        ("a replacement key", any(pk.startswith("copier-") for pk, _, _, _ in world.streams.records.get("target", []))),
    ]:
        if seen:
            event(what)


# -- the pieces, each with the case that ended the process ------------------------------------------------------


@pytest.mark.parametrize("dedup", ["json:eventId", "partitionKey"])
@pytest.mark.parametrize("dead_letter", [False, True], ids=["no dead-letter stream", "dead-letter stream"])
def test_a_key_with_a_lone_surrogate_is_a_per_record_decision(dedup: str, dead_letter: bool) -> None:
    """An unkeyed record whose key is "k\\ud800" (a daemon that escapes it, or bytes that were not UTF-8):
    before, its content digest and size raised UnicodeEncodeError and the process exited on every delivery.
    Now Kinesis' refusal of such a key is the record's: dead-lettered, or forwarded under the replacement key;
    the records around it go on."""
    cfg = config(dedupKey=dedup, **({"deadLetterStreamName": "dlq"} if dead_letter else {}))
    world = World(cfg=cfg, stall_after=1)
    odd = Rec(1, b"not json", "k\ud800", 0, 1_700_000_000_000)
    keyed = Rec(2, json.dumps({"eventId": "e"}).encode(), "e", 0, 1_700_000_000_001)
    with capture_logs() as logs:
        run_processor(world, [[odd, keyed]])
    outcome(world, [odd, keyed])
    (rerouted,) = [e for e in logs if e["event"] == "rerouted"]
    assert rerouted["reason"] == "partition key is not Unicode text: a lone surrogate U+D800 at 1"
    replaced = "copier-" + hashlib.blake2b(b"k\xed\xa0\x80", digest_size=16, person=b"copier-pkey").hexdigest()
    assert (replaced in [pk for pk, _, _, _ in world.streams.records["target"]]) == (not dead_letter)


def test_the_daemons_records_decode_whatever_their_content_and_only_its_own_faults_are_protocol_errors() -> None:
    """A record's key (any string), bytes and arrival (any long, or none) never make the daemon's message
    malformed; a key that is not a string, which the daemon never writes, is a ProtocolError (the process ends)."""
    line = json.dumps({"action": "record", "data": "", "partitionKey": "\ud800", "sequenceNumber": "7"})
    (record,) = _records([json.loads(line)])
    assert record == SourceRecord(Position(7), "\ud800", b"", 0, "")
    for arrival in (-(2**63), 2**63 - 1, None):
        assert _records(
            [{"data": "eA==", "partitionKey": "", "sequenceNumber": "1", "approximateArrivalTimestamp": arrival}]
        )
    with pytest.raises(ProtocolError):
        _records([{"data": "eA==", "partitionKey": 5, "sequenceNumber": "1"}])
