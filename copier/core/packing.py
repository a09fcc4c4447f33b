"""Binary encodings of what the state table stores: digest lists and small integer lists.

Digests (80-bit ints, see ``copier.core.identity``) are stored *column-wise*: the
low 64 bits of every digest, then the high 16 bits of every digest, both
little-endian. That is exactly 10 bytes a digest, and it lets a reader load
a whole stored list into the dedup window as two machine arrays
(:func:`digest_columns`) without building a Python object per digest,
which is what makes loading an hour's window (3.6 million IDs) affordable.

Small non-negative integers (target shard numbers) are stored as
delta-encoded varints: a sorted list of shard numbers costs about one byte
a shard.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable

from copier.core.identity import DIGEST_SIZE

__all__ = [
    "LOW_MASK",
    "digest_columns",
    "digest_count",
    "pack_digests",
    "pack_uints",
    "unpack_digests",
    "unpack_uints",
]

LOW_MASK = (1 << 64) - 1
_LOW = 8  # bytes of the low column per digest
_HIGH = DIGEST_SIZE - _LOW  # bytes of the high column per digest
_BIG_ENDIAN = sys.byteorder == "big"


def _le(column: array[int]) -> array[int]:
    """The column in little-endian byte order (a no-op on little-endian machines)."""
    if _BIG_ENDIAN:
        column.byteswap()
    return column


def pack_digests(digests: Iterable[int]) -> bytes:
    """Digests as stored: all low 64-bit words, then all high 16-bit words, little-endian."""
    values = list(digests)
    low = _le(array("Q", [d & LOW_MASK for d in values]))
    high = _le(array("H", [d >> 64 for d in values]))
    return low.tobytes() + high.tobytes()


def digest_count(blob: bytes | None) -> int:
    """How many digests a packed blob holds; ValueError if its length is not a whole number of them."""
    if not blob:
        return 0
    if len(blob) % DIGEST_SIZE:
        raise ValueError(f"a packed digest list is a multiple of {DIGEST_SIZE} bytes, got {len(blob)}")
    return len(blob) // DIGEST_SIZE


def digest_columns(blob: bytes | None) -> tuple[array[int], array[int]]:
    """The low and high columns of a packed blob as machine arrays ('Q' and 'H')."""
    n = digest_count(blob)
    low: array[int] = array("Q")
    high: array[int] = array("H")
    if n:
        assert blob is not None
        low.frombytes(blob[: n * _LOW])
        high.frombytes(blob[n * _LOW :])
        _le(low)
        _le(high)
    return low, high


def unpack_digests(blob: bytes | None) -> list[int]:
    """The digests of a packed blob, in the order they were packed."""
    low, high = digest_columns(blob)
    return [(h << 64) | lo for lo, h in zip(low, high, strict=True)]


def _varint(n: int, out: bytearray) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def pack_uints(values: Iterable[int]) -> bytes:
    """Distinct non-negative integers, sorted and delta-encoded as varints."""
    out = bytearray()
    previous = 0
    for value in sorted(set(values)):
        if value < 0:
            raise ValueError(f"pack_uints takes non-negative integers, got {value}")
        _varint(value - previous, out)
        previous = value
    return bytes(out)


def unpack_uints(blob: bytes | None) -> list[int]:
    """The sorted integers of :func:`pack_uints`; ValueError on a truncated varint."""
    out: list[int] = []
    value = shift = total = 0
    for byte in blob or b"":
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        total += value
        out.append(total)
        value = shift = 0
    if shift:
        raise ValueError("truncated varint list")
    return out
