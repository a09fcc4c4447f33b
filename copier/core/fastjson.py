"""JSON read by orjson where its reading is json's, and by the standard library's ``json`` everywhere else.

Why: a processor parses JSON three times an event (the daemon's line, the
event's payload for its ID, the PutRecords answer). orjson reads each in a
third to a half of ``json``'s time (200 B events: the payload 2.6 against
0.8 µs, the daemon's line 2.2 against 0.9 µs a record; ``timeit``, Python
3.11), which made copier cost less CPU an event than the plain copier
(issue 47, docs/benchmarks.md section 1).

Request bodies are written by orjson too (:func:`dumps`), four to thirty times
faster than ``json.dumps``.

What copier decides must not change with the parser (a rolling deploy runs
both versions on one stream, and an event is keyed or not, and has one ID,
under either), so orjson is used only where it reads exactly what ``json``
reads. They differ only on these (``tests/test_fastjson.py`` draws them):

* ``json`` accepts and orjson refuses: a lone surrogate escape (``"\\ud800"``),
  ``NaN``, ``Infinity``, a number past a double's range (``1e999``);
* both accept and read differently: an integer past 64 bits (orjson: a float);
* orjson accepts and ``json`` refuses: an integer of more than 4,300 digits
  (Python's limit on ``int()`` of a string), nesting deeper than ``json``'s
  recursion limit (1,000 frames, less the caller's stack; orjson's: 1,024).

:func:`loads` falls back to ``json`` whenever orjson refuses: for the daemon's
messages and AWS's answers, whose integers fit 64 bits and which nest a few
levels. :func:`trusted_loads` is for an event's payload, which anyone writes:
it answers only where the last case cannot arise (at most 4,300 bytes, fewer
than 500 brackets), and its caller still reads an ID that is not a string or
an integer with ``json`` (``copier.core.identity``). Where orjson is not
installed (a Spark cluster's Python, given copier as a zip), ``json`` reads
and writes everything.
"""

from __future__ import annotations

import json
from typing import Any, Final

try:
    import orjson
except ImportError:  # a Spark cluster's Python given copier as a zip (the writer needs pyspark and boto3 only)
    orjson = None  # type: ignore[assignment]

__all__ = ["MAX_TRUSTED_BRACKETS", "MAX_TRUSTED_BYTES", "UNSURE", "dumps", "loads", "trusted_loads"]

#: Longest payload read by orjson: no integer in it can pass Python's 4,300 digits.
MAX_TRUSTED_BYTES: Final = 4300
#: Fewest ``[`` and ``{`` read by ``json`` instead: nesting stays far below its recursion limit.
MAX_TRUSTED_BRACKETS: Final = 500

UNSURE: Final = object()  # trusted_loads: orjson's reading might not be json's; read it with json


def loads(text: str | bytes) -> Any:
    """``json.loads(text)``, through orjson when it accepts the text (for documents whose integers fit 64 bits
    and that nest a few levels: see the module docstring). Raises what ``json.loads`` raises."""
    if orjson is None:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(value: Any) -> bytes:
    """A request body: ``value`` as compact JSON in UTF-8, through orjson where it can write it (``json`` writes
    what it refuses: a lone surrogate, an integer past 64 bits). The two write the same value, in other bytes
    (orjson writes non-ASCII characters as they are, ``json`` escapes them); AWS reads either as that value."""
    if orjson is None:
        return json.dumps(value, separators=(",", ":")).encode()
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def trusted_loads(data: bytes) -> Any:
    """orjson's reading of ``data`` where it is certain to be ``json``'s but for integers past 64 bits (which
    orjson reads as floats), else :data:`UNSURE`: too long or too many brackets to be sure, or refused."""
    if orjson is None or len(data) > MAX_TRUSTED_BYTES or data.count(b"[") + data.count(b"{") >= MAX_TRUSTED_BRACKETS:
        return UNSURE
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return UNSURE
