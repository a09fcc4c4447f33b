"""A failed seed's extra copies are traced to the puts that carried them, with the backend's time for each."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from copier.chaos.harness import put_timeout_ms
from copier.chaos.putseen import PutSeen
from copier.chaos.result import SeedResult
from copier.chaos.run import _put_timing


def harness(puts: list[PutSeen]) -> Any:
    """What ``_put_timing`` reads of a harness: the backend, the proxy's puts, the plan's start, the stream names."""
    pipeline = SimpleNamespace(target="tgt", config=SimpleNamespace(dead_letter_stream_name="dlq"))
    return SimpleNamespace(
        backend=SimpleNamespace(impl="moto"), proxy=SimpleNamespace(puts=puts), t0=100.0, pipeline=pipeline
    )


def test_a_put_the_backend_answered_after_the_put_timeout_is_counted_and_named_in_the_trace() -> None:
    """The slowest answer and the late ones are counted on every seed; an unexplained ID's trace lists each put
    that carried it (not one that failed it at the proxy), in arrival order, with its fault and backend time."""
    timeout_s = put_timeout_ms("moto") / 1000
    late = timeout_s + 1.5
    puts = [
        PutSeen(112.0, "tgt", ("e1", "e2"), None, 0.004),
        PutSeen(105.0, "tgt", ("e1", 1), None, late),  # answered last, arrived first
        PutSeen(107.5, "tgt", ("e1",), "put_timeout", None),
        PutSeen(108.0, "tgt", ("e1", "e3"), "put_partial", 0.002, refused=(0,)),  # e1 failed here, never forwarded
        PutSeen(109.0, "dlq", (None,), None, 0.003),
    ]
    result = SeedResult(1, "full", "3.x", 2)
    _put_timing(harness(puts), result, ["e1"])
    assert (result.slowest_put_ms, result.late_puts) == (round(late * 1000), 1)
    (trace,) = result.failures
    carried = trace.partition("): ")[2]
    assert carried == (
        f"e1: 5.00 s to target (forwarded, 2 entries, backend {late * 1000:.0f} ms); "
        "7.50 s to target (put_timeout, 1 entries); 12.00 s to target (forwarded, 2 entries, backend 4 ms)"
    )


def test_a_seed_without_unexplained_copies_gets_the_timing_and_no_trace() -> None:
    result = SeedResult(1, "full", "3.x", 2)
    _put_timing(harness([PutSeen(101.0, "tgt", ("e1",), None, 0.25)]), result, [])
    assert (result.slowest_put_ms, result.late_puts, result.failures) == (250, 0, [])
