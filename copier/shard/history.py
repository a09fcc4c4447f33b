"""The shard's memory of what it forwarded: the dedup window, rebuilt from the committed digest batches.

A shard's digest batches hold only what it forwarded itself, and within one
horizon a shard can be split and merged more than once. So at a takeover the
window is rebuilt from the shard's own batches and, where they do not reach
back as far as the horizon, from its ancestors' (the lineage walked from
parents to grandparents: chaos seed 6 found a duplicate on the merged
grandchild of the shard that had forwarded the original).

In an application started at a point in time, a shard's history also holds
the IDs of what arrived within the window before the start, loaded from
staging once, at the shard's first takeover (``copier.shard.prestart``).

It also remembers under which dedup keys (and ID typing) the IDs it holds
were read, so that after a configuration change (or an upgrade) a record
whose ID under an earlier key was forwarded is a duplicate too, until those
IDs age out.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from copier.core.config import DedupKey, parse_dedup_key
from copier.core.packing import digest_columns
from copier.core.state import DigestBatch
from copier.core.window import DedupWindow
from copier.shard.prestart import PreStart
from copier.shard.session import ShardSession

__all__ = ["History"]


class History:
    """Loads the session's dedup window, and knows the dedup keys its IDs were read under."""

    def __init__(self, session: ShardSession, arrival_ordered: bool = True, every_shard: bool = False) -> None:
        """``arrival_ordered``: a later digest batch holds later arrivals (the live shard: indexes and staging
        arrivals rise together), so a load may stop at the first batch past the horizon. A source's batches are in
        no such order (a redrive run may send an old record after a new one: another selection), so every
        committed batch is read (its state is small; the count cap still applies).

        ``every_shard``: the window holds what every shard of the stream committed, not only the shard's own and
        its ancestors' (a redrive: the records of one event can be on a parent and on a child of a resharded
        dead-letter stream, and a run may send from the child before another run reads the parent)."""
        self.s = session
        self.arrival_ordered = arrival_ordered
        self.every_shard = every_shard
        self._keys: dict[tuple[str, bool], int] = {}  # (dedup key, typed IDs) -> newest arrival read under it
        self._cut_reported = False
        self._raise_reported = False
        self.prestart = PreStart(session, self)

    def reload(self) -> None:
        """A new window, loaded again (after taking the shard back: another owner forwarded meanwhile)."""
        s = self.s
        s.window = DedupWindow(s.config.dedup_window_ms, s.config.dedup_window_max_events)
        self.load()

    def load(self) -> None:
        """Rebuild the window from the committed batches: the shard's own, and its ancestors' within the
        horizon; at a new application's first takeover of the shard, load what arrived before its start (see the
        module docstring). FencedError goes up (the load before the start writes as owner)."""
        s = self.s
        assert s.state is not None
        if not s.window.enabled:
            return
        self._load_batches()
        self.prestart.load()

    def _load_batches(self) -> None:
        s = self.s
        assert s.state is not None
        started = time.monotonic()
        stream = s.config.stream_name
        own = list(self._newest_first(s.key, s.state.batches))
        newest = max([s.state.window_newest_ms] + [b.arrival_max_ms for b in own])
        inherited: list[DigestBatch] = []
        ancestors: list[str] = []
        frontier: list[str] = []
        if self.every_shard:
            listed = s.retrying("list_shards", lambda: s.streams.shards(stream))
            for other in (shard["ShardId"] for shard in listed if shard["ShardId"] != s.shard_id):
                ancestors.append(other)
                newest = self._inherit(other, newest, inherited)
        elif not self._reaches_back(own, newest):
            frontier.append(s.shard_id)
        seen = {s.shard_id}
        while frontier:
            child = frontier.pop(0)
            ancestor = child != s.shard_id
            parents = s.retrying("list_parents", lambda: s.streams.parents(stream, child, ancestor))
            for parent in parents:
                if parent in seen:
                    continue
                seen.add(parent)
                ancestors.append(parent)
                reached = len(inherited)
                newest = self._inherit(parent, newest, inherited)
                if not self._reaches_back(inherited[reached:], newest):
                    frontier.append(parent)
        everything = own + inherited
        s.window.advance(newest)
        s.window.reserve(sum(b.keyed_count for b in everything))
        self._keys = {}
        keys: dict[str, tuple[str, bool]] = {}  # stored settings -> their dedup key, typed IDs
        for batch in sorted(everything, key=lambda b: b.arrival_max_ms):
            for column in (batch.keyed, batch.dead_ids, batch.before_ids):
                if column:
                    low, high = digest_columns(column)
                    s.window.add_columns(low, high, batch.arrival_max_ms)
            if batch.settings not in keys:
                stored = s.stored_settings(batch.settings, f"{batch.key} settings")
                keys[batch.settings] = (str(stored.dedup_key), stored.typed_ids)
            self.saw_key(keys[batch.settings], batch.arrival_max_ms)
        stats = s.window.stats()
        s.log.info(
            "window_loaded",
            ids=stats.ids,
            batches=len(own),
            parents=ancestors,
            parent_batches=len(inherited),
            oldest_ms=stats.oldest_ms,
            newest_ms=stats.newest_ms,
            cut_short=stats.cut_short,
            memory_bytes=s.window.memory_bytes(),
            seconds=round(time.monotonic() - started, 3),
        )
        self._say_if_raised(newest)

    def _inherit(self, shard_id: str, newest_ms: int, into: list[DigestBatch]) -> int:
        """Add another shard's committed batches to ``into`` (within the horizon, where they follow arrivals);
        the newest arrival known with them."""
        s = self.s
        key = s.key_of(shard_id)
        state = s.retrying("get_parent_state", lambda: s.store.get(key))
        batches = list(self._newest_first(key, state.batches)) if state else []
        into.extend(batches)
        return max([newest_ms, state.window_newest_ms if state else 0] + [b.arrival_max_ms for b in batches])

    def _say_if_raised(self, newest_ms: int) -> None:
        """A configured window larger than the one the shard's digest batches were written under (the state
        item's ``window_ms``) is said once: each batch's lifetime was fixed when it was written, from the window
        of then, so an event that arrived by ``newest_ms`` is deduplicated within that window only; the larger
        one holds for events arriving after it (docs/protocol.md, "The dedup window")."""
        s = self.s
        assert s.state is not None
        recorded, window = s.state.window_ms, s.config.dedup_window_ms
        if self._raise_reported or recorded is None or recorded >= window:
            return
        self._raise_reported = True
        s.log.warning(
            "window_raised",
            window_seconds=window // 1000,
            written_under_seconds=recorded // 1000,
            holds_from_ms=newest_ms,
            holds_fully_from_ms=newest_ms + window,
            detail="copier.dedupWindowSeconds was raised: digest batches written before keep the lifetime of the "
            "window they were written under, so events that arrived by holds_from_ms are deduplicated within that "
            "window only; the larger window holds for events arriving after it (for every duplicate from "
            "holds_fully_from_ms on)",
        )

    def _reaches_back(self, batches: Sequence[DigestBatch], newest_ms: int) -> bool:
        """Do these batches already cover the horizon behind ``newest_ms``?"""
        oldest = min((b.arrival_min_ms for b in batches), default=None)
        return oldest is not None and oldest <= newest_ms - self.s.config.dedup_window_ms

    def _newest_first(self, key: str, upto: int) -> Iterator[DigestBatch]:
        return iter(self.s.retrying("load_window", lambda: list(self._lazy(key, upto))))

    def _lazy(self, key: str, upto: int) -> Iterator[DigestBatch]:
        """The committed batches newest first, read until the window's cap is reached or, where indexes follow
        arrivals (``arrival_ordered``), a batch lies past the horizon of the newest: the ones after it are older."""
        config = self.s.config
        taken = 0
        newest: int | None = None
        for batch in self.s.store.batches(key, upto):
            if newest is None:
                newest = batch.arrival_max_ms
            past = self.arrival_ordered and batch.arrival_max_ms < newest - config.dedup_window_ms
            if taken >= config.dedup_window_max_events or past:
                return
            taken += batch.keyed_count
            yield batch

    def add(self, digests: list[int], arrival_max_ms: int, key: tuple[str, bool]) -> None:
        """A committed chunk's IDs (read under ``key``) join the window; a window cut short is said once."""
        s = self.s
        s.window.add(digests, arrival_max_ms)
        self.saw_key(key, arrival_max_ms)
        window = s.window.stats()
        if window.cut_short and not self._cut_reported:
            s.log.warning(
                "window_cut_short",
                ids=window.ids,
                oldest_ms=window.oldest_ms,
                newest_ms=window.newest_ms,
                detail="copier.dedupWindowMaxEvents keeps the window shorter than copier.dedupWindowSeconds",
            )
        self._cut_reported = window.cut_short

    def saw_key(self, key: tuple[str, bool], arrival_ms: int) -> None:
        """The window holds IDs read under ``key`` (dedup key, typed IDs) up to ``arrival_ms``."""
        if arrival_ms > self._keys.get(key, -1):
            self._keys[key] = arrival_ms

    def older_keys(self) -> list[tuple[DedupKey, bool]]:
        """Dedup keys (with whether their IDs were typed) other than the current one whose IDs the window still
        holds (a configuration change, or an upgrade from a version that read the integer 7 as "7", within
        the window): a record whose ID under one of them was forwarded is a duplicate too."""
        s = self.s
        current = (str(s.config.dedup_key), True)
        horizon = s.window.newest_ms - s.config.dedup_window_ms
        return [
            (parse_dedup_key(k), typed)
            for (k, typed), newest in self._keys.items()
            if (k, typed) != current and newest >= horizon
        ]
