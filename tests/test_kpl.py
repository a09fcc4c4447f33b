"""KPL aggregation (copier.core.kpl): the aws-kinesis-agg format the KCL de-aggregates."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copier.core import kpl
from copier.core.limits import MAX_RECORD_BYTES, record_size
from copier.kcl.jars import jars

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


# -- de-aggregation as the KCL does it, whatever the producer wrote ------------------------------------------------


def _frame(message: bytes) -> bytes:
    return kpl.MAGIC + message + hashlib.md5(message).digest()


def _user(pk: int | None = 0, ehk: int | None = None, data: bytes | None = b"x", extra: bytes = b"") -> bytes:
    out = b"" if pk is None else b"\x08" + kpl._varint(pk)
    out += b"" if ehk is None else b"\x10" + kpl._varint(ehk)
    return out + (b"" if data is None else kpl._delimited(3, data)) + extra


def _aggregate(keys: list[bytes], users: list[bytes], hash_keys: tuple[bytes, ...] = ()) -> bytes:
    parts = [kpl._delimited(1, k) for k in keys] + [kpl._delimited(2, h) for h in hash_keys]
    return _frame(b"".join(parts + [kpl._delimited(3, u) for u in users]))


def test_a_user_key_that_is_not_utf8_is_read_as_the_kcl_reads_it() -> None:
    """protobuf-java reads a proto2 string leniently: bytes that are not UTF-8 become U+FFFD, and the aggregate's
    user records are delivered. Before, the whole aggregate was taken for undecodable and passed through as one
    opaque record: a fenced processor reading its range again forwarded other records than the daemon gave."""
    data = _aggregate([b"k\xff", b"k\xed\xa0\x80", "\U0001f600".encode()], [_user(0), _user(1), _user(2)])
    view = kpl.as_daemon_delivers(data, "outer", (0, 2**128 - 1))
    assert view.problem is None and view.aggregated
    assert view.records == [("k\ufffd", b"x"), ("k\ufffd", b"x"), ("\U0001f600", b"x")]


@pytest.mark.parametrize(
    ("hash_key", "delivered"),
    [("5", True), ("0005", True), ("+5", True), ("\u0663", True), (" 5", False), ("5_0", False), ("x", False)],
)
def test_an_explicit_hash_key_is_a_number_as_java_reads_one(hash_key: str, delivered: bool) -> None:
    """``new BigInteger``: a sign and decimal digits of any script, nothing else (Python's int also takes spaces
    and underscores). A key the KCL cannot read stops its aggregate there (``bad_index``)."""
    data = _aggregate([b"a"], [_user(0, 0)], (hash_key.encode(),))
    view = kpl.as_daemon_delivers(data, "outer", (0, 2**128 - 1))
    assert (view.records == [("a", b"x")]) == delivered
    assert (view.problem == "bad_index") == (not delivered)


@given(st.binary(max_size=80))
def test_no_bytes_make_the_de_aggregation_raise(message: bytes) -> None:
    """Any protobuf in a valid frame, and any record at all, gives what the daemon delivers, never an exception."""
    for data in (_frame(message), message):
        view = kpl.as_daemon_delivers(data, "pk", (0, 2**127))
        assert isinstance(view.records, list)


def _hostile_corpus(seed: int, count: int) -> list[bytes]:
    """Aggregates a careless or hostile producer could write: keys that are not UTF-8 or encode surrogates,
    explicit hash keys of every form, user records without their required fields or with a Tag without its key,
    indexes past the tables or past 2**32, fields of the wrong wire type, groups (nested up to protobuf-java's
    limit and past it), cut-short fields; and valid aggregates with bytes changed, cut or added."""
    rng = random.Random(seed)
    keys = [b"a", b"k\xed\xa0\x80", b"\xff\xfe", b"", "\U0001f600".encode() * 3, b"z" * 300, b"\xed\xa0"]
    hash_keys = [b"5", b"0005", b" 5", b"5_0", b"-1", "\u0663".encode(), b"1" * 50, b"0" * 60 + b"7", b"abc"]
    hash_keys += [str(2**128 - 1).encode(), str(2**128).encode(), b"\xff"]
    oddities = [b"\x08\x05", b"\x0b\x10\x01\x0c", b"\x09\x00\x00\x00", b"\x00", b"\x0c", b"\x0e"]
    out = []
    for _ in range(count):
        if rng.random() < 0.5:
            users = []
            for _ in range(rng.randint(0, 3)):
                users.append(
                    rng.choice(
                        [
                            _user(rng.randint(0, 3), rng.choice([None, None, 0, 1, 2])),
                            _user(None),
                            _user(0, data=None),
                            _user(2**32),
                            _user(0, extra=kpl._delimited(4, b"")),
                            _user(0, extra=kpl._delimited(4, kpl._delimited(1, b"t"))),
                            b"\x18\x01" + _user(0),
                        ]
                    )
                )
            chosen_keys = rng.sample(keys, rng.randint(0, 3))
            message = _aggregate(chosen_keys, users, tuple(rng.sample(hash_keys, rng.randint(0, 2))))[4:-16]
            if rng.random() < 0.2:
                message += rng.choice(oddities)
        else:
            records = [(rng.choice(["a", "b", "\u00e9"]), rng.randbytes(rng.randint(0, 5))) for _ in range(3)]
            message = bytearray(kpl.aggregate(records, explicit_hash_key=str(rng.choice([1, 2**127])))[0].data[4:-16])
            for _ in range(rng.randint(0, 3)):
                where = rng.randrange(len(message) + 1)
                change = rng.random()
                if change < 0.4 and where < len(message):
                    message[where] = rng.randrange(256)
                elif change < 0.6:
                    del message[where:]
                else:
                    message[where:where] = bytes([rng.choice([0x0B, 0x0C, 0x13, 0x14, 0x09, 0x0D, 0x00, 0x1E])])
            if rng.random() < 0.05:
                depth = rng.choice([99, 100, 101])
                message = b"\x0b" * depth + b"\x0c" * depth + message
        out.append(_frame(bytes(message)))
    return out


def test_de_aggregation_matches_the_kcls_own_on_hostile_aggregates(tmp_path: Path) -> None:
    """The KCL 3.1.3 jars the daemon runs, given 2,000 hostile aggregates, deliver exactly what
    ``as_daemon_delivers`` says, record for record, key for key (compared in UTF-16 units); where the KCL throws
    instead (NoClassDefFoundError: its error path needs javax.xml.bind, which Java 11 and later lack), copier
    says ``bad_index``."""
    javac, java = shutil.which("javac"), shutil.which("java")
    assert javac and java, "make install needs a JDK"
    classpath = os.pathsep.join([*map(str, jars()), str(tmp_path)])
    source = Path(__file__).parent / "support" / "java" / "KclDeaggregation.java"
    subprocess.run([javac, "-nowarn", "-cp", classpath, "-d", str(tmp_path), str(source)], check=True)
    corpus = _hostile_corpus(seed=43, count=2000)
    ranges = [(0, 2**128 - 1), (0, 2**127), (2**127, 2**128 - 1)]
    cases = [(data, ranges[i % 3]) for i, data in enumerate(corpus)]
    lines = "".join(f"{data.hex()} {b'outer'.hex()} {low} {high}\n" for data, (low, high) in cases)
    answers = tmp_path / "answers.txt"
    subprocess.run([java, "-cp", classpath, "KclDeaggregation", str(answers)], input=lines, text=True, check=True)
    thrown = 0
    for (data, shard_range), kcl in zip(cases, answers.read_text().split("\n"), strict=False):
        view = kpl.as_daemon_delivers(data, "outer", shard_range)
        if kcl.startswith("ERR"):
            thrown += 1
            assert view.problem == "bad_index", (data.hex(), kcl)
            continue
        ours = [str(len(view.records))] + [
            f"{k.encode('utf-16-be').hex() or '-'}:{d.hex() or '-'}:{i if view.aggregated else 0}"
            for i, (k, d) in enumerate(view.records)
        ]
        assert " ".join(ours) == kcl, data.hex()
    assert 0 < thrown < len(cases) // 2
