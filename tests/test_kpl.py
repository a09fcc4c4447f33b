"""KPL aggregation (copier.core.kpl): the aws-kinesis-agg format the KCL de-aggregates."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copier.core import kpl
from copier.core.limits import MAX_RECORD_BYTES, record_size

keys = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40)
user_records = st.lists(st.tuples(keys, st.binary(max_size=600)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(records=user_records, max_bytes=st.integers(min_value=700, max_value=6000))
def test_round_trip_keeps_every_record_in_order_within_the_size_limit(
    records: list[tuple[str, bytes]], max_bytes: int
) -> None:
    """Aggregating then de-aggregating gives back every user record, in order, and no output exceeds the limit."""
    out = kpl.aggregate(records, max_bytes=max_bytes)
    assert all(record_size(r.partition_key, r.data) <= max_bytes for r in out)
    back = [user for r in out for user in kpl.deaggregate(r.data, r.partition_key)]
    assert back == records
    assert len(out) <= len(records)


@settings(max_examples=200, deadline=None)
@given(records=st.lists(st.tuples(keys, st.binary(max_size=200)), min_size=2, max_size=40))
def test_aggregates_are_framed_with_magic_and_md5_and_carry_their_hash_key(records: list[tuple[str, bytes]]) -> None:
    """An aggregate has the magic bytes, the MD5 of its protobuf, and its hash key on every user record."""
    (only,) = kpl.aggregate(records)
    assert only.data[:4] == b"\xf3\x89\x9a\xc2"
    assert hashlib.md5(only.data[4:-16]).digest() == only.data[-16:]
    assert only.partition_key == records[0][0]
    assert only.explicit_hash_key == str(kpl.hash_key(records[0][0]))
    message = kpl.decode(only.data)
    assert message.explicit_hash_keys == [only.explicit_hash_key]
    assert all(ehk == 0 for _, ehk, _ in message.records)
    assert sorted(set(message.partition_keys)) == sorted({k for k, _ in records})


def test_a_corrupted_digest_makes_the_record_plain_as_the_kcl_does() -> None:
    """A record whose MD5 tail does not match is passed through as one plain record."""
    (agg,) = kpl.aggregate([("a", b"1"), ("b", b"2")])
    broken = agg.data[:-1] + bytes([agg.data[-1] ^ 1])
    assert not kpl.is_aggregated(broken)
    assert kpl.deaggregate(broken, "pk") == [("pk", broken)]
    assert kpl.deaggregate(b"plain", "pk") == [("pk", b"plain")]


def test_a_lone_record_is_sent_plain_unless_it_looks_like_an_aggregate() -> None:
    """One record gains nothing from framing, except when its own bytes start with the magic."""
    assert kpl.aggregate([("a", b"{}")]) == [kpl.KinesisRecord("a", None, b"{}")]
    tricky = kpl.MAGIC + b"x" * 20
    (out,) = kpl.aggregate([("a", tricky)])
    assert out.explicit_hash_key is not None
    assert kpl.deaggregate(out.data, out.partition_key) == [("a", tricky)]


def test_full_size_limit_is_respected_with_large_records() -> None:
    """Records of 300 KB pack three to an aggregate under 1 MiB; one just under 1 MiB goes alone and plain."""
    big = [(f"k{i}", bytes(300_000)) for i in range(7)]
    out = kpl.aggregate(big)
    assert [len(kpl.deaggregate(r.data, r.partition_key)) for r in out] == [3, 3, 1]
    assert all(record_size(r.partition_key, r.data) <= MAX_RECORD_BYTES for r in out)
    near = [("k", bytes(MAX_RECORD_BYTES - 1))]
    assert kpl.aggregate(near) == [kpl.KinesisRecord("k", None, near[0][1])]
    with pytest.raises(ValueError):
        kpl.aggregate([("k", bytes(MAX_RECORD_BYTES))])


def test_explicit_hash_key_given_by_the_caller_is_used() -> None:
    """A caller grouping by shard can choose the hash key the aggregate is routed by."""
    (out,) = kpl.aggregate([("a", b"1"), ("b", b"2")], explicit_hash_key="42")
    assert out.explicit_hash_key == "42"
    assert kpl.decode(out.data).explicit_hash_keys == ["42"]


def test_hash_key_is_the_md5_of_the_partition_key() -> None:
    """Kinesis' routing hash: the partition key's MD5 read as a big-endian 128-bit integer."""
    assert kpl.hash_key("a") == int(hashlib.md5(b"a").hexdigest(), 16)
