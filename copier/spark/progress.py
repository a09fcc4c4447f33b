"""``copier audit``'s progress: Spark's own bar on a terminal, a line every few seconds in a log.

Spark draws a console progress bar of its stages (``spark.ui.showConsoleProgress``)
by rewriting one line with carriage returns: right on a terminal, hundreds
of fragments in a log. So on a terminal the audit leaves the bar to Spark;
elsewhere it turns the bar off and :class:`StageLines` writes a whole line
every interval from Spark's status tracker: the stages running, each with
its tasks done out of its total.

An audit is interrupted with Ctrl-C (PySpark cancels the running jobs and
raises KeyboardInterrupt; the command exits 130). It is not resumed: it
reads files, and the part of an audit over a large range that takes hours,
reading the streams within the Kinesis read limits, is ``copier export``'s,
which goes on where it stopped (``copier.commands.export``).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO

__all__ = ["LINE_INTERVAL_S", "StageLines", "console_bar"]

LINE_INTERVAL_S = 5.0


def console_bar(out: TextIO | None = None) -> bool:
    """Whether Spark's own bar should be drawn: only on a terminal."""
    stream = out if out is not None else sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class StageLines:
    """A line on ``out`` every ``interval`` seconds while Spark runs stages (``tracker``: a SparkContext's
    ``statusTracker()``); a context manager running a daemon thread. Nothing while no stage runs."""

    def __init__(self, tracker: Any, out: TextIO | None = None, interval: float = LINE_INTERVAL_S) -> None:
        self._tracker = tracker
        self._out = out if out is not None else sys.stderr
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-progress", daemon=True)

    def line(self) -> str | None:
        """The stages running now, each with its tasks done out of its total (None: no stage runs)."""
        parts = []
        for stage_id in sorted(self._tracker.getActiveStageIds()):
            info = self._tracker.getStageInfo(stage_id)
            if info is not None:
                parts.append(
                    f"stage {stage_id} ({info.name.split(' at ')[0]}) {info.numCompletedTasks}/{info.numTasks}"
                )
        return "audit: running: " + "; ".join(parts) if parts else None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                line = self.line()
            except Exception:  # a context being stopped: progress is never worth failing the audit for
                return
            if line is not None:
                print(line, file=self._out, flush=True)

    def __enter__(self) -> StageLines:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self._interval + 1)
