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


#: (split_at, word_blocks_at): pair blocks that never split, split at every entry (up to 4,096 blocks) or every
#: few; word blocks from the first ID; pair blocks turning into word blocks part-way.
FORMS = st.sampled_from([(10**9, 10**9), (1, 10**9), (3, 10**9), (4, 1), (4, 30)])


@settings(max_examples=500)
@given(STEPS, FORMS)
def test_every_id_within_the_horizon_is_remembered_and_none_older(
    steps: list[tuple[list[int], int]], form: tuple[int, int]
) -> None:
    """Against a model: an ID is found iff its newest addition lies within the horizon (bucket granular), in
    every form: inserts, revivals, moves to newer buckets, sweeps, splits and the turn into word blocks."""
    split_at, word_blocks_at = form
    window = DedupWindow(HORIZON, 10**9, split_at=split_at, word_blocks_at=word_blocks_at)
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
        _check_blocks(window)


def _check_blocks(window: DedupWindow) -> None:
    """Every block sorted, holding only keys of its own top bits, its tails beside it; the word count right."""
    if window._blocks is not None:
        assert all(list(block) == sorted(block) for block in window._blocks if block is not None)
        assert window._words == sum(len(block) for block in window._blocks if block is not None)
        return
    assert len(window._keys) == len(window._tails) == 1 << window._bits
    stored = 0
    for i, (keys, tails) in enumerate(zip(window._keys, window._tails, strict=True)):
        assert (keys is None) == (tails is None)
        if keys is None or tails is None:
            continue
        assert len(keys) == len(tails) > 0
        assert list(keys) == sorted(keys)
        assert all(key >> window._shift == i for key in keys)
        stored += len(keys)
    assert window._words == stored


@settings(max_examples=100)
@given(
    st.lists(st.integers(1, 2**80 - 1), min_size=1, max_size=60, unique_by=stored_as),
    st.integers(1, 20),
    FORMS,
)
def test_the_count_cap_drops_the_oldest_buckets_first_and_says_so(
    ids: list[int], cap: int, form: tuple[int, int]
) -> None:
    """Over the cap, whole buckets expire oldest first: the newest IDs stay, and cut_short reports it (in every
    form)."""
    window = DedupWindow(HORIZON, cap, split_at=form[0], word_blocks_at=form[1])
    for i, digest in enumerate(ids):
        window.add([digest], 1_000_000 + i * BUCKET)  # one ID a bucket
    assert len(window) <= cap
    kept = [digest in window for digest in ids]
    assert kept == sorted(kept), "what is kept is a suffix: the newest"
    assert kept[-1]
    assert window.cut_short == (len(ids) > cap)
    if window.cut_short:
        assert window.stats().oldest_ms > window.newest_ms - HORIZON


def test_a_split_cuts_each_block_where_the_next_bit_turns_and_keeps_every_id() -> None:
    """Keys chosen by their top bits: one block of 8 splits into two at the fifth word (split_at 4), then into
    four; every ID is still found, each in the block of its top bits, and the split keeps the tags (ages)."""
    window = DedupWindow(HORIZON, 10**6, split_at=4)
    t0 = 1_000_000
    # digest high 16 bits are a key's top 16: 0x0000, 0x4000, 0x8000, 0xC000 land in blocks 0-3 of four
    ids = [(high << 64) | (n << 8) for high in (0x0000, 0x4000, 0x8000, 0xC000) for n in (1, 2)]
    window.add(ids[:4], t0)
    assert window._bits == 0 and len(window._keys) == 1
    window.add(ids[4:], t0 + 20 * BUCKET)
    assert window._bits == 1 and [len(k or ()) for k in window._keys] == [4, 4]
    window.add([(0x2000 << 64) | (9 << 8)], t0 + 20 * BUCKET)  # 9 words over 2 blocks of 4: four blocks
    assert window._bits == 2 and [len(k or ()) for k in window._keys] == [3, 2, 2, 2]
    _check_blocks(window)
    assert all(d in window for d in ids)
    window.advance(t0 + 40 * BUCKET)  # the first four expire with their bucket: their tags came through the splits
    assert [d in window for d in ids] == [False] * 4 + [True] * 4 and len(window) == 5


