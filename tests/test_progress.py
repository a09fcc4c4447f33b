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


def test_after_taking_the_shard_back_progress_counts_only_what_this_processor_forwarded() -> None:
    """A rival forwarded while this processor was fenced: its events are in the shard's totals, not in this
    processor's forwarded_since."""
    world = World(config(progressIntervalSeconds=1, coalesceEvents=1))
    first = world.worker()
    first.process([rec(1, "a")])
    rival = world.worker()
    rival.process([rec(2, "b"), rec(3, "c")])  # the rival forwards two, then loses the daemon's lease
    rival.lose_lease()
    world.clock.advance(world.config.lease_millis + world.config.clock_skew_millis)
    with capture_logs() as logs:
        first.process([rec(4, "d")])  # fenced: takes the shard back, forwards d
        world.clock.advance(1_500)
        first.process([rec(5, "e")])
    (line,) = [e for e in logs if e["event"] == "progress"]
    assert (line["forwarded_since"], line["forwarded"]) == (2, 5)
