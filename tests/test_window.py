"""The dedup window: time-bounded membership, the count cap, and its memory per ID."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from copier.core.identity import id_digest
from copier.core.packing import digest_columns, digest_count, pack_digests, pack_uints, unpack_digests, unpack_uints
from copier.core.window import BUCKETS_PER_HORIZON, DedupWindow

HORIZON = 32_000  # 1 s buckets
BUCKET = HORIZON // BUCKETS_PER_HORIZON

# Digests that share low words (probe collisions), have a zero low word, differ only in the high bits, or only
# in the low 8 bits (which the window does not compare: one identity).
DIGESTS = st.one_of(
    st.integers(0, 2**80 - 1),
    st.integers(0, 40),
    st.integers(0, 40).map(lambda n: n << 8),
    st.integers(0, 3).map(lambda high: (high << 64) | (5 << 8)),
    st.integers(0, 3).map(lambda high: high << 64),
)
STEPS = st.lists(
    st.tuples(  # (digests, arrival increase): small steps fill buckets, large ones expire them
        st.lists(DIGESTS, max_size=12), st.one_of(st.integers(0, 2 * BUCKET), st.integers(0, 40 * BUCKET))
    ),
    max_size=40,
)


def stored_as(digest: int) -> int:
    """The identity the window compares: the digest without the low 8 bits of its low word."""
    return digest & ~0xFF


def covered(arrival: int, newest: int) -> bool:
    """Must the window remember an ID added at ``arrival`` once ``newest`` has been seen? (bucket granular)"""
    return arrival // BUCKET >= (newest - HORIZON) // BUCKET


@settings(max_examples=500)
@given(STEPS, st.sampled_from([10**9, 1, 30]))
def test_every_id_within_the_horizon_is_remembered_and_none_older(
    steps: list[tuple[list[int], int]], block_threshold: int
) -> None:
    """Against a model: an ID is found iff its newest addition lies within the horizon (bucket granular).

    A tiny table forces rebuilds, in-place compactions and stale-slot reuse along the way; a block threshold of
    1 keeps the window in blocks from the start (inserts, revivals, sweeps), one of 30 turns the table into
    blocks part-way.
    """
    window = DedupWindow(HORIZON, 10**9, min_slots=8, block_threshold=block_threshold)
    _check_against_model(window, steps)


def _check_against_model(window: DedupWindow, steps: list[tuple[list[int], int]]) -> None:
    newest_add: dict[int, int] = {}
    arrival = 1_000_000
    for batch, step in steps:
        arrival += step
        window.add(batch, arrival)
        for digest in batch:
            newest_add[stored_as(digest)] = arrival
        for digest, added in newest_add.items():
            assert (digest in window) == covered(added, arrival), (digest, added, arrival)
        assert len(window) == sum(1 for added in newest_add.values() if covered(added, arrival))
        if window._blocks is not None:
            stored = sum(len(block) for block in window._blocks if block is not None)
            assert window._words == stored


@settings(max_examples=100)
@given(
    st.lists(st.integers(1, 2**80 - 1), min_size=1, max_size=60, unique_by=stored_as),
    st.integers(1, 20),
    st.sampled_from([10**9, 1]),
)
def test_the_count_cap_drops_the_oldest_buckets_first_and_says_so(ids: list[int], cap: int, blocks: int) -> None:
    """Over the cap, whole buckets expire oldest first: the newest IDs stay, and cut_short reports it (table and
    blocks)."""
    window = DedupWindow(HORIZON, cap, min_slots=8, block_threshold=blocks)
    for i, digest in enumerate(ids):
        window.add([digest], 1_000_000 + i * BUCKET)  # one ID a bucket
    assert len(window) <= cap
    kept = [digest in window for digest in ids]
    assert kept == sorted(kept), "what is kept is a suffix: the newest"
    assert kept[-1]
    assert window.cut_short == (len(ids) > cap)
    if window.cut_short:
        assert window.stats().oldest_ms > window.newest_ms - HORIZON


def test_compaction_moves_live_entries_back_into_the_holes_of_their_cluster() -> None:
    """Stale entries become holes and the live ones after them move back: all stay reachable, the stale are gone.

    Keys are chosen by their home slot (low word without its low byte, mod 16) to build one cluster:
    three soon-stale entries at slots 3-5, then two live ones homed at 3 and 4
    that sit at 6 and 7 and must move back to 3 and 4.
    """
    window = DedupWindow(HORIZON, 10**6, min_slots=16)
    t0 = 1_000_000
    stale = [(16 * n + 3) << 8 for n in (1, 2, 3)]
    live = [(16 * 4 + 3) << 8, (16 * 5 + 4) << 8, 10 << 8, 11 << 8, 12 << 8]
    window.add(stale, t0)
    window.add(live, t0 + 20 * BUCKET)
    assert list(window._keys[3:8]) == stale + live[:2]
    window.advance(t0 + 40 * BUCKET)  # the stale ones' bucket expires; 5 live of 16 slots: no shrink
    assert [d in window for d in stale] == [False] * 3 and len(window) == 5
    window.add([stale[0]], t0 + 40 * BUCKET)  # a stale entry added again counts again, in place
    assert stale[0] in window and len(window) == 6 and window._keys[3] == stale[0]
    window._compact()
    assert list(window._keys[3:8]) == [stale[0], live[0], live[1], 0, 0]
    assert window._used == 6 == len(window)
    assert all(d in window for d in [stale[0], *live])
    assert not any(d in window for d in stale[1:])


def test_a_full_table_with_a_fifth_stale_is_compacted_before_it_grows() -> None:
    """Making room drops stale entries first; growth comes only if the live ones still fill the table."""
    window = DedupWindow(HORIZON, 10**6, min_slots=64)
    calls: list[str] = []
    compact, rebuild = window._compact, window._rebuild
    window._compact = lambda: (calls.append("compact"), compact())[1]  # type: ignore[method-assign]
    window._rebuild = lambda *a: (calls.append("grow"), rebuild(*a))[1]  # type: ignore[method-assign]
    window.add([n << 8 for n in range(1, 31)], 1_000_000)  # 30 of 64 slots, bucket expires below
    window.add([n << 8 for n in range(101, 116)], 1_000_000 + 20 * BUCKET)
    window.advance(1_000_000 + 40 * BUCKET)  # 30 stale, 15 live: not below the shrink line (0.3 x 64)
    window.add([n << 8 for n in range(52, 57)], 1_000_000 + 40 * BUCKET)  # homes 52-56: fills the 48-slot limit
    assert calls[:1] == ["compact"], calls
    assert len(window) == 20 and all(n << 8 in window for n in [*range(101, 116), *range(52, 57)])


def test_a_disabled_window_remembers_nothing() -> None:
    """dedupWindowSeconds = 0 (or dedupWindowMaxEvents = 0) turns deduplication by ID off."""
    for window in (DedupWindow(0, 100), DedupWindow(HORIZON, 0)):
        window.add([id_digest("a")], 5)
        assert id_digest("a") not in window and len(window) == 0


@pytest.mark.parametrize("blocks", [10**9, 1])
def test_tags_survive_a_long_idle_shard(blocks: int) -> None:
    """Arrivals far apart (more buckets than a tag counts: 2**16 in the table, 2**8 in blocks) never revive an
    expired ID, not even after a gap of an exact multiple of the tag's range, in either form."""
    window = DedupWindow(HORIZON, 10**6, min_slots=8, block_threshold=blocks)
    ids = [n << 8 for n in range(1, 7)]
    window.add(ids[:3], 1_000_000)
    window.add(ids[3:4], 1_000_000 + 70_000 * BUCKET)
    assert ids[0] not in window and ids[3] in window
    window.add(ids[4:5], 1_000_000 + 65_536 * BUCKET * 3)
    assert ids[3] not in window and ids[4] in window and len(window) == 1
    for gap in (256, 65_536):  # the tag of the old ID is the newest one's again
        at = window.newest_ms + gap * BUCKET
        window.advance(at)
        assert ids[4] not in window and len(window) == 0
        window.add(ids[4:5], at)  # seen again: it counts once, in the new bucket
        assert ids[4] in window and len(window) == 1
        window.add(ids[5:6], at)
        assert len(window) == 2
        window.advance(at + 10 * BUCKET)
        window.add(ids[4:6], at + 10 * BUCKET)  # both move to a newer bucket: still two
        assert len(window) == 2
        window.advance(at + 10 * BUCKET + HORIZON + 2 * BUCKET)
        assert len(window) == 0