def test_a_sweep_drops_the_stale_and_frees_emptied_blocks() -> None:
    """Once more than an eighth of the words are stale, they are dropped; a block left empty is freed."""
    window = DedupWindow(HORIZON, 10**6, split_at=2)
    t0 = 1_000_000
    old = [(0x0000 << 64) | (n << 8) for n in (1, 2)]  # block 0 of two
    new = [(0x8000 << 64) | (n << 8) for n in (1, 2)]  # block 1
    window.add(old, t0)
    window.add(new, t0 + 20 * BUCKET)
    assert window._bits == 1 and window._words == 4
    window.advance(t0 + 40 * BUCKET)
    assert len(window) == 2 and window._words == 2 and window._keys[0] is None and window._tails[0] is None
    _check_blocks(window)
    assert all(d in window for d in new) and not any(d in window for d in old)


def test_the_turn_into_word_blocks_keeps_every_id_and_its_age() -> None:
    """At the threshold the pair blocks become word blocks: every live ID is still found, the stale ones are
    dropped, and each keeps its bucket (it expires when it would have)."""
    window = DedupWindow(HORIZON, 10**6, split_at=4, word_blocks_at=20)
    t0 = 1_000_000
    rng = random.Random(5)
    gone = [rng.getrandbits(80) for _ in range(6)]
    older = [rng.getrandbits(80) for _ in range(8)]
    newer = [rng.getrandbits(80) for _ in range(11)]
    window.add(gone, t0)
    window.add(older, t0 + 20 * BUCKET)
    window.advance(t0 + 40 * BUCKET)
    assert window._blocks is None and len(window) == 8
    window.add(newer, t0 + 40 * BUCKET)  # 19 live: still pairs; the next one turns them
    assert window._blocks is None
    window.add([rng.getrandbits(80)], t0 + 40 * BUCKET)
    assert window._blocks is not None and len(window) == 20 and window._words == 20
    _check_blocks(window)
    assert all(d in window for d in older + newer) and not any(d in window for d in gone)
    window.advance(t0 + 60 * BUCKET)  # the older ones' bucket leaves the horizon
    assert not any(d in window for d in older) and all(d in window for d in newer) and len(window) == 12


def test_a_large_first_batch_is_spread_over_blocks_before_it_is_added() -> None:
    """A KPL batch of 50,000 events into an empty window splits the blocks for it first: no block holds more
    than a few times the split size (an insert into one block of 50,000 would move megabytes)."""
    window = DedupWindow(3_600_000, 10_000_000)
    window.add([random.Random(6).getrandbits(80) for _ in range(50_000)], 1_000_000)
    assert window._bits == 6 and max(len(k or ()) for k in window._keys) < 4 * 1024
    _check_blocks(window)


def test_columns_of_different_lengths_are_refused_before_anything_is_added() -> None:
    """A batch is added whole or not at all: mismatched columns change neither the IDs nor their count."""
    window = DedupWindow(HORIZON, 10**6)
    with pytest.raises(ValueError, match="2 low and 1 high"):
        window.add_columns([1 << 16, 2 << 16], [0], 1_000_000)
    assert len(window) == 0 and (1 << 16) not in window and window._words == 0


def test_ids_sharing_a_key_differ_by_their_tail() -> None:
    """Two identities with the same top 64 bits (only the low word's bits 8-15 differ) are two IDs; the low 8
    bits are not compared (one identity)."""
    window = DedupWindow(HORIZON, 10**6)
    a, b = (7 << 64) | (0x1234 << 16) | (0x01 << 8), (7 << 64) | (0x1234 << 16) | (0x02 << 8)
    window.add([a], 1_000_000)
    assert a in window and b not in window and (a | 0x7F) in window
    window.add([b, a | 0x7F], 1_000_000)
    assert len(window) == 2 and b in window and window._words == 2


