"""Where a partition key's record goes, and which shards descend from which: pure shard arithmetic.

Kinesis routes a record to the open shard whose hash key range holds the
MD5 of its partition key (a 128-bit big-endian integer). Two readers need
that here:

* the copier records, with every digest batch, the numbers of the target
  shards its entries hash to, so that verifying the batch later reads those
  shards only (and the shards split or merged from them since: a stale map
  can only name an ancestor of the shard a record really went to);
* the Spark writer groups events per open staging shard before aggregating.

Shard IDs are ``shardId-`` and a 12-digit number; the number alone is what
a digest batch stores.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LIST_SHARDS_PAGE",
    "SHARD_MAP_MAX_AGE_S",
    "ShardMap",
    "Listing",
    "decode_entries",
    "decode_listing",
    "descendants",
    "encode_entries",
    "encode_listing",
    "hash_key",
    "key_hashes",
    "listing_fresh",
    "shard_id_of",
    "shard_number",
    "shards_covering",
]

#: How old a processor's map of a stream's open shards may be before it lists the stream again (the target's,
#: for its chunks' target shards): one ListShards listing per processor and stream in that time, a page per
#: ``LIST_SHARDS_PAGE`` shards; the capacity planner counts them (``copier.core.capacitylines``).
SHARD_MAP_MAX_AGE_S = 300.0
LIST_SHARDS_PAGE = 1000  # the most shards a ListShards page holds

_PREFIX = "shardId-"
_LISTING_FORMAT = 1  # the host share's file format for a listing (copier.adapters.summaryshare): another is not read
_HASH_KEYS = 2**128


def hash_key(partition_key: str) -> int:
    """The 128-bit hash key Kinesis routes a partition key by: MD5 of its UTF-8 bytes, big-endian.

    A lone surrogate, which has no UTF-8 form, counts as ``?``, as Java's ``String.getBytes(UTF_8)`` (the
    KCL's ``AggregatorUtil``) encodes it: never raises (copier sends no such key; ``copier.core.limits``).
    """
    return int.from_bytes(hashlib.md5(partition_key.encode("utf-8", "replace")).digest(), "big")


def shard_number(shard_id: str) -> int:
    """``shardId-000000000012`` -> 12; ValueError for anything else."""
    if not shard_id.startswith(_PREFIX):
        raise ValueError(f"not a Kinesis shard ID: {shard_id!r}")
    return int(shard_id[len(_PREFIX) :])


def shard_id_of(number: int) -> str:
    return f"{_PREFIX}{number:012d}"


def _is_open(shard: dict[str, Any]) -> bool:
    return "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {})


@dataclass(frozen=True)
class ShardMap:
    """The open shards of a stream, by hash key range (from ListShards)."""

    ranges: tuple[tuple[int, int, str], ...]  # (starting hash key, ending hash key, shard ID), sorted

    @classmethod
    def of(cls, shards: Iterable[dict[str, Any]]) -> ShardMap:
        """From ListShards entries; closed shards take no new records and are left out."""
        ranges = [
            (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]), s["ShardId"])
            for s in shards
            if _is_open(s)
        ]
        return cls(tuple(sorted(ranges)))

    def position_for_hash(self, key: int) -> int:
        """Index in :attr:`ranges` of the shard holding ``key``, -1 when none does (mid-reshard)."""
        i = bisect_right(self.ranges, (key, 2**128, "")) - 1
        return i if i >= 0 and key <= self.ranges[i][1] else -1

    def shard_for(self, partition_key: str) -> str | None:
        """The shard a record with this partition key goes to now, None if no open shard covers it."""
        i = self.position_for_hash(hash_key(partition_key))
        return self.ranges[i][2] if i >= 0 else None


Listing = tuple[float, ShardMap]  # when the listing was asked for (time.monotonic()), and its map


def listing_fresh(listing: Listing, now: float) -> bool:
    """May a map listed at ``listing[0]`` be used ``now``? At most ``SHARD_MAP_MAX_AGE_S`` old, and never one
    stamped later than now (a clock that restarted)."""
    return listing[0] <= now <= listing[0] + SHARD_MAP_MAX_AGE_S


def encode_listing(listing: Listing) -> str:
    """A listing as a host's processors share it (JSON, with the format's version): the time it was asked
    for, and each open shard's hash key range and ID."""
    listed_s, shard_map = listing
    ranges = [[str(low), str(high), shard_id] for low, high, shard_id in shard_map.ranges]
    return json.dumps({"format": _LISTING_FORMAT, "listed": listed_s, "ranges": ranges}, separators=(",", ":"))


