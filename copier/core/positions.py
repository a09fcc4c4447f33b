"""Positions in a Kinesis shard: ``(sequence number, sub-sequence number)``.

Sequence numbers are decimal strings of up to 128 digits; they must be
compared as numbers, never as strings ("9" > "10" as text). KPL-aggregated
records share one sequence number and are told apart by the sub-sequence
number the daemon assigns while de-aggregating (0..n-1); a plain record has
sub-sequence number 0.

The committed position of a shard is the last position whose fate is
decided (forwarded, or dropped as a replay or a duplicate). Processing
resumes strictly *after* it: a record at or below it is a replay.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["Position"]


class Position(NamedTuple):
    """A totally ordered place in a shard; compares numerically (a tuple: cheap to make and to compare,
    which matters at tens of thousands of records a second)."""

    seq: int
    subseq: int = 0

    @classmethod
    def parse(cls, seq: str | int, subseq: str | int | None = 0) -> Position:
        """Build from the daemon's strings; raises ValueError on anything non-numeric."""
        s = int(seq)
        sub = int(subseq or 0)
        if s < 0 or sub < 0:
            raise ValueError(f"negative position ({seq}, {subseq})")
        return cls(s, sub)

    @property
    def seq_str(self) -> str:
        return str(self.seq)

    def __str__(self) -> str:  # NamedTuple's own would print the fields
        return f"{self.seq}/{self.subseq}"
