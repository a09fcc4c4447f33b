"""orjson reads and writes for copier only where its answer is json's, and never an event's payload
(copier.core.fastjson): its key cache can hand back another key than the one a payload holds."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copier.adapters.putbody import put_records_body
from copier.core import fastjson
from copier.core.config import DedupKey
from copier.core.identity import EventId, Unkeyed, extract_event_id

# Two keys whose bytes have one 64-bit xxh3 hash, found by an adversarial review of this module (2026-11-27):
# orjson 3.13, having read the first, reads the second as the first.
CACHED, COLLIDING = "id_ezFZ", "flrLduAr"


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (1, 1.0 and True are three values here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_an_event_whose_key_collides_in_orjsons_cache_keeps_the_verdict_json_gives() -> None:
    key = DedupKey("json", (CACHED,))
    fastjson.loads(json.dumps({CACHED: "daemon line"}))  # in orjson's cache, however copier's reads put it there
    orjson.loads(json.dumps({CACHED: "E1"}))
    assert extract_event_id(key, "pk", json.dumps({CACHED: "E1"}).encode()) == EventId("E1")
    other = json.dumps({COLLIDING: "E1", "body": "a different event"}).encode()
    assert extract_event_id(key, "pk", other) == Unkeyed(f"field {CACHED} is missing")  # not E1: not dropped
    nested = DedupKey("json", ("meta", CACHED))
    assert extract_event_id(nested, "pk", json.dumps({"meta": {COLLIDING: 7}}).encode()) == Unkeyed(
        f"field meta.{CACHED} is missing"
    )


# Every kind of value json reads, the ones orjson reads otherwise or refuses among them: integers past 64 bits,
# floats out of a double's range, NaN and Infinity, lone surrogates, control characters.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.sampled_from('a\x00\x1f"\\'))
)
documents = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
)


@settings(max_examples=500, deadline=None)
@given(documents, st.sampled_from([None, 0, 2]), st.booleans())
def test_loads_reads_what_json_reads(value: Any, indent: int | None, ascii_only: bool) -> None:
    """For the documents copier reads with it (the daemon's lines, AWS's answers): integers within 64 bits."""
    text = json.dumps(value, allow_nan=True, indent=indent, ensure_ascii=ascii_only)
    assert same(fastjson.loads(text), json.loads(text))
    if ascii_only:
        assert same(fastjson.loads(text.encode()), json.loads(text))


def test_loads_raises_what_json_raises() -> None:
    for text in ("", "{", '{"a": 1,}', "[1] x", '{"a": "\x01"}'):
        with pytest.raises(json.JSONDecodeError):
            fastjson.loads(text)


finite = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
)


@settings(max_examples=500, deadline=None)
@given(finite)
def test_dumps_writes_the_value_json_writes(value: Any) -> None:
    """A request body says what json.dumps said (lone surrogates and integers past 64 bits: json writes them)."""
    assert same(json.loads(fastjson.dumps(value)), json.loads(json.dumps(value)))


def test_without_orjson_json_reads_and_writes_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark cluster's Python, given copier as a zip, has no orjson: copier still imports and reads."""
    monkeypatch.setattr(fastjson, "orjson", None)
    assert same(fastjson.loads('{"a": [1, 2.5, "\\ud800", NaN]}'), {"a": [1, 2.5, "\ud800", math.nan]})
    assert json.loads(fastjson.dumps({"a": "\ud800", "b": 2**70})) == {"a": "\ud800", "b": 2**70}


@settings(max_examples=300, deadline=None)
@given(
    st.text(),
    st.lists(st.tuples(st.text(), st.binary(max_size=40), st.booleans()), max_size=6),
)
def test_a_put_records_body_says_what_json_dumps_said(stream: str, drawn: list[tuple[str, bytes, bool]]) -> None:
    entries = [(key, data, base64.b64encode(data).decode() if given_b64 else None) for key, data, given_b64 in drawn]
    body = put_records_body(stream, entries)
    assert body.isascii()
    expected = {
        "StreamName": stream,
        "Records": [{"Data": base64.b64encode(data).decode(), "PartitionKey": key} for key, data, _ in entries],
    }
    assert json.loads(body) == expected
