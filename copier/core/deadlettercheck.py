"""Dead-letter envelope checks: does a dead-letter record stand for a produced record, for a true reason?

A dead-letter record must be an envelope (``copier.core.plan``) that points at a
produced record (source shard and position), with that record's key and
bytes (its data, or its SHA-256 when the data was too large to keep), and a
reason that the record bears out (no event ID, too large, a key Kinesis
refuses). Anything else is *invalid*, and the audit fails on it. When the
source says no keyed event should be there (``keyed_dead_letters`` False),
an envelope of one is invalid too. Pure logic over the audit's value types
(``copier.core.audittypes``); the envelope itself is read by
``copier.core.auditinputs.read_envelope``.
"""

from __future__ import annotations

import re

from copier.core.audittypes import DeadLetter, Position, Produced
from copier.core.envelope import reason_kind
from copier.core.limits import UTF16_UNITS
from copier.core.limits import key_problem as refused_key

__all__ = ["check_dead_letter", "key_problem"]


def key_problem(partition_key: str) -> str | None:
    """Why a copier may have refused a partition key (empty, a lone surrogate, over 256 characters), or None.

    Counted in UTF-16 code units, the larger count: copier counted so before it counted code points
    (``copier.core.limits``), so an envelope either version wrote for a key checks out.
    """
    return refused_key(partition_key, UTF16_UNITS)


def check_dead_letter(
    letter: DeadLetter,
    at: dict[Position, Produced] | None = None,
    keyed_dead_letters: bool = True,
    positions_known: bool = False,
) -> str | None:
    """Why a dead-letter record does not check out against what was produced (None: it does)."""
    if letter.problem is not None:
        return letter.problem
    kind = reason_kind(letter.reason)
    if kind is None:
        return f"unknown reason {letter.reason!r}"
    if not positions_known or at is None:
        return None
    if letter.position is None or letter.position not in at:
        return f"points at no produced record ({letter.position})"
    produced = at[letter.position]
    if produced.sha256 is not None and letter.sha256 != produced.sha256:
        return "its bytes are not the produced record's"
    if produced.partition_key is not None and letter.partition_key != produced.partition_key:
        return "its partition key is not the produced record's"
    if produced.dead_letter is not None and produced.dead_letter != kind:
        return f"reason {kind} for a record produced to be dead-lettered as {produced.dead_letter}"
    if produced.dead_letter is None and kind == "no_id" and produced.event_id is not None:
        return "says 'no event ID' of a record that has one"
    if kind == "oversize" and produced.size is not None:
        sizes = [int(n) for n in re.findall(r"(\d+) bytes", letter.reason)]
        if len(sizes) != 2 or sizes[0] != produced.size or sizes[0] <= sizes[1]:
            return f"says too large ({letter.reason}) of a record of {produced.size} bytes"
    if kind == "key" and produced.partition_key is not None and key_problem(produced.partition_key) is None:
        return "says its partition key is invalid, and it is not"
    if produced.dead_letter is None and produced.event_id is not None and not keyed_dead_letters:
        return "a keyed event that no rule sends to the dead-letter stream"
    return None
