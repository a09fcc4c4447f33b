"""Positions compare as numbers; event IDs are extracted, and keys measured, without ever raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copier.core.config import DedupKey
from copier.core.identity import EventId, Unkeyed, content_digest, extract_event_id, id_digest, identity_of
from copier.core.limits import CODE_POINTS, UTF16_UNITS, key_length, key_problem, record_size
from copier.core.plan import PlanSettings
from copier.core.positions import Position
from copier.core.shardmap import ShardMap, hash_key, key_hashes, shards_covering
from tests.support.fakes import SHARD, config
from tests.support.records import kinesis_takes

EMOJI = "\U0001f600"


seqs = st.integers(min_value=0, max_value=10**60)


@given(seqs, st.integers(0, 10**4), seqs, st.integers(0, 10**4))
def test_positions_order_numerically_then_by_subsequence(a: int, sa: int, b: int, sb: int) -> None:
    """Position order is (sequence number, sub-sequence number) as integers, whatever their string lengths."""
    pa, pb = Position.parse(str(a), sa), Position.parse(str(b), sb)
    assert (pa < pb) == ((a, sa) < (b, sb))


def test_text_order_differs_from_numeric_order() -> None:
    """The bug this guards against: "10" < "9" as text."""
    assert Position.parse("9") < Position.parse("10")


JSON_KEY = DedupKey("json", ("meta", "id"))


def test_nested_json_path() -> None:
    """json:meta.id reads a nested field; integers are accepted as IDs."""
    assert extract_event_id(JSON_KEY, "pk", b'{"meta": {"id": "x1"}}') == EventId("x1")
    assert extract_event_id(JSON_KEY, "pk", b'{"meta": {"id": 42}}') == EventId(42)  # typed: not "42"


def test_reasons_for_unkeyed_records() -> None:
    """Each way an ID can be missing has its own reason."""
    cases = {
        b"\x00\xff": "payload is not JSON",
        b"[1, 2]": "payload is not a JSON object",
        b'{"meta": 3}': "meta is not a JSON object",
        b'{"other": 1}': "field meta is missing",
        b'{"meta": {"id": null}}': "field meta.id is NoneType, not a string or integer",
        b'{"meta": {"id": true}}': "field meta.id is bool, not a string or integer",
        b'{"meta": {"id": ""}}': "field meta.id is empty",
    }
    for data, reason in cases.items():
        assert extract_event_id(JSON_KEY, "pk", data) == Unkeyed(reason)


def test_partition_key_mode() -> None:
    """dedupKey = partitionKey uses the record's partition key."""
    assert extract_event_id(DedupKey("partitionKey"), "abc", b"whatever") == EventId("abc")


@given(st.binary(max_size=200))
def test_extraction_never_raises(data: bytes) -> None:
    """Arbitrary bytes give an ID or a reason, never an exception."""
    assert isinstance(extract_event_id(JSON_KEY, "pk", data), (EventId, Unkeyed))


@given(st.text(min_size=1, max_size=30))
def test_identity_of_a_forwarded_record_is_its_id_digest(event_id: str) -> None:
    """Reading a target record back gives the digest recorded for it: the ID digest when keyed."""
    data = json.dumps({"meta": {"id": event_id}}).encode()
    assert identity_of(JSON_KEY, "pk", data) == id_digest(event_id)


def test_id_and_content_digests_are_separate_domains() -> None:
    """An ID digest never equals the content digest of the same text; both are 80-bit."""
    assert id_digest("abc") != content_digest("", b"abc")
    assert 0 <= id_digest("abc") < 2**80 and 0 <= content_digest("", b"abc") < 2**80
    assert id_digest("abc") == id_digest("abc")


JSONISH = st.one_of(
    st.binary(max_size=60), st.text(max_size=60).map(str.encode), st.from_regex(r"\s*\{.*\}\s*").map(str.encode)
)


