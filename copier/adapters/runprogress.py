"""A long command's progress on stderr: a bar redrawn in place on a terminal, a line every few seconds in a log.

``copier redrive`` and ``copier repair`` read whole streams and put what they
find; either can take minutes. On a terminal the operator sees one line
redrawn (a bar of what is done, and counts); anywhere else (a journal, a CI
log, a pipe) a plain line every ``interval`` seconds, so a log is not flooded
and a stuck run still shows it is alive. stdout keeps the command's report.

:class:`ReadingProgress` is the stream reader's progress
(``copier.adapters.streamreader.Progress``: records and shards read) shown the
same way.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from copier.adapters.streamreader import Progress

__all__ = ["LINE_INTERVAL_S", "ReadingProgress", "RunProgress"]

LINE_INTERVAL_S = 5.0  # a line this often when stderr is not a terminal
BAR_INTERVAL_S = 0.2  # a terminal's bar is redrawn at most this often
BAR_WIDTH = 30


class RunProgress:
    """One command's progress: ``update`` often, ``finish`` once; see the module docstring."""

    def __init__(
        self,
        label: str,
        out: TextIO | None = None,
        *,
        tty: bool | None = None,
        interval: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self._out = out if out is not None else sys.stderr
        self.tty = self._out.isatty() if tty is None else tty
        self._interval = interval if interval is not None else (BAR_INTERVAL_S if self.tty else LINE_INTERVAL_S)
        self._clock = clock
        self._last = clock()
        self._lock = threading.Lock()
        self._shown = ""

    def text(self, done: int, total: int | None, what: str) -> str:
        """The progress as one line: a bar when the total is known, then ``what``."""
        if total:
            filled = min(BAR_WIDTH, BAR_WIDTH * done // total)
            bar = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {100 * done // total:3d}% {done}/{total} "
        else:
            bar = f"{done} " if total is None else ""
        return f"{self.label}: {bar}{what}".rstrip()

    def update(self, done: int, total: int | None, what: str, force: bool = False) -> None:
        """Show the progress if an interval has passed since the last time (or ``force``)."""
        with self._lock:
            now = self._clock()
            if not force and now - self._last < self._interval:
                return
            self._last = now
            line = self.text(done, total, what)
            if self.tty:
                pad = " " * max(0, len(self._shown) - len(line))
                self._out.write(f"\r{line}{pad}")
                self._shown = line
            else:
                self._out.write(line + "\n")
            self._out.flush()

    def finish(self, done: int, total: int | None, what: str) -> None:
        """The last state, shown whatever the interval; a terminal's bar ends its line."""
        self.update(done, total, what, force=True)
        if self.tty:
            with self._lock:
                self._out.write("\n")
                self._out.flush()
                self._shown = ""


class ReadingProgress(Progress):
    """The stream reader's progress (records read, shards done) as a :class:`RunProgress` shows it."""

    def __init__(self, run: RunProgress) -> None:
        super().__init__(out=run._out)
        self.run = run

    def _maybe_print(self) -> None:  # called under the reader's lock, on each page and shard
        done = sum(s.done for s in self._streams.values())
        total = sum(s.shards for s in self._streams.values())
        read = ", ".join(f"{label} {s.records} records" for label, s in self._streams.items())
        self.run.update(done, total, f"shards read; {read}")