def test_stats_report_the_reach_of_the_guarantee() -> None:
    """oldest_ms is the horizon behind the newest arrival, ids the live count."""
    window = DedupWindow(HORIZON, 1000)
    window.add([1 << 8, 2 << 8], 1_000_000)
    window.add([3 << 8], 1_020_000)
    stats = window.stats()
    assert (stats.ids, stats.newest_ms, stats.oldest_ms, stats.cut_short) == (3, 1_020_000, 1_020_000 - HORIZON, False)


def test_an_hour_at_full_rate_fits_in_12_bytes_an_id_and_stays_there() -> None:
    """3.6 million IDs (an hour at 1,000 records/s), added a second at a time, take at most 12 bytes each (the
    table turned into blocks at a million); ten more minutes at that rate expire the oldest and sweep them: the
    window stays at an hour, within 12 bytes an ID, and still holds what it must."""
    window = DedupWindow(3_600_000, 10_000_000)
    rng = random.Random(7)
    t0 = 1_700_000_000_000
    kept = []
    for second in range(4200):
        batch = [rng.getrandbits(80) for _ in range(1000)]
        if second in (0, 1000, 3599, 4199):
            kept.append(batch)
        window.add(batch, t0 + second * 1000)
        if second == 3599:
            assert len(window) == 3_600_000 and window._blocks is not None
            assert window.memory_bytes() / len(window) <= 12, window.memory_bytes() / len(window)
            assert all(d in window for d in kept[0])
    first, middle, late, last = kept
    assert not any(d in window for d in first), "an hour and ten minutes old: expired"
    assert all(d in window for d in [*middle, *late, *last])
    assert 3_600_000 <= len(window) <= 3_600_000 + 3600 * 1000 // 32 + 1000  # an hour, give or take a bucket
    assert window.memory_bytes() / len(window) <= 12, window.memory_bytes() / len(window)
    assert window._words - len(window) <= window._words // 8 + 1000, "sweeps keep the stale words few"


