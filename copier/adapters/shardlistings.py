"""A processor's ListShards listings of a stream, kept for a while and shared by the processors of its host.

Two readers need a stream's shards over and over, and ListShards allows
1,000 calls a second per **stream**, a listing being one call per 1,000
shards:

* every chunk's digest batch records the target shards its keys hash to
  (:meth:`ShardListings.shard_map`): a map of the open shards at most
  ``SHARD_MAP_MAX_AGE_S`` old. A processor listing a target of 10,000 shards
  for itself spent 10 pages every 5 minutes: 333 calls a second for a fleet
  running them all;
* a takeover reads its own range and walks its lineage
  (:meth:`ShardListings.entry`): at a fleet start of 10,000 shards, 10 pages
  a processor, 620 calls a second at the simulated peak.

So one listing per stream is shared by a host's processors
(``copier.adapters.summaryshare``: files in the daemon run's directory), as
the DescribeStreamSummary answer is. Without a share (a processor run
outside ``copier run``) each lists for itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from copier.adapters.summaryshare import SummaryShare
from copier.core.shardmap import SHARD_MAP_MAX_AGE_S, Listing, ShardMap, listing_fresh

__all__ = ["FIRST_LISTING_WAIT_S", "LINEAGE_MAX_AGE_S", "ShardListings"]

LINEAGE_MAX_AGE_S = 5.0  # a processor's own listing, for the several shards a takeover asks about in a row
FIRST_LISTING_WAIT_S = 10.0  # the most a processor with no map waits for another's listing


class ShardListings:
    """The listings of one processor: ``shards(stream)`` lists a stream whole (the caller's ListShards, its
    errors going up), ``monotonic`` is the host's clock, ``share`` the host's (None: none)."""

    def __init__(
        self,
        shards: Callable[[str], list[dict[str, Any]]],
        monotonic: Callable[[], float],
        share: SummaryShare | None,
    ) -> None:
        self._shards, self._monotonic, self._share = shards, monotonic, share
        self._maps: dict[str, Listing] = {}
        self._entries: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    def shard_map(self, stream: str) -> ShardMap:
        """The stream's open shards by hash key range, from a listing asked for at most ``SHARD_MAP_MAX_AGE_S``
        ago. A stale map is safe: it can only name a shard that has since been split or merged, and
        verification reads its descendants too."""
        now = self._monotonic()
        held = self._maps.get(stream)
        if held is None or not listing_fresh(held, now):
            held = self._list(stream, now) if self._share is None else self._shared_listing(stream, held, now)
            self._maps[stream] = held
        return held[1]

    def _list(self, stream: str, now: float) -> Listing:
        return now, ShardMap.of(self._shards(stream))

    def _shared_listing(self, stream: str, held: Listing | None, now: float) -> Listing:
        """The host's listing of ``stream`` if fresh; else this processor lists it for the host, unless another
        is listing now: then one with a map goes on with its stale one (safe, see :meth:`shard_map`), and one
        with none waits a bounded time for the other's listing, then lists alone."""
        assert self._share is not None
        shared = self._share.read_listing(stream)
        if shared is not None and listing_fresh(shared, now):
            return shared
        with self._share.turn(stream, FIRST_LISTING_WAIT_S if held is None else 0.0, "listing") as mine:
            if not mine:
                return held if held is not None else self._list(stream, self._monotonic())
            now = self._monotonic()
            shared = self._share.read_listing(stream)  # listed while this one waited for its turn?
            if shared is not None and listing_fresh(shared, now):
                return shared
            listing = self._list(stream, now)
            self._share.write_listing(stream, listing)
            return listing

    def entry(self, stream: str, shard_id: str) -> dict[str, Any] | None:
        """A shard's ListShards entry, None when not listed. A processor's listing is kept for a few seconds
        (``LINEAGE_MAX_AGE_S``): a takeover reads its own range and walks a lineage, asking about several
        shards in a row. A shard the listing does not name is asked about once more, fresh, unless the
        listing names a child of it: a listing taken after the child existed lists the parent while the
        stream's retention keeps it, so its absence there is its expiry, final (no fresh listing would name it).

        The host's processors share their listings, up to ``SHARD_MAP_MAX_AGE_S`` old: what is read from an
        entry, a shard's hash key range and parents, never changes once the shard exists, and a shard created
        since is not named, so it is listed fresh. (An ancestor expired since is still named: its digest
        batches are looked for in the state table, which only adds to what the window knows.)"""
        now = self._monotonic()
        cached = self._entries.get(stream)
        if (cached is None or now - cached[0] > LINEAGE_MAX_AGE_S) and self._share is not None:
            shared = self._share.read_entries(stream)  # the host's: a fleet start lists once a host, not a shard
            fresh_enough = shared is not None and shared[0] <= now <= shared[0] + SHARD_MAP_MAX_AGE_S
            cached = (now, shared[1]) if shared is not None and fresh_enough else None
        for attempt in (1, 2):
            if cached is None or now - cached[0] > LINEAGE_MAX_AGE_S or attempt == 2:
                cached = (now, self._shards(stream))
                if self._share is not None:
                    self._share.write_entries(stream, now, cached[1])
            self._entries[stream] = cached
            for shard in cached[1]:
                if shard["ShardId"] == shard_id:
                    return shard
            if any(shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) for s in cached[1]):
                return None  # its child is named and it is not: it had expired when listed (a parent is older)
        return None
