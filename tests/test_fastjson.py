"""orjson reads for copier only where its reading is json's (copier.core.fastjson): an event keyed or not, and
its ID, are what every copier version says, and the daemon's lines and AWS's answers read as json reads them."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copier.adapters.putbody import put_records_body
from copier.core import fastjson
from copier.core.config import DedupKey
from copier.core.identity import EventId, Unkeyed, _exact_event_id, extract_event_id

KEYS = [DedupKey("json", ("eventId",)), DedupKey("json", ("meta", "id"))]


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


# Every kind of value json reads, the ones orjson reads otherwise or refuses among them: integers past 64 bits,
# floats out of a double's range (written as 1e999), NaN and Infinity, lone surrogates, control characters.
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**62, max_value=2**66)
    | st.integers(min_value=-(2**66), max_value=-(2**62))
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.sampled_from('a\x00\x1f"\\'))
)
values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
)


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """A JSON event whose ID field holds any value, written in any of the ways json writes it, then perhaps
    damaged: a byte changed, cut short, or something appended."""
    doc = draw(st.dictionaries(st.text(max_size=3), values, max_size=3))
    key = draw(st.sampled_from(KEYS))
    if len(key.path) == 1:
        doc[key.path[0]] = draw(values)
    else:
        doc[key.path[0]] = draw(st.sampled_from([{key.path[1]: draw(values)}, draw(values)]))
    indent = draw(st.sampled_from([None, 0, 2]))
    text = json.dumps(doc, ensure_ascii=draw(st.booleans()), indent=indent, allow_nan=True)
    data = text.encode("utf-8", "surrogatepass")
    damage = draw(st.sampled_from(["none", "byte", "cut", "append"]))
    if damage == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    elif damage == "cut":
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == "append":
        data += draw(st.sampled_from([b" ", b"\n", b"\x0c", b"x", b"1", b"{}", b"\xff"]))
    return data


@settings(max_examples=600, deadline=None)
@given(payloads(), st.sampled_from(KEYS))
def test_an_event_is_keyed_or_not_and_has_its_id_as_json_reads_it(data: bytes, key: DedupKey) -> None:
    fast = extract_event_id(key, "pk", data)
    exact = _exact_event_id(key, data)
    assert fast == exact
    if isinstance(fast, EventId):
        assert type(fast.value) is type(exact.value)  # type: ignore[union-attr]


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_get_the_verdict_json_gives(data: bytes) -> None:
    assert extract_event_id(KEYS[0], "pk", data) == _exact_event_id(KEYS[0], data)


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"eventId": 18446744073709551616}', EventId(2**64)),  # orjson: a float; json: the integer
        (b'{"eventId": -9223372036854775809}', EventId(-(2**63) - 1)),
        (b'{"eventId": "\\ud800"}', EventId("\ud800")),  # refused by orjson, read by json
        (b'{"eventId": "a", "n": NaN}', EventId("a")),
        (b'{"eventId": "a", "n": 1e999}', EventId("a")),
        (b'{"eventId": 1.0}', Unkeyed("field eventId is float, not a string or integer")),
        (b'{"eventId": ""}', Unkeyed("field eventId is empty")),
        (b'{"eventId": true}', Unkeyed("field eventId is bool, not a string or integer")),
        (b'{"eventId": 7, "eventId": "b"}', EventId("b")),  # the last of a repeated name, as json reads it
        (b'\xef\xbb\xbf{"eventId": "a"}', Unkeyed("payload is not JSON")),  # a byte order mark is no JSON
    ],
)
def test_the_values_where_the_two_parsers_differ(data: bytes, expected: EventId | Unkeyed) -> None:
    assert extract_event_id(KEYS[0], "pk", data) == expected == _exact_event_id(KEYS[0], data)


def test_what_json_refuses_and_orjson_reads_is_never_read_by_orjson() -> None:
    huge = b'{"eventId": "a", "n": ' + b"7" * 4301 + b"}"  # over Python's 4,300 digits: json refuses it
    assert fastjson.trusted_loads(huge) is fastjson.UNSURE
    assert extract_event_id(KEYS[0], "pk", huge) == Unkeyed("payload is not JSON")
    deep = b'{"eventId": "a", "n": ' + b"[" * 1020 + b"]" * 1020 + b"}"  # orjson reads 1,024 levels, json fewer
    assert fastjson.trusted_loads(deep) is fastjson.UNSURE
    assert extract_event_id(KEYS[0], "pk", deep) == _exact_event_id(KEYS[0], deep)
    shallow = b'{"eventId": "a", "n": ' + b"[" * 498 + b"]" * 498 + b"}"  # 499 brackets: read by orjson
    assert fastjson.trusted_loads(shallow) is not fastjson.UNSURE
    assert extract_event_id(KEYS[0], "pk", shallow) == EventId("a")


@settings(max_examples=500, deadline=None)
@given(st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)))
def test_loads_reads_what_json_reads_where_integers_fit_64_bits(value: Any) -> None:
    text = json.dumps(value, allow_nan=True)
    expected = json.loads(text)
    read = fastjson.loads(text)
    # An integer past 64 bits orjson reads as a float: the daemon's lines and AWS's answers hold none.
    assert same(read, expected) or _holds_a_wide_integer(expected)


def _holds_a_wide_integer(value: Any) -> bool:
    if type(value) is int:
        return not -(2**63) <= value < 2**64
    if isinstance(value, dict):
        return any(_holds_a_wide_integer(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_a_wide_integer(v) for v in value)
    return False


def test_loads_raises_what_json_raises() -> None:
    for text in ("", "{", '{"a": 1,}', "[1] x"):
        with pytest.raises(json.JSONDecodeError):
            fastjson.loads(text)


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


def test_without_orjson_json_reads_and_writes_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Spark cluster's Python, given copier as a zip, has no orjson: copier.core.identity still imports."""
    monkeypatch.setattr(fastjson, "orjson", None)
    assert fastjson.trusted_loads(b'{"eventId": "a"}') is fastjson.UNSURE
    assert extract_event_id(KEYS[0], "pk", b'{"eventId": "a"}') == EventId("a")
    assert same(fastjson.loads('{"a": [1, 2.5, "\\ud800"]}'), {"a": [1, 2.5, "\ud800"]})
    assert json.loads(fastjson.dumps({"a": "\ud800", "b": 2**70})) == {"a": "\ud800", "b": 2**70}
