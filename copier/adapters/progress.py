"""How far a long command has got, on stderr: a bar redrawn in place on a terminal, a line every few seconds in a log.

One place draws it (:class:`StatusLine`); two kinds of progress feed it:
:class:`Progress`, a stream read's (``copier verify``, ``copier export``), and
:class:`RunProgress`, a run's counts (``copier redrive``, ``copier repair``,
whose audit reads show through :class:`ReadingProgress`). stdout keeps the
command's report.

``copier verify`` and ``copier export`` read whole streams (hours for a
large one, within the Kinesis read limits). An operator wants to see that
it moves and how far it is; a log wants a line now and then, not a bar's
hundreds of redraws. So :class:`Progress` draws a bar when its stream is a
terminal and otherwise writes a whole line at most every interval.

How far a shard is: GetRecords answers ``MillisBehindLatest``, how far the
page read is from the shard's newest record. The first answer of a shard
says how far it had to go; ``1 - now / first`` is its part done (a closed
shard's last page and an open shard's caught-up page end it at 1). A
stream's part done is the mean over its shards, those not started at 0:
a shard's time, not its records, so a stream whose shards hold very
different amounts moves unevenly, but it never goes back and reaches 100 %
exactly when the read ends. Nothing here is read from AWS: the reader
tells it (``copier.adapters.streamreader``).
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

__all__ = [
    "BAR_REDRAW_S",
    "LINE_INTERVAL_S",
    "PROGRESS_INTERVAL_S",
    "Progress",
    "ReadingProgress",
    "RunProgress",
    "StatusLine",
]

PROGRESS_INTERVAL_S = 2.0  # a read's line in a log at most this often
LINE_INTERVAL_S = 5.0  # a run's line in a log at most this often
BAR_REDRAW_S = 0.2  # a bar on a terminal is redrawn at most this often
BAR_WIDTH = 20
RUN_BAR_WIDTH = 30


@dataclass
class _Stream:
    """What one stream's read has done so far."""

    shards: int
    records: int = 0
    done: int = 0
    started: dict[str, tuple[int, int]] = field(default_factory=dict)  # shard -> (first behind, latest behind) ms

    def fraction(self) -> float:
        if not self.shards:
            return 1.0
        partial = sum(1 - latest / first for first, latest in self.started.values() if first > 0)
        return min(1.0, (self.done + partial) / self.shards)


def _is_terminal(out: TextIO) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


class StatusLine:
    """Where progress goes: on a terminal one line redrawn in place (a carriage return, padded over what was
    there), elsewhere whole lines, so a log is not flooded with a bar's redraws; at most one every ``interval``
    (``due``). Not locked: its owner calls it under its own lock."""

    def __init__(self, out: TextIO, terminal: bool, interval: float, clock: Callable[[], float]) -> None:
        self.out = out
        self.terminal = terminal
        self.interval = interval
        self._clock = clock
        self._last = clock()
        self._shown = ""  # what the terminal's last line holds

    def due(self, force: bool = False) -> bool:
        """Has an interval passed since the last line (then it is now), or ``force``?"""
        now = self._clock()
        if not force and now - self._last < self.interval:
            return False
        self._last = now
        return True

    def show(self, text: str) -> None:
        if self.terminal:
            self.out.write(f"\r{text}{' ' * max(0, len(self._shown) - len(text))}")
            self._shown = text
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def end(self) -> None:
        """A terminal's bar ends its line (the next output starts on its own)."""
        if self.terminal and self._shown:
            self.out.write("\n")
            self.out.flush()
            self._shown = ""


