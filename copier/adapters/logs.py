"""Logging: structlog JSON lines on stderr, never stdout.

stdout of ``copier process`` is the MultiLang protocol channel; one stray
byte there breaks the daemon's parser. The daemon logs every stderr line of
a child at ERROR, so copier logs one line per event worth a human's time
(takeovers, fencing, verification, bad input, retries) and keeps per-batch
lines at DEBUG.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

from copier.adapters.logsplit import SplitJSONRenderer

__all__ = ["configure_logging"]


def configure_logging(level: str = "INFO", stream: TextIO | None = None) -> None:
    """Route structlog (and the stdlib loggers of boto and PynamoDB) to stderr as JSON."""
    out = stream or sys.stderr
    numeric = logging.getLevelName(level)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            SplitJSONRenderer(),  # lines that journald and rsyslog pass whole (copier.adapters.logsplit)
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    logging.basicConfig(stream=out, level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", force=True)