def test_a_takeover_load_reserves_once_and_fits_in_20_bytes_an_id() -> None:
    """Loading stored columns in bulk (what a takeover does) sizes the table once, at 20 bytes an ID."""
    rng = random.Random(3)
    ids = [rng.getrandbits(80) for _ in range(200_000)]
    low, high = digest_columns(pack_digests(ids))
    window = DedupWindow(3_600_000, 10_000_000)
    window.advance(5_000_000)
    window.reserve(len(ids))
    slots = window.memory_bytes()
    window.add_columns(low, high, 5_000_000)
    assert window.memory_bytes() == slots, "no rebuild while loading"
    assert window.memory_bytes() / len(window) <= 20.01
    assert all(d in window for d in ids[:1000])


def test_a_large_takeover_load_goes_straight_into_blocks_at_12_bytes_an_id() -> None:
    """A load of more IDs than the block threshold builds no table at all: the blocks take them at once, within
    12 bytes an ID (3 million IDs: a window of 50 minutes at the write limit)."""
    rng = random.Random(4)
    window = DedupWindow(3_600_000, 10_000_000)
    window.advance(5_000_000)
    window.reserve(3_000_000)
    assert window._blocks is not None
    sample = []
    for chunk in range(300):
        ids = [rng.getrandbits(80) for _ in range(10_000)]
        sample.extend(ids[:3])
        low, high = digest_columns(pack_digests(ids))
        window.add_columns(low, high, 5_000_000 - 300 + chunk)
    assert len(window) == 3_000_000
    assert window.memory_bytes() / len(window) <= 12, window.memory_bytes() / len(window)
    assert all(d in window for d in sample)
    assert sum(d in window for d in (rng.getrandbits(80) for _ in range(10_000))) == 0


@given(st.lists(st.integers(0, 2**80 - 1), max_size=50))
def test_packed_digests_round_trip_at_ten_bytes_each(values: list[int]) -> None:
    """Column-wise packing keeps order and value, 10 bytes a digest."""
    blob = pack_digests(values)
    assert len(blob) == 10 * len(values) and digest_count(blob) == len(values)
    assert unpack_digests(blob) == values


@given(st.sets(st.integers(0, 10**6), max_size=40))
def test_packed_shard_numbers_round_trip_sorted(values: set[int]) -> None:
    """Varint lists keep distinct values, sorted."""
    assert unpack_uints(pack_uints(values)) == sorted(values)
