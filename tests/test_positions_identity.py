"""Positions compare as numbers; event IDs are extracted without ever raising."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from copier.core.config import DedupKey
from copier.core.identity import EventId, Unkeyed, content_digest, extract_event_id, id_digest, identity_of
from copier.core.positions import Position

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
