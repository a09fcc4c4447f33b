"""The moto patch for sequence numbers: unique and increasing across the process, drawn as a record is stored.

Without it two concurrent puts into one shard can lose an acknowledged
record, and a child shard's records sort below its parent's (see
:func:`patch_sequence_numbers`).
"""

from __future__ import annotations

import threading
from typing import Any

from moto.kinesis import models as kinesis_models

from copier.local.moto_patches.replace import replace

__all__ = ["patch_sequence_numbers"]

Shard = kinesis_models.Shard

_sequence_lock = threading.Lock()
_last_sequence_number = 0


def _next_sequence_number_locked() -> int:
    """The next number of the process-wide counter; the caller holds ``_sequence_lock``."""
    global _last_sequence_number
    _last_sequence_number += 1
    return _last_sequence_number


def _next_sequence_number() -> int:
    """The next number of the process-wide, strictly increasing counter."""
    with _sequence_lock:
        return _next_sequence_number_locked()


def patch_sequence_numbers() -> None:
    """Give every record a unique, increasing sequence number, and every shard a fixed range.

    moto numbers a record ``max(shard's numbers) + 1`` without a lock, so two
    concurrent PutRecords into one shard can draw the same number and the
    second silently overwrites the first: an acknowledged record is lost,
    which is exactly the failure the copier exists to prevent. And moto
    reads a shard in insertion order, skipping numbers below the last one it
    returned, so a record stored after a higher-numbered one is never read:
    numbers must be drawn and records stored in one step. Numbers also
    restart at 1 in every shard, so a child shard's records sort *below* its
    parent's, while AWS numbers a child's records above its parents'.
    moto also reports a shard's StartingSequenceNumber as its first record's
    number ("0" while empty), so it moves when the first record arrives.

    Patched: one locked counter for the whole process (unique and increasing
    across all shards, children above parents), held while the record is
    stored; a shard reserves its StartingSequenceNumber when it is created;
    a closed shard's EndingSequenceNumber is its last record's number, or its
    starting number if it never held a record.
    """
    original_init = Shard.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.starting_sequence_number = _next_sequence_number()

    def put_record(self: Any, partition_key: str, data: str, explicit_hash_key: str) -> str:
        # Draw and store under one lock: moto reads a shard in insertion order and
        # skips any number below one it has passed, so a record stored after a
        # higher-numbered one would never be read.
        with _sequence_lock:
            sequence_number = _next_sequence_number_locked()
            self.records[sequence_number] = kinesis_models.Record(
                partition_key, data, sequence_number, explicit_hash_key
            )
        return str(sequence_number)

    original_to_json = Shard.to_json

    def to_json(self: Any) -> dict[str, Any]:
        body: dict[str, Any] = original_to_json(self)
        start = getattr(self, "starting_sequence_number", 0)
        body["SequenceNumberRange"]["StartingSequenceNumber"] = str(start)
        if not self.is_open:
            end = self.get_max_sequence_number() if self.records else start
            body["SequenceNumberRange"]["EndingSequenceNumber"] = str(end)
        return body

    replace(Shard, "__init__", __init__)
    replace(Shard, "put_record", put_record)
    replace(Shard, "to_json", to_json)
