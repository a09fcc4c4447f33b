"""A long command's progress on stderr (``copier.adapters.progress``): a bar redrawn in place on a terminal, a
plain line every few seconds anywhere else, so a log shows a run alive without being flooded."""

from __future__ import annotations

import io

from copier.adapters.progress import LINE_INTERVAL_S, ReadingProgress, RunProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_terminal_gets_one_line_redrawn_with_a_bar_and_a_log_gets_a_line_every_few_seconds() -> None:
    clock, tty, log = Clock(), io.StringIO(), io.StringIO()
    bar = RunProgress("redrive", tty, tty=True, clock=clock)
    lines = RunProgress("redrive", log, tty=False, clock=clock)
    for done in range(1, 11):
        clock.now += 1.0
        bar.update(done, 10, f"{done * 100} records read")
        lines.update(done, 10, f"{done * 100} records read")
    bar.finish(10, 10, "1000 records read")
    assert "\n" not in tty.getvalue()[:-1] and tty.getvalue().count("\r") == 11
    assert tty.getvalue().endswith("redrive: [##############################] 100% 10/10 1000 records read\n")
    shown = log.getvalue().splitlines()
    assert len(shown) == 10 // int(LINE_INTERVAL_S), shown  # every 5 s of the 10
    assert shown[0] == "redrive: [###############---------------]  50% 5/10 500 records read"


def test_the_stream_readers_progress_shows_as_the_runs() -> None:
    """Records and shards read by the audit's reader, on the run's line: shards done over shards listed."""
    out = io.StringIO()
    reading = ReadingProgress(RunProgress("repair", out, tty=False, interval=0))
    reading.start("staging", 2)
    reading.records("staging", 7)
    reading.shard_done("staging")
    assert out.getvalue().splitlines()[-1] == (
        "repair: [###############---------------]  50% 1/2 shards read; staging 7 records"
    )