class Progress:
    """Progress of reads on stderr (or ``out``); thread-safe (the reader's threads report to it).

    ``command`` names the lines (``verify: reading: ...``); ``terminal``
    (default: whether ``out`` is one) chooses the bar over lines.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        interval: float = PROGRESS_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        command: str = "verify",
        terminal: bool | None = None,
    ) -> None:
        self._out = out if out is not None else sys.stderr
        on_terminal = _is_terminal(self._out) if terminal is None else terminal
        self._status = StatusLine(self._out, on_terminal, BAR_REDRAW_S if on_terminal else interval, clock)
        self._clock = clock
        self._command = command
        self._began = clock()
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._current = ""  # the stream read last: the bar's

    def start(self, label: str, shards: int) -> None:
        """A stream's read begins: its shard count is known."""
        with self._lock:
            self._streams[label] = _Stream(shards)
            self._current = label
            self._maybe_print()

    def records(self, label: str, count: int) -> None:
        """``count`` more records were read from the stream (or found kept from an earlier run)."""
        with self._lock:
            self._streams[label].records += count
            self._maybe_print()

    def behind(self, label: str, shard_id: str, millis: int | None) -> None:
        """A page of the shard was answered ``millis`` behind its newest record (``MillisBehindLatest``)."""
        if millis is None:
            return
        with self._lock:
            started = self._streams[label].started
            first, latest = started.get(shard_id, (max(millis, 1), max(millis, 1)))
            started[shard_id] = (first, min(millis, latest))  # never back: a shard written faster than read
            self._maybe_print()

    def shard_done(self, label: str, shard_id: str | None = None) -> None:
        """One more shard of the stream was read to its end."""
        with self._lock:
            stream = self._streams[label]
            stream.done += 1
            if shard_id is not None:
                stream.started.pop(shard_id, None)
            self._maybe_print()

    def fraction(self, label: str) -> float:
        """The part of the stream's read done, 0 to 1 (see the module docstring)."""
        with self._lock:
            return self._streams[label].fraction()

    def line(self) -> str:
        """The current state of every stream read so far, on one line."""
        parts = [
            f"{label} {s.records} records, {s.done}/{s.shards} shards done, {s.fraction():.0%}"
            for label, s in self._streams.items()
        ]
        return f"{self._command}: reading: " + "; ".join(parts)

    def finish(self) -> None:
        """The reads are over (or interrupted): the last state, on a line of its own."""
        with self._lock:
            if self._streams:
                self._print(self.line())
            self._status.end()

    def _bar(self) -> str:
        stream = self._streams.get(self._current)
        fraction = stream.fraction() if stream is not None else 0.0
        filled = round(fraction * BAR_WIDTH)
        elapsed = self._clock() - self._began
        eta = f", {(elapsed / fraction - elapsed) / 60:.0f} min left" if 0.02 < fraction < 1 else ""
        return f"{self._command} {self._current} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {fraction:.0%}{eta} | "

    def _print(self, line: str) -> None:
        if self._status.terminal:
            width = shutil.get_terminal_size((120, 24)).columns - 1
            line = (self._bar() + line.split(": reading: ", 1)[-1])[:width]
        self._status.show(line)

    def _maybe_print(self) -> None:
        if self._status.due():
            self._print(self.line())


class RunProgress:
    """A run's progress (``copier redrive``, ``copier repair``): ``update`` often, ``finish`` once; a bar of what
    is done when the total is known, then counts. A line every :data:`LINE_INTERVAL_S` in a log."""

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
        self.out = out if out is not None else sys.stderr
        self.tty = _is_terminal(self.out) if tty is None else tty
        every = interval if interval is not None else (BAR_REDRAW_S if self.tty else LINE_INTERVAL_S)
        self._status = StatusLine(self.out, self.tty, every, clock)
        self._lock = threading.Lock()

    def text(self, done: int, total: int | None, what: str) -> str:
        """The progress as one line: a bar when the total is known, then ``what``."""
        if total:
            filled = min(RUN_BAR_WIDTH, RUN_BAR_WIDTH * done // total)
            bar = f"[{'#' * filled}{'-' * (RUN_BAR_WIDTH - filled)}] {100 * done // total:3d}% {done}/{total} "
        else:
            bar = f"{done} " if total is None else ""
        return f"{self.label}: {bar}{what}".rstrip()

    def update(self, done: int, total: int | None, what: str, force: bool = False) -> None:
        """Show the progress if an interval has passed since the last time (or ``force``)."""
        with self._lock:
            if self._status.due(force):
                self._status.show(self.text(done, total, what))

    def finish(self, done: int, total: int | None, what: str) -> None:
        """The last state, shown whatever the interval; a terminal's bar ends its line."""
        self.update(done, total, what, force=True)
        with self._lock:
            self._status.end()


class ReadingProgress(Progress):
    """The stream reader's progress (records read, shards done) on a :class:`RunProgress`'s line."""

    def __init__(self, run: RunProgress) -> None:
        super().__init__(out=run.out)
        self.run = run

    def _maybe_print(self) -> None:  # called under the reader's lock, on each page and shard
        done = sum(s.done for s in self._streams.values())
        total = sum(s.shards for s in self._streams.values())
        read = ", ".join(f"{label} {s.records} records" for label, s in self._streams.items())
        self.run.update(done, total, f"shards read; {read}")
