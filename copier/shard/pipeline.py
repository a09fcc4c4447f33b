"""The chunk pipeline: a delivery cut into chunks, each planned, recorded, put and committed on its own.

Per chunk (docs/protocol.md, "Per chunk"): the stream guard first
(``copier.shard.guard``); then the plan (``copier.core.plan``: what each record
becomes, against the committed position, the window and the redo set); the
chunk's digest batch is recorded (its intent, before anything is put); the
forwarder puts it until every record landed (a record a stream's lowered
record limit refuses is re-planned by the chunk's :class:`Replanner`, its
digest batch written again first: ``copier.core.replan``); the commit writes
the new position, the redo set used up and the counters. At most ``chunk_events``
records a chunk, so no batch size reaches a DynamoDB limit. A chunk that puts
nothing is only committed, unless it holds records that arrived before the
application's start (``copier.core.startpoint``): their IDs are recorded in a
digest batch all the same, so that a later owner's window learns them too.

The plan is the live processor's (``copier.core.plan.plan_batch``: the
committed position, the window, the redo set) unless a :data:`PlanRule` is
given: a source other than the staging stream (a redrive of the dead-letter
stream, a repair of a range: ``copier.shard.source``) decides its own records
and goes through the same record, put and commit.

What may have landed twice is said before the put that may cause it
(``possible_duplicates``, one report per chunk, every ID named), so that a
crash during the put cannot hide it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from copier.core.config import DedupKey
from copier.core.errors import FatalAwsError, FencedError
from copier.core.packing import pack_digests
from copier.core.plan import BatchPlan, Outgoing, PlanSettings, Redo, SourceRecord, chunks, plan_batch
from copier.core.positions import Position
from copier.core.replan import columns, replan, rerouted_batch
from copier.core.shardmap import key_hashes
from copier.core.startpoint import NO_ARRIVAL
from copier.core.state import DigestBatch, ShardState, digest_expiry_ms
from copier.core.streamsettings import refused_limit
from copier.core.window import DedupWindow
from copier.shard.forward import Forwarder
from copier.shard.guard import StreamGuard
from copier.shard.history import History
from copier.shard.session import HOUR_MS, ShardSession

__all__ = ["ChunkPipeline", "PlanRule", "Replanner", "checkpoint"]


def checkpoint(records: Sequence[SourceRecord], last: Position, landed_ms: int) -> tuple[int | None, int | None]:
    """The replication checkpoint a commit records beside its position (``ShardState.position_arrival_ms`` and
    ``position_age_ms``): the staging arrival of the record at ``last``, and how long after it the chunk had
    landed in full (``landed_ms``, AWS time: every put answered, or nothing to put). Both None when the daemon
    gave that record no arrival time."""
    arrival = next((r.arrival_ms for r in reversed(records) if r.position == last), 0)
    if arrival <= 0:
        return None, None
    return arrival, max(0, landed_ms - arrival)


#: What a source's records become, chunk by chunk: ``(records, the state item as committed, the window, the plan
#: settings) -> BatchPlan``. Pure (``copier.core``): the same chunk planned again gives the same plan.
PlanRule = Callable[[Sequence[SourceRecord], ShardState, DedupWindow, PlanSettings], BatchPlan]


def _counts(plan: BatchPlan) -> dict[str, int]:
    """What a chunk's commit adds to the shard's counters."""
    counts = {
        "forwarded": sum(1 for o in plan.send if o.destination == "target"),
        "dead_lettered": plan.dead_lettered,
        "duplicates": plan.duplicates,
        "replays": plan.replays,
        "unkeyed": len(plan.unkeyed),
        "already_landed": plan.already_landed,
    }
    if plan.before_start:  # counted only by an application with a start (copier.core.startpoint)
        counts["before_start"] = plan.before_start
    return counts


class ChunkPipeline:
    """Forwards records chunk by chunk for the session's owner; see the module docstring."""

    def __init__(
        self,
        session: ShardSession,
        history: History,
        guard: StreamGuard,
        chunk_events: int,
        rule: PlanRule | None = None,
        replanning: bool = True,
    ) -> None:
        """``rule``: a source's own plan (None: the live processor's); ``replanning``: what a stream refuses
        over a lowered record limit is re-planned to the dead-letter stream (``Replanner``); a source whose
        records must never go there (a redrive) stalls instead, as a shard without a dead-letter stream does."""
        self.s = session
        self.history = history
        self.guard = guard
        self.chunk_events = chunk_events
        self.rule = rule
        self.replanning = replanning
        config = session.config
        self.forwarder = Forwarder(
            session.streams,
            session.clock,
            session,
            {"target": config.target_stream_name, "deadletter": config.dead_letter_stream_name or ""},
            config.put_timeout_millis,
            config.max_backoff_millis,
            ordered=config.ordering == "partitionKey",
        )

    def forward(
        self, records: Sequence[SourceRecord], behind_ms: int | None
    ) -> tuple[Position | None, list[SourceRecord]]:
        """Forward records now, chunk by chunk: the last committed position, and the records left unforwarded
        because this processor was fenced on the way."""
        committed: Position | None = None
        parts = chunks(records, self.chunk_events)
        for i, chunk in enumerate(parts):
            position = self._chunk(chunk, behind_ms)
            if self.s.fenced:
                return committed, [r for part in parts[i:] for r in part]
            if position is not None:
                committed = position
        return committed, []

    def _chunk(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        s = self.s
        hashes = key_hashes(r.partition_key for r in records)  # where each key goes: hashed once for the chunk
        scattered = self.guard.scattered(records, hashes)
        try:
            self.guard.await_streams(refresh=bool(scattered))
        except FencedError:
            s.fence("stream_settings")
            return None
        state = s.state
        assert state is not None
        settings = s.settings()
        older = self.history.older_keys()
        if self.rule is None:
            redo = self._redo(state, settings)
            plan = plan_batch(records, state.position, s.window, redo, settings, older, s.config.start_ms)
        else:
            plan = self.rule(records, state, s.window, settings)
        if plan.last is None:
            return None
        self._report(plan, older, records)
        try:
            return self._put_and_commit(plan, settings, records, scattered, behind_ms, hashes)
        except FencedError:
            s.fence("process_records")
            return None

    def _redo(self, state: ShardState, settings: PlanSettings) -> Redo | None:
        """The committed redo set, with the settings its identities were computed under (None: these; "", an
        earlier copier's, read as that copier planned: ``ShardSession.stored_settings``)."""
        if state.redo_last is None:
            return None
        stored = None
        if state.redo_settings != settings.encode():
            stored = self.s.stored_settings(state.redo_settings, "redo settings")
        return Redo(state.redo_last, state.redo_counter, stored, state.redo_suspect)

    def _report(self, plan: BatchPlan, older: Sequence[tuple[DedupKey, bool]], records: Sequence[SourceRecord]) -> None:
        log, config = self.s.log, self.s.config
        if plan.earlier_key_duplicates:  # counted with the duplicates, but they may be losses: said apart
            log.warning(
                "dropped_under_earlier_key",
                count=len(plan.earlier_key_duplicates),
                positions=[str(p) for p in plan.earlier_key_duplicates],
                dedup_key=str(config.dedup_key),
                earlier_keys=[
                    str(key) if typed else f"{key} (IDs untyped, as before typed IDs)" for key, typed in older
                ],
                detail="dropped as duplicates because their ID under an earlier dedup key was forwarded within the "
                "window: producer retries of events forwarded before the change, or, if the earlier key did not "
                'name one event, distinct events lost (docs/protocol.md, "The dedup window")',
            )
        for position, reason in plan.unkeyed:
            log.warning(
                "unkeyed_event",
                sequence_number=position.seq_str,
                sub_sequence_number=position.subseq,
                reason=reason,
                policy=config.unkeyed_policy,
            )
        for position, reason in plan.rerouted:
            log.warning(
                "rerouted",
                sequence_number=position.seq_str,
                sub_sequence_number=position.subseq,
                reason=reason,
                to="deadletter" if config.dead_letter_stream_name else "target under a replacement partition key",
            )
        unstamped = sum(1 for r in records if r.arrival_ms == NO_ARRIVAL) if config.start_ms is not None else 0
        if unstamped:
            log.warning(
                "no_arrival_time",
                records=unstamped,
                detail="delivered without an arrival time (the daemon stamps every Kinesis record): never judged "
                "before the application's start, forwarded",
            )
        if plan.before_start:
            log.info(
                "before_start",
                records=plan.before_start,
                detail="delivered although they arrived in staging before the application's start: not forwarded, "
                "their IDs kept (a lease that did not start at the start, or arrival stamps out of order)",
            )
        if plan.redo_missing:
            log.error(
                "redo_records_not_replayed",
                count=plan.redo_missing,
                detail="records a verified chunk had not put never came again: the staging stream's retention "
                "expired them, or the daemon started past them (initialPositionInStream)",
            )

    def _expires_ms(self, plan: BatchPlan, now: int) -> int:
        """When the digest batch may expire: once nothing that could still be delivered needs it.

        A duplicate of one of its events arrives within the dedup window of
        it, and is delivered at the latest when the staging stream's retention
        ends; a chunk in flight can be replayed as long as its records are
        there. So: the newest arrival, the window, the retention and an hour
        of margin, and never before ``copier.digestTtlHours`` after writing.
        A retention that cannot be read counts as the longest Kinesis allows
        (365 days): an owner gap shorter than the staging retention, whatever
        it is, must still find the batches that say what was forwarded
        (docs/protocol.md, "Digest lifetime", says why this and not a stop).
        """
        config = self.s.config
        retention = self.s.retention(config.stream_name)  # cached by the adapter; read again when it failed
        return digest_expiry_ms(
            now, plan.arrival_max_ms, config.dedup_window_ms, retention, config.digest_ttl_hours * HOUR_MS
        )

    def _record(
        self, plan: BatchPlan, settings: PlanSettings, index: int, now: int, bound: int, hashes: Mapping[str, int]
    ) -> DigestBatch:
        """The chunk's digest batch (its intent), stored before anything is put. ``now`` and ``bound``: the
        start and the clock bound read with it (``ClockMargins.start``); the larger of it and the bound now
        is kept. ``hashes``: the chunk's keys hashed (a replacement key is hashed here)."""
        s = self.s
        assert s.state is not None and plan.last is not None
        target = [o.partition_key for o in plan.send if o.destination == "target"]
        shards = s.target_shards(settings.target_stream, target, hashes) if target else ()
        redo_ids = b""
        redo_settings = ""
        if plan.redo_ids:
            redo_ids = pack_digests(plan.redo_ids[o.position] for o in plan.in_batch_order())
            # An earlier copier's "" spelled out: empty, it would read as the settings of the batch.
            redo_settings = s.state.redo_settings or s.stored_settings("", "redo settings").encode()
        batch = DigestBatch(
            index=index,
            epoch=s.state.epoch,
            last=plan.last,
            started_ms=now,
            arrival_min_ms=plan.arrival_min_ms,
            arrival_max_ms=plan.arrival_max_ms,
            target_shards=tuple(sorted(shards or ())),
            settings=settings.encode(),
            redo_ids=redo_ids,
            redo_settings=redo_settings,
            expires_ms=self._expires_ms(plan, now),
            clock_bound_ms=max(bound, s.margins.own_bound() or 0) or None,
            **columns(plan),
        )
        s.ensure_lease()
        s.retrying("put_batch", lambda: s.store.put_batch(s.key, batch))
        s.log.debug("batch_recorded", batch=index, entries=len(plan.send), last=str(plan.last))
        return batch

    def _put_and_commit(
        self,
        plan: BatchPlan,
        settings: PlanSettings,
        records: Sequence[SourceRecord],
        scattered: set[Position],
        behind_ms: int | None,
        hashes: Mapping[str, int],
    ) -> Position:
        s = self.s
        state = s.state
        assert state is not None and plan.last is not None
        index = state.batches
        now, bound = s.margins.start()
        if plan.send:
            index = state.batches + 1
            if state.redo_suspect and plan.redo_sent:  # said before the put: a crash during it must not hide it
                self.s.possible_duplicates(
                    index,
                    plan.redo_sent,
                    now,
                    "sent again after a verification that started past the target's retention: the first copy "
                    "may have landed and expired from what the verification could read",
                )
            outside = [o for o in plan.send if o.position in scattered and o.event_id is not None]
            if outside:  # said before the put, as the other reports: a crash during it must not hide it
                self.s.possible_duplicates(
                    index,
                    outside,
                    now,
                    "put on this staging shard against its partition key (RecordDistributionStrategy AUTO, now or "
                    "earlier, or an ExplicitHashKey): a copy of the same event on another shard may be forwarded too",
                )
            batch = self._record(plan, settings, index, now, bound, hashes)
            replan = Replanner(s, plan, records, batch) if self.replanning else None
            try:
                stats = self.forwarder.forward(plan.send, now - max(s.config.clock_skew_millis, bound), replan)
            except FencedError:
                self._fenced_after_putting(index, self.forwarder.attempted, now)
                raise
            s.log.debug("put_done", batch=index, entries=len(plan.send), requests=stats.requests)
        elif plan.before_ids:  # nothing to put, IDs to learn (what arrived before the start): recorded all the same
            index = state.batches + 1
            self._record(plan, settings, index, now, bound, hashes)
        read_under = (str(settings.dedup_key), settings.typed_ids)
        self.history.add(plan.keyed_digests + plan.dead_ids + plan.before_ids, plan.arrival_max_ms, read_under)
        window = s.window.stats()
        redo = plan.redo
        state = s.state
        assert state is not None
        arrival, age = checkpoint(records, plan.last, s.margins.aws_ms(s.clock.now_ms()))
        commit = replace(
            state,
            position=plan.last,
            batches=index,
            redo_last=redo.last if redo else None,
            redo_digests=tuple(sorted(redo.digests.elements())) if redo else (),
            redo_settings=(redo.settings or settings).encode() if redo else "",
            redo_suspect=redo.suspect if redo else False,
            behind_ms=behind_ms,
            window_ids=window.ids,
            window_oldest_ms=window.oldest_ms,
            window_newest_ms=window.newest_ms,
            window_cut=window.cut_short,
            window_ms=s.config.dedup_window_ms,  # what this chunk's digest batch lives by (_expires_ms)
            position_arrival_ms=arrival,
            position_age_ms=age,
            counters=state.counted(**_counts(plan)),
        )
        s.stalls.over()  # everything landed: the commit says the shard moves again
        try:
            s.write(commit)
        except FencedError:
            self._fenced_after_putting(index, plan.send, now)
            raise
        s.log.debug(
            "committed",
            batch=index,
            position=str(plan.last),
            forwarded=len(plan.send),
            duplicates=plan.duplicates,
            replays=plan.replays,
        )
        return plan.last

    def _fenced_after_putting(self, index: int, attempted: Sequence[Outgoing], started_ms: int) -> None:
        """Fenced with requests of a chunk sent: if this processor's last lease ran out meanwhile (it was frozen
        past it: the honest limit), a successor may have verified the chunk before they landed."""
        s = self.s
        assert s.state is not None
        # A clock stepped back reads the lease as longer than it was: its measured bound makes up for it.
        if attempted and s.clock.now_ms() + (s.margins.own_bound() or 0) > s.state.lease_until_ms:
            self.s.possible_duplicates(
                index,
                attempted,
                started_ms,
                "the lease ran out during the put; a successor may have verified the batch before it landed",
            )


class Replanner:
    """A chunk's :data:`~copier.shard.forward.Replan`: the entries a stream refused as final, re-planned under the
    record limits read again (``copier.core.replan``), the chunk's digest batch rewritten before any of them is
    put. Its plan is changed in place, so that the commit counts, and the window learns, what was sent."""

    def __init__(self, session: ShardSession, plan: BatchPlan, records: Sequence[SourceRecord], batch: DigestBatch):
        self.s = session
        self.plan = plan
        self.records = {r.position: r for r in records}
        self.batch = batch
        self.asked: set[str] = set()  # destinations whose limits were read now for this chunk

    def __call__(self, destination: str, refused: list[Outgoing], refusal: FatalAwsError) -> dict[Position, Outgoing]:
        s, plan = self.s, self.plan
        # The record limits now: one may have been lowered since the cached answer. Read at once the first time
        # (one DescribeStreamSummary a chunk), then no more often than the adapter's cache allows: a shard that
        # stalls (no dead-letter stream) must not spend the account's 20 calls a second.
        now = destination not in self.asked
        self.asked.add(destination)
        settings = s.settings(refresh=True, now=now)
        # The refusal names the limit it applied. When the stream's limit cannot be read now (DescribeStreamSummary
        # throttled or denied: the chunk may have been planned under 10 MiB, or under a limit lowered since), that
        # is the stream's word on it, so the shard never waits on the control-plane call. A limit read now wins:
        # raised again since the refusal, the record goes as planned.
        named = refused_limit(refusal.code, refusal.message)
        unread = s.config.target_stream_name if destination == "target" else s.config.dead_letter_stream_name
        if named is not None and unread in s.unread:
            if destination == "target" and named < settings.max_record_bytes:
                settings = replace(settings, max_record_bytes=named)
            elif destination == "deadletter" and named < settings.dead_letter_max_bytes:
                settings = replace(settings, dead_letter_max_bytes=named)
        changes = replan(refused, self.records, settings)
        if not changes:
            return changes
        before = plan.in_batch_order()
        plan.reroute(changes)
        batch = rerouted_batch(self.batch, before, plan, settings)
        s.ensure_lease()  # a put, as far as a successor is concerned: within the lease it verifies after
        s.retrying("put_batch", lambda: s.store.put_batch(s.key, batch))
        self.batch = batch
        limits = {"target": settings.max_record_bytes, "deadletter": settings.dead_letter_max_bytes}
        s.log.warning(
            "replanned",
            batch=batch.index,
            revision=batch.revision,
            stream=destination,
            entries=len(changes),
            limit_bytes=limits[destination],
            detail="the stream refused records over its record limit, lowered since the chunk was planned: they go "
            "to the dead-letter stream instead (an envelope it refuses keeps the payload's SHA-256 instead of the "
            "payload), recorded in the chunk's digest batch before they are put",
        )
        for position in sorted(changes):
            s.log.warning(
                "rerouted",
                sequence_number=position.seq_str,
                sub_sequence_number=position.subseq,
                reason=f"refused by {destination}: record over its limit of {limits[destination]} bytes",
                to="deadletter",
            )
        return changes
