"""The dedup window's bound, and PutRecords request splitting within the Kinesis limits."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from copier.batching import split_requests
from copier.limits import MAX_REQUEST_BYTES, MAX_REQUEST_RECORDS
from copier.window import DedupWindow

batches = st.lists(st.lists(st.binary(min_size=2, max_size=2), min_size=1, max_size=20), max_size=30)


@given(st.integers(1, 60), batches)
def test_window_holds_at_least_the_last_capacity_digests(capacity: int, stream: list[list[bytes]]) -> None:
    """Every digest among the newest `capacity` is remembered; at most one batch more is kept."""
    window = DedupWindow(capacity)
    for i, batch in enumerate(stream):
        window.add_batch(f"b{i}", batch)
    flat = [d for batch in stream for d in batch]
    for digest in flat[-capacity:]:
        assert digest in window
    largest = max((len(b) for b in stream), default=0)
    assert len(window) < capacity + largest or len(window) == len(flat)


@given(st.integers(1, 60), batches)
def test_window_rebuilt_from_stored_batches_matches(capacity: int, stream: list[list[bytes]]) -> None:
    """A new owner loading the newest batches gets a window that knows the same recent digests."""
    live = DedupWindow(capacity)
    for i, batch in enumerate(stream):
        live.add_batch(f"b{i:04d}", batch)
    stored = [(f"b{i:04d}", batch) for i, batch in enumerate(stream)]
    loaded = DedupWindow.from_newest_first(capacity, reversed(stored))
    flat = [d for batch in stream for d in batch]
    for digest in flat[-capacity:]:
        assert digest in loaded


def test_window_of_capacity_zero_remembers_nothing() -> None:
    """dedupWindowEvents = 0 turns deduplication by ID off."""
    window = DedupWindow(0)
    window.add_batch("b", [b"x"])
    assert b"x" not in window


@given(st.lists(st.integers(1, 1024 * 1024), max_size=1200))
def test_requests_respect_count_and_size_limits_and_keep_order(sizes: list[int]) -> None:
    """Requests hold at most 500 records and 5 MiB, and concatenate back to the input."""
    requests = list(split_requests(list(range(len(sizes))), lambda i: sizes[i]))
    assert [i for r in requests for i in r] == list(range(len(sizes)))
    for r in requests:
        assert 1 <= len(r) <= MAX_REQUEST_RECORDS
        assert sum(sizes[i] for i in r) <= MAX_REQUEST_BYTES