def decode_listing(text: str) -> Listing | None:
    """What :func:`encode_listing` wrote; None for anything else (a file cut short, another version's, a range
    that is not two hash keys and a shard ID): listed again, never trusted. A map that routed a key to a wrong
    shard would have a chunk's verification read shards its records never went to."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("format") != _LISTING_FORMAT:
            return None
        listed = raw["listed"]
        if isinstance(listed, bool) or not isinstance(listed, (int, float)):
            return None
        listed = float(listed)
        ranges = []
        for low, high, shard_id in raw["ranges"]:
            bounds = int(low), int(high)
            if not (isinstance(low, str) and isinstance(high, str) and 0 <= bounds[0] <= bounds[1] < _HASH_KEYS):
                return None
            shard_number(shard_id)  # a shard ID, or ValueError
            ranges.append((bounds[0], bounds[1], shard_id))
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):
        return None
    return listed, ShardMap(tuple(sorted(ranges)))


_LINEAGE_FIELDS = ("ShardId", "ParentShardId", "AdjacentParentShardId")


def encode_entries(listed_s: float, shards: Iterable[dict[str, Any]]) -> str:
    """A stream's ListShards entries as a host's processors share them for takeovers (JSON, with the format's
    version): the time they were asked for, and of each shard what never changes once it exists, its ID,
    parents and hash key range (``copier.adapters.kinesis``: ``shard_entry``)."""
    kept = [
        {**{k: s[k] for k in _LINEAGE_FIELDS if k in s}, "HashKeyRange": s["HashKeyRange"]}
        for s in shards
        if "HashKeyRange" in s
    ]
    return json.dumps({"format": _LISTING_FORMAT, "listed": listed_s, "shards": kept}, separators=(",", ":"))


def decode_entries(text: str) -> tuple[float, list[dict[str, Any]]] | None:
    """What :func:`encode_entries` wrote; None for anything else (listed again, never trusted)."""
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("format") != _LISTING_FORMAT:
            return None
        listed, shards = raw["listed"], raw["shards"]
        if isinstance(listed, bool) or not isinstance(listed, (int, float)) or not isinstance(shards, list):
            return None
        listed = float(listed)
        for shard in shards:
            keys = shard["HashKeyRange"]
            if set(shard) - {*_LINEAGE_FIELDS, "HashKeyRange"} or set(keys) != {"StartingHashKey", "EndingHashKey"}:
                return None
            for field in _LINEAGE_FIELDS:
                if field in shard:
                    shard_number(shard[field])  # a shard ID, or ValueError
            if not 0 <= int(keys["StartingHashKey"]) <= int(keys["EndingHashKey"]) < _HASH_KEYS:
                return None
            if not all(isinstance(v, str) for v in keys.values()):
                return None
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError):
        return None
    if any("ShardId" not in shard for shard in shards):
        return None
    return listed, shards


def key_hashes(partition_keys: Iterable[str]) -> dict[str, int]:
    """Each distinct key's :func:`hash_key`: a chunk's keys hashed once, for every look at where they go (the
    staging shard's range, the target shards its digest batch names)."""
    return {key: hash_key(key) for key in partition_keys}


def shards_covering(
    shard_map: ShardMap, partition_keys: Iterable[str], hashes: Mapping[str, int] | None = None
) -> set[int] | None:
    """Numbers of the open shards these partition keys go to; None (read them all) when unknown or all.

    Each distinct key is hashed once (or its hash taken from ``hashes``,
    :func:`key_hashes`), and hashing stops as soon as every open shard is
    covered: a chunk of random keys on a target of few shards costs a
    handful of hashes, not one per record. Use a map taken *before*
    the put it is for: a map refreshed after the put may already name the
    children of a shard split since, and miss the parent the records went
    to; an older map names only ancestors, and their descendants are read.
    """
    ranges = shard_map.ranges
    total = len(ranges)
    known = hashes or {}
    found: set[int] = set()  # indexes in the map's ranges
    low, high, i = 1, 0, -1  # the range the last key fell in: a staging shard's keys mostly share one
    for partition_key in dict.fromkeys(partition_keys):
        hashed = known.get(partition_key)
        if hashed is None:
            hashed = hash_key(partition_key)
        if not low <= hashed <= high:
            i = shard_map.position_for_hash(hashed)
            if i < 0:
                return None  # mid-reshard: no open shard covers the key
            low, high = ranges[i][0], ranges[i][1]
            found.add(i)
            if len(found) == total:
                return None  # every shard: the same as no bound
    return {shard_number(ranges[i][2]) for i in found}


def descendants(shards: Iterable[dict[str, Any]], roots: Iterable[str]) -> set[str]:
    """``roots`` and every shard split or merged from them, at any depth (from ListShards entries)."""
    listed = list(shards)
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for shard in listed:
            parents = {shard.get("ParentShardId"), shard.get("AdjacentParentShardId")}
            if shard["ShardId"] not in found and parents & found:
                found.add(shard["ShardId"])
                grew = True
    return found