@pytest.mark.parametrize("split_at, word_blocks_at", [(10**9, 10**9), (4, 1)])
def test_a_bucket_over_the_cap_by_itself_is_kept_whole(split_at: int, word_blocks_at: int) -> None:
    """A cap below one bucket's events never forgets the bucket being filled (an adversarial review found the
    window emptying itself, then ignoring the rest of that bucket): older buckets go, the newest stays whole, and
    the reach reported is never in the future."""
    window = DedupWindow(HORIZON, 2, split_at=split_at, word_blocks_at=word_blocks_at)
    t0 = 1_000_000
    window.add([9 << 8], t0)
    window.add([1 << 8, 2 << 8, 3 << 8], t0 + 5 * BUCKET)
    assert len(window) == 3 and all(n << 8 in window for n in (1, 2, 3)) and (9 << 8) not in window
    window.add([4 << 8], t0 + 5 * BUCKET + 10)  # the same bucket: added, not ignored
    assert (4 << 8) in window and len(window) == 4
    stats = window.stats()
    assert window.cut_short and stats.oldest_ms <= stats.newest_ms
    window.add([5 << 8], t0 + 6 * BUCKET)  # a newer bucket: the one over the cap goes
    assert len(window) == 1 and (5 << 8) in window and (1 << 8) not in window


def test_a_disabled_window_remembers_nothing() -> None:
    """dedupWindowSeconds = 0 (or dedupWindowMaxEvents = 0) turns deduplication by ID off."""
    for window in (DedupWindow(0, 100), DedupWindow(HORIZON, 0)):
        window.add([id_digest("a")], 5)
        assert id_digest("a") not in window and len(window) == 0


@pytest.mark.parametrize("split_at, word_blocks_at", [(10**9, 10**9), (1, 10**9), (4, 1)])
def test_tags_survive_a_long_idle_shard(split_at: int, word_blocks_at: int) -> None:
    """Arrivals far apart (more buckets than a tag counts, 2**8) never revive an expired ID, not even after a gap
    of an exact multiple of the tag's range: one pair block, many, and word blocks."""
    window = DedupWindow(HORIZON, 10**6, split_at=split_at, word_blocks_at=word_blocks_at)
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
    pair blocks turned into word blocks at 2.5 million); ten more minutes at that rate expire the oldest and sweep
    them: the window stays at an hour, within 12 bytes an ID, and still holds what it must."""
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


@pytest.mark.parametrize("ids", [1_000, 10_000, 100_000, 400_000, 1_200_000])
def test_every_window_size_fits_in_12_bytes_an_id(ids: int) -> None:
    """From a thousand IDs up, a window filled a second at a time at 1,000 events/s takes at most 12 bytes an ID:
    the blocks split as it grows, so their fixed cost stays small against their contents at every size."""
    window = DedupWindow(3_600_000, 10_000_000)
    rng = random.Random(ids)
    t0 = 1_700_000_000_000
    for second in range(ids // 1000):
        window.add([rng.getrandbits(80) for _ in range(1000)], t0 + second * 1000)
        if (second + 1) % 50 == 0 or second + 1 == ids // 1000:  # checked along the way, not only at the end
            assert window.memory_bytes() / len(window) <= 12, (len(window), window.memory_bytes() / len(window))
    assert len(window) == ids


def test_a_takeover_load_splits_once_and_fits_in_12_bytes_an_id() -> None:
    """Loading stored columns in bulk (what a takeover does) splits the blocks once, up front, for the whole load;
    none splits while loading, and it fits in 12 bytes an ID."""
    rng = random.Random(3)
    ids = [rng.getrandbits(80) for _ in range(200_000)]
    low, high = digest_columns(pack_digests(ids))
    window = DedupWindow(3_600_000, 10_000_000)
    window.advance(5_000_000)
    window.reserve(len(ids))
    bits = window._bits
    assert bits == 8  # 200,000 / 256 blocks: 781 a block
    window.add_columns(low, high, 5_000_000)
    assert window._bits == bits, "no split while loading"
    assert window.memory_bytes() / len(window) <= 12, window.memory_bytes() / len(window)
    assert all(d in window for d in ids[:1000])


def test_a_large_takeover_load_fits_in_12_bytes_an_id() -> None:
    """3 million IDs loaded in chunks of 10,000 (a window of 50 minutes at the write limit) fit within 12 bytes an
    ID, and IDs never added are not found."""
    rng = random.Random(4)
    window = DedupWindow(3_600_000, 10_000_000)
    window.advance(5_000_000)
    window.reserve(3_000_000)
    assert window._blocks is not None, "more IDs than the word-block threshold: word blocks at once"
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
