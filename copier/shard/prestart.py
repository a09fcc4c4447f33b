"""The events before a new application's start, loaded into a shard's window at its first takeover.

An application started at a point in time (``copier.core.startpoint``)
forwards what arrived in staging at or after the start and nothing before it.
A producer retry after the start of an event that arrived before it must not
be forwarded either (its first copy is before the start), and the window is
what recognises a retry; but the new application's window starts empty. So,
once per shard, before its first record is planned, the IDs of what arrived
within ``copier.dedupWindowSeconds`` before the start are read from staging,
``[start - window, start)``, and kept as the window keeps forwarded IDs:

* read as the daemon delivers them (``Streams.read_arrivals``: AT_TIMESTAMP
  at the window's beginning, up to the first record that arrived at or after
  the start, KPL aggregates de-aggregated), from the shard and from each
  ancestor it was split or merged from whose own history does not hold them
  already (one this application never read, or one whose load did not
  finish); the IDs are taken by ``copier.core.plan``'s own rule for what
  arrived before the start, so the two cannot disagree;
* written as digest batches that put nothing (``before_ids``), at most
  ``MAX_CHUNK_EVENTS`` IDs each, each committed like a chunk, and the state
  item's ``prestart_ms`` written last: a later owner loads them with the
  shard's history, a child shard inherits them with its parents', and a load
  cut short by a crash or a fence is done again by the next owner (what it
  already wrote is only learned twice);
* stamped as arrived just before the start (``arrival_max_ms = start - 1``):
  the window keeps them until its newest arrival passes the start plus the
  window, so a retry that arrives later than that after the start is
  forwarded, as any retry later than the window is.

Reads go at most once a second per shard (a fifth of the shard's 5
GetRecords a second, which a running copier's daemon shares when it polls),
and the lease is kept while they last; a line says where the load is every
``PROGRESS_MS``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from copier.core.errors import ConfigError
from copier.core.limits import MAX_CHUNK_EVENTS
from copier.core.packing import pack_digests
from copier.core.plan import PlanSettings, chunks, plan_batch
from copier.core.positions import Position
from copier.core.startpoint import EXTENDED, iso
from copier.core.state import DigestBatch, digest_expiry_ms, shard_key
from copier.core.window import DedupWindow
from copier.shard.session import HOUR_MS, ShardSession

if TYPE_CHECKING:
    from copier.shard.history import History

__all__ = ["PROGRESS_MS", "PreStart"]

PROGRESS_MS = 10_000  # a prestart_progress line at most this often while a load reads
NO_POSITION = Position(0, 0)  # the ``last`` of a batch that holds no record of the shard's own


@dataclass
class _Load:
    """What one load has read and written so far."""

    shards_read: int = 0
    records: int = 0
    ids: int = 0
    batches: int = 0
    said_ms: int = 0


class PreStart:
    """Loads the IDs of the events before the application's start into a new shard's window (module docstring)."""

    def __init__(self, session: ShardSession, history: History) -> None:
        self.s = session
        self.history = history
        self._nothing = DedupWindow(0, 0)  # the plan's window while reading: every record before the start is kept

    def needed(self) -> bool:
        """A start is configured, the window is on, and this shard has neither loaded the events before the start
        nor planned a record yet (a shard that planned records without it ran before the start was set)."""
        s = self.s
        state = s.state
        return (
            s.config.start_ms is not None
            and not s.key_prefix  # the live staging shard's alone: a redrive or a repair reads no start
            and s.window.enabled
            and state is not None
            and state.prestart_ms is None
            and state.position is None
        )

    def load(self) -> None:
        """Read, record and learn the IDs that arrived within the window before the start (module docstring);
        FencedError goes up (a rival took the shard over: the load is done again by whoever holds it); a start
        other than the one the shard loaded for is a ConfigError (:meth:`refuse_changed`)."""
        state = self.s.state
        if not self.s.key_prefix and state is not None:
            self.refuse_changed(self.s.shard_id, state.prestart_ms)
        if not self.needed():
            return
        s = self.s
        start = s.config.start_ms
        assert start is not None
        stream = s.config.stream_name
        since = start - s.config.dedup_window_ms
        settings = s.settings()
        shards = self._lineage(stream)
        began = time.monotonic()
        load = _Load(said_ms=s.clock.now_ms())
        s.log.info("prestart_reading", start=iso(start), since_ms=since, until_ms=start, shards=shards)
        if s.beyond_retention(stream, since):
            s.log.warning(
                "prestart_beyond_retention",
                since_ms=since,
                detail="part of the window before the start has expired from staging: a producer retry after the "
                "start of an event that arrived then is forwarded",
            )
        for shard in shards:
            s.retrying("read_prestart", partial(self._read, stream, shard, since, start, settings, load))
            load.shards_read += 1
        state = s.state
        assert state is not None
        s.write(replace(state, prestart_ms=start))
        s.log.info(
            "prestart_loaded",
            start=iso(start),
            ids=load.ids,
            records=load.records,
            batches=load.batches,
            shards=shards,
            seconds=round(time.monotonic() - began, 3),
        )

    def refuse_changed(self, shard_id: str, loaded_ms: int | None) -> None:
        """A ConfigError when ``shard_id`` loaded what arrived before another start than the configured one: the
        start was changed after the application began (while a lease had no KCL checkpoint yet, the next owner's
        daemon starts at the new start). Lowered, the window still holds the old load, and events between the two
        starts would be dropped as duplicates: lost; raised, what arrived in the window before the new start was
        never loaded, and a retry after it of an event between the two would be forwarded. Neither is repaired
        here: the processor stops, says why, and so does every owner until the start is set back."""
        start = self.s.config.start_ms
        if loaded_ms is None or start is None or loaded_ms == start:
            return
        raise ConfigError(
            self.s.config.path,
            EXTENDED,
            f"the start is {iso(start)} but {shard_id} loaded the events before {iso(loaded_ms)} (its state "
            f"item's prestart_ms): a start changed after the application began loses events between the two "
            f"(lowered) or forwards retries of events before the new one (raised). Set it back to "
            f"{loaded_ms // 1000}; a new start is a new application (its own applicationName and state table)",
        )

    def _lineage(self, stream: str) -> list[str]:
        """The shard, then the ancestors (nearest first) whose own history does not hold what arrived there before
        the start: one with ``prestart_ms`` holds it, and its own ancestors' too, and ``History.load`` inherits
        it with the lineage (as it does everything a parent forwarded). An ancestor ListShards no longer lists
        has expired with the staging retention, and so have its records and its own ancestors: it is left out
        (it cannot be read: a read of it fails with ShardNotListed, for ever), as ``History`` leaves it."""
        s = self.s
        listed = {shard["ShardId"] for shard in s.retrying("list_shards", partial(s.streams.shards, stream))}
        out, frontier, seen = [s.shard_id], [s.shard_id], {s.shard_id}
        while frontier:
            child = frontier.pop(0)
            ancestor = child != s.shard_id
            parents = s.retrying("list_parents", partial(s.streams.parents, stream, child, ancestor))
            for parent in parents:
                if parent in seen:
                    continue
                seen.add(parent)
                if parent not in listed:
                    s.log.info("prestart_ancestor_expired", ancestor=parent)
                    continue
                state = s.retrying("get_parent_state", partial(s.store.get, shard_key(stream, parent)))
                self.refuse_changed(parent, state.prestart_ms if state is not None else None)
                if state is None or state.prestart_ms is None:
                    out.append(parent)
                    frontier.append(parent)
        return out

    def _read(self, stream: str, shard: str, since: int, start: int, settings: PlanSettings, load: _Load) -> None:
        """One shard's records over ``[since, start)``, their IDs recorded every ``MAX_CHUNK_EVENTS``. Run again
        whole after a fault (``ShardSession.retrying``): what was recorded before it is only learned twice."""
        s = self.s
        ids: list[int] = []
        low: int | None = None
        for page in s.streams.read_arrivals(stream, shard, since, start, s.keep_lease):
            load.records += len(page)
            for part in chunks(page, MAX_CHUNK_EVENTS):
                plan = plan_batch(part, None, self._nothing, None, settings, (), start)
                if not plan.before_ids:
                    continue
                if len(ids) + len(plan.before_ids) > MAX_CHUNK_EVENTS:
                    self._record(ids, low, start, settings, load)
                    ids, low = [], None
                ids.extend(plan.before_ids)
                low = plan.arrival_min_ms if low is None else min(low, plan.arrival_min_ms)
            self._say(shard, load, len(ids))
        if ids:
            self._record(ids, low, start, settings, load)

    def _record(self, ids: list[int], low: int | None, start: int, settings: PlanSettings, load: _Load) -> None:
        """Write a batch of IDs before the start, learn them, commit it (the state item's ``batches``)."""
        s = self.s
        state = s.state
        assert state is not None and low is not None
        now = s.clock.now_ms()
        config = s.config
        retention = s.retention(config.stream_name)
        index = state.batches + 1
        batch = DigestBatch(
            index=index,
            epoch=state.epoch,
            last=NO_POSITION,
            started_ms=now,
            arrival_min_ms=low,
            arrival_max_ms=start - 1,
            settings=settings.encode(),
            before_ids=pack_digests(ids),
            expires_ms=digest_expiry_ms(
                now, start - 1, config.dedup_window_ms, retention, config.digest_ttl_hours * HOUR_MS
            ),
            clock_bound_ms=s.margins.own_bound(),
        )
        s.retrying("put_batch", lambda: s.store.put_batch(s.key, batch))
        self.history.add(ids, start - 1, (str(settings.dedup_key), settings.typed_ids))
        window = s.window.stats()
        s.write(
            replace(
                state,
                batches=index,
                window_ids=window.ids,
                window_oldest_ms=window.oldest_ms,
                window_newest_ms=window.newest_ms,
                window_cut=window.cut_short,
            )
        )
        load.ids += len(ids)
        load.batches += 1

    def _say(self, shard: str, load: _Load, waiting: int) -> None:
        """A ``prestart_progress`` line at most every ``PROGRESS_MS``: a load of a busy shard's hour takes minutes."""
        s = self.s
        now = s.clock.now_ms()
        if now - load.said_ms < PROGRESS_MS:
            return
        load.said_ms = now
        s.log.info(
            "prestart_progress",
            reading=shard,
            shards_done=load.shards_read,
            records=load.records,
            ids=load.ids + waiting,
        )
