"""The per-shard limits the chaos proxy's ``limits`` profile enforces (copier.chaos.limits), on a stepped clock."""

from __future__ import annotations

from copier.chaos.limits import (
    BIG_READ_BYTES,
    MIB,
    READ_BYTES_PER_S,
    READ_CALLS_PER_S,
    WRITE_RECORDS_PER_S,
    ShardLimits,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_shard_takes_1000_records_a_second_and_refuses_the_rest_of_one_put_alone() -> None:
    clock = Clock()
    limits = ShardLimits(clock)
    first = limits.admit_puts("s", [("shardId-0", 10)] * 600)
    second = limits.admit_puts("s", [("shardId-0", 10), ("shardId-1", 10)] * 500)
    assert all(first)
    assert second[0::2] == [True] * 400 + [False] * 100  # shardId-0: 1,000 in the second, then refused
    assert all(second[1::2])  # another shard has its own allowance
    clock.now += 0.5
    assert limits.admit_puts("s", [("shardId-0", 10)] * 501) == [True] * 500 + [False]
    assert limits.admit_puts("other", [("shardId-0", 10)]) == [True]  # and another stream


def test_a_shard_takes_one_mib_a_second_and_a_larger_record_only_on_a_full_bucket() -> None:
    clock = Clock()
    limits = ShardLimits(clock)
    assert limits.admit_puts("s", [("a", MIB // 2), ("a", MIB // 2), ("a", 1)]) == [True, True, False]
    clock.now += 1
    assert limits.admit_puts("s", [("a", 2 * MIB)]) == [True]  # a full bucket takes it, and is in debt
    clock.now += 0.9
    assert limits.admit_puts("s", [("a", 1)]) == [False]  # 1 MiB in debt: 0.9 s repaid 0.9 MiB of it
    clock.now += 0.2
    assert limits.admit_puts("s", [("a", 1)]) == [True]


def test_an_entry_of_no_known_shard_is_left_to_the_backend() -> None:
    limits = ShardLimits(Clock())
    assert limits.admit_puts("s", [(None, 10)] * (WRITE_RECORDS_PER_S + 5)) == [True] * (WRITE_RECORDS_PER_S + 5)


def test_a_shard_serves_five_reads_a_second() -> None:
    clock = Clock()
    limits = ShardLimits(clock)
    assert [limits.admit_read("s", "a") for _ in range(READ_CALLS_PER_S + 1)] == [True] * READ_CALLS_PER_S + [False]
    assert limits.admit_read("s", "b")  # per shard
    clock.now += 0.2
    assert limits.admit_read("s", "a")
    assert not limits.admit_read("s", "a")


def test_reads_past_two_mib_a_second_are_refused_until_repaid() -> None:
    clock = Clock()
    limits = ShardLimits(clock)
    assert limits.admit_read("s", "a")
    limits.charge_read("s", "a", READ_BYTES_PER_S + MIB)  # 3 MiB read: 1 MiB in debt
    clock.now += 0.4
    assert not limits.admit_read("s", "a")
    clock.now += 0.2
    assert limits.admit_read("s", "a")


def test_a_10_mib_read_throttles_the_shards_next_reads_for_5_seconds() -> None:
    clock = Clock()
    limits = ShardLimits(clock)
    assert limits.admit_read("s", "a")
    limits.charge_read("s", "a", BIG_READ_BYTES)
    clock.now += 4.9  # the debt (8 MiB at 2 MiB/s) is repaid after 4 s: the 5 s rule holds them longer
    assert not limits.admit_read("s", "a")
    assert limits.admit_read("s", "b")
    clock.now += 0.1
    assert limits.admit_read("s", "a")


def test_a_read_just_under_10_mib_pauses_only_for_its_debt() -> None:
    clock = Clock()
    limits = ShardLimits(clock)
    assert limits.admit_read("s", "a")
    limits.charge_read("s", "a", BIG_READ_BYTES - 1)
    clock.now += 4.1
    assert limits.admit_read("s", "a")
