"""The body of a PutRecords request, written without ``json.dumps`` walking every record's data.

Why: at 2 KB records, ``json.dumps`` of a PutRecords body spent about 7 µs a
record scanning each record's base64 for characters to escape (measured with
``timeit``, Python 3.11), a seventh of what copier spent on a record in all.
Base64 has none of them: its alphabet is ``A-Z a-z 0-9 + / =``. So the data
is written between quotes as it is, and only the stream name and each
partition key go through JSON's own string encoder (``ensure_ascii``, as
``json.dumps`` writes them: a lone surrogate key becomes ``\\ud800``).

A record's base64 is taken as given only where it is known to be base64:
``SourceRecord.b64`` is set from the daemon's text once
``binascii.a2b_base64(..., strict_mode=True)`` accepted it
(``copier.kcl.processor``), and is dropped wherever the data changes
(``copier.core.plan``, ``copier.core.replan``). Everything else is encoded here.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _quoted  # type: ignore[attr-defined]

__all__ = ["put_records_body"]

PutEntry = tuple[str, bytes, str | None]  # (partition key, data, data in base64 if already at hand)


def put_records_body(stream: str, entries: Sequence[PutEntry]) -> bytes:
    """The JSON of ``{"StreamName": stream, "Records": [{"Data": ..., "PartitionKey": ...}, ...]}``, as bytes.

    One flat list joined once: concatenating each record's parts first copies its data once more per part.
    """
    parts = ['{"StreamName":', _quoted(stream), ',"Records":[']
    add = parts.extend
    for key, data, text in entries:
        add(('{"Data":"', text if text is not None else base64.b64encode(data).decode("ascii"), '","PartitionKey":'))
        add((_quoted(key), "},"))
    if entries:
        parts[-1] = "}"
    parts.append("]}")
    return "".join(parts).encode("ascii")