@given(JSONISH)
def test_the_fast_json_parse_agrees_with_json_loads_on_utf8(data: bytes) -> None:
    """parse_json accepts exactly what json.loads accepts of UTF-8 text, with the same value."""
    import json

    from copier.core.identity import parse_json

    try:
        expected = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        expected = ValueError
    try:
        got = parse_json(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        got = ValueError
    assert got == expected or (got != got and expected != expected)  # NaN is unequal to itself


def test_the_fast_json_parse_rejects_what_is_not_one_json_value() -> None:
    """Trailing data, two values, and nothing at all are not JSON; surrounding whitespace is."""
    from copier.core.identity import parse_json

    assert parse_json(b' \n{"a": 1}\t ') == {"a": 1}
    for bad in (b'{"a": 1} x', b"{} {}", b"", b"   ", b"\xff"):
        with pytest.raises((ValueError, UnicodeDecodeError)):
            parse_json(bad)


# -- partition keys: counted in code points; a lone surrogate is refused, never raised on -------------------------


@given(st.text(st.characters(exclude_categories=[]), max_size=300), st.binary(max_size=20))
def test_sizes_digests_and_hash_keys_are_defined_for_every_key(key: str, data: bytes) -> None:
    """Whatever the key: its size (its UTF-8 bytes, a lone surrogate as three), its content digest, its hash key
    and its problem are computed, never raised; Kinesis' rule, written apart, agrees with the problem found."""
    assert record_size(key, data) == len(data) + len(key.encode("utf-8", "surrogatepass"))
    assert 0 <= content_digest(key, data) < 2**80
    assert 0 <= hash_key(key) < 2**128
    assert (key_problem(key) is None) == kinesis_takes(key)


def _map(*bounds: int) -> ShardMap:
    """Open shards 0.. splitting the hash key space at ``bounds``."""
    edges = [0, *bounds, 2**128]
    return ShardMap(tuple((edges[i], edges[i + 1] - 1, f"shardId-{i:012d}") for i in range(len(edges) - 1)))


@given(st.lists(st.text(max_size=20), max_size=30), st.lists(st.integers(1, 2**128 - 1), max_size=4, unique=True))
def test_the_target_shards_of_keys_hashed_once_for_a_chunk_are_those_of_the_keys_hashed_again(
    keys: list[str], bounds: list[int]
) -> None:
    """The digest batch names the same target shards whether the chunk's keys come hashed (``key_hashes``, for
    some of them: a replacement key is hashed on the spot) or are hashed where they are looked up."""
    shard_map = _map(*sorted(bounds))
    hashed = key_hashes(keys[: len(keys) // 2])
    assert shards_covering(shard_map, keys, hashed) == shards_covering(shard_map, keys)
    expected = {int(s[2].rsplit("-", 1)[1]) for s in shard_map.ranges if any(s[0] <= hash_key(k) <= s[1] for k in keys)}
    assert shards_covering(shard_map, keys, hashed) == (None if len(expected) == len(shard_map.ranges) else expected)


def test_a_partition_key_is_counted_in_code_points_and_an_old_batch_in_utf16_units() -> None:
    """Kinesis counts code points (copier.core.limits); a digest batch planned when copier counted UTF-16 code
    units says nothing of the count ("kc" absent) and is redone under it, so it recognises what it recorded."""
    assert key_length(EMOJI * 200) == 200 and key_problem(EMOJI * 256) is None
    assert key_problem(EMOJI * 257) == "partition key has 257 characters, over Kinesis' 256"
    assert key_problem(EMOJI * 200, UTF16_UNITS) == "partition key has 400 characters, over Kinesis' 256"
    recorded = json.dumps({"k": "json:eventId", "u": "forward", "d": None, "t": "target", "m": 1, "dm": 1, "i": 1})
    assert PlanSettings.decode(recorded, "staging", SHARD).key_count == UTF16_UNITS
    fresh = PlanSettings(config().dedup_key, "forward", None, "staging", SHARD)
    assert PlanSettings.decode(fresh.encode(), "staging", SHARD).key_count == CODE_POINTS


def test_with_the_partition_key_as_the_id_a_lone_surrogate_is_no_id() -> None:
    """dedupKey = partitionKey: a key with a lone surrogate goes out under a replacement key, so it is no ID."""
    key = config(dedupKey="partitionKey").dedup_key
    assert extract_event_id(key, "k\ud800", b"") != EventId("k\ud800")
    assert extract_event_id(key, EMOJI * 200, b"") == EventId(EMOJI * 200)
