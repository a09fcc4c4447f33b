"""JSON read and written by orjson where its answer is the standard library's ``json``'s, and only for
documents whose keys copier, the KCL daemon or AWS wrote.

Why: a processor reads a daemon line for every delivery and an AWS answer
and writes a request body for every call. orjson reads the daemon's line in
under half of ``json``'s time (0.9 against 2.2 µs a 200-byte record) and
writes a request body about 16 times faster (a commit's PutItem: 1.25 against
19.5 µs; ``timeit``, Python 3.11).

Why never an event's payload (``copier.core.identity`` reads it with ``json``
alone): orjson (3.13) caches the keys it reads by a 64-bit hash of their
bytes, and a later key with the same hash comes back as the cached one,
without its text being compared. An adversarial review built two keys of
7 and 8 bytes with one hash: once ``{"id_ezFZ": ...}`` had been read,
``{"flrLduAr": "E1"}`` read as ``{"id_ezFZ": "E1"}``: with ``id_ezFZ`` as the
dedup key, an event without an ID would take another event's and be dropped
(``tests/test_fastjson.py``). A producer writes a payload's keys; copier,
the daemon and AWS write every key of what is read here, a few dozen fixed
names, so no key read here can be chosen to collide with another.

Where orjson reads otherwise than ``json``: it refuses a lone surrogate escape
(``"\\ud800"``), ``NaN``, ``Infinity`` and a number past a double's range, and
:func:`loads` then reads the text with ``json``; it reads an integer past 64
bits as a float, which neither the daemon (its numbers are Java ``long``\\ s)
nor AWS sends. Where orjson is not installed (a Spark cluster's Python given
copier as a zip: the writer needs pyspark and boto3 only), ``json`` reads and
writes everything.
"""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # a Spark cluster's Python given copier as a zip
    orjson = None  # type: ignore[assignment]

__all__ = ["dumps", "loads"]


def loads(text: str | bytes) -> Any:
    """``json.loads(text)`` for a daemon line or an AWS answer, through orjson when it accepts the text (see
    the module docstring: never a document whose keys a producer wrote). Raises what ``json.loads`` raises."""
    if orjson is None:
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(value: Any) -> bytes:
    """A request body: ``value`` as compact JSON in UTF-8, through orjson where it can write it (``json`` writes
    what it refuses: a lone surrogate, an integer past 64 bits). The two write the same value, in other bytes
    (orjson writes non-ASCII characters as they are, ``json`` escapes them); AWS reads either as that value.
    But for NaN and the infinities, which orjson writes as ``null``: no request copier sends holds one."""
    if orjson is None:
        return json.dumps(value, separators=(",", ":")).encode()
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()
