"""PutRecords request splitting within the Kinesis limits, and batches cut into chunks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from copier.core.batching import split_requests
from copier.core.limits import MAX_REQUEST_BYTES, MAX_REQUEST_RECORDS
from copier.core.plan import SourceRecord, chunks
from copier.core.positions import Position


@given(st.lists(st.integers(1, 1024 * 1024), max_size=1200))
def test_requests_respect_count_and_size_limits_and_keep_order(sizes: list[int]) -> None:
    """Requests hold at most 500 records and 5 MiB, and concatenate back to the input."""
    requests = list(split_requests(list(range(len(sizes))), lambda i: sizes[i]))
    assert [i for r in requests for i in r] == list(range(len(sizes)))
    for r in requests:
        assert 1 <= len(r) <= MAX_REQUEST_RECORDS
        assert sum(sizes[i] for i in r) <= MAX_REQUEST_BYTES


@given(st.integers(0, 50), st.integers(1, 12))
def test_chunks_are_consecutive_bounded_slices(count: int, size: int) -> None:
    """Every record in one chunk of at most ``size``, in order."""
    records = [SourceRecord(Position(i), "pk", b"x") for i in range(count)]
    parts = chunks(records, size)
    assert [r for part in parts for r in part] == records
    assert all(1 <= len(part) <= size for part in parts)
