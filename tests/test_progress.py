"""The per-shard progress line: at INFO every copier.progressIntervalSeconds, what was forwarded since the last."""

from __future__ import annotations

from structlog.testing import capture_logs

from tests.support.fakes import World, config, rec


def _progress(interval_s: int) -> list[dict[str, object]]:
    world = World(config(progressIntervalSeconds=interval_s, coalesceEvents=1))
    worker = world.worker()
    with capture_logs() as logs:
        worker.process([rec(1, "a"), rec(2, "b")], behind_ms=700)
        world.clock.advance(1_500)
        worker.process([rec(3, "c"), rec(4, "a")], behind_ms=300)  # "a" again: a duplicate
        world.clock.advance(1_500)
        worker.process([rec(5, "d")], behind_ms=0)
    return [e for e in logs if e["event"] == "progress"]


def test_each_interval_says_what_was_forwarded_dropped_and_how_far_behind() -> None:
    lines = _progress(1)
    assert [(e["forwarded_since"], e["duplicates_since"], e["forwarded"], e["behind_ms"]) for e in lines] == [
        (3, 1, 3, 300),
        (1, 0, 4, 0),
    ]
    assert all(e["log_level"] == "info" for e in lines)


def test_an_interval_of_zero_logs_no_progress() -> None:
    assert _progress(0) == []
