"""One staging shard's protocol: takeover, then per chunk plan, record, put, commit (docs/protocol.md).

This is where the I/O of one shard is sequenced; every decision is made by
the pure modules it calls (``plan``, ``recovery``, ``window``). The public
methods map one to one onto the KCL record processor's calls and return
what the processor must checkpoint.

Ownership, in short: a processor owns a shard from a successful takeover
(epoch + 1, conditioned on the item being unchanged) until one of its
conditional writes fails. It puts only while its lease outlives the put,
renewing the lease with every write. A successor that finds a valid lease
announces itself (so the owner's next write fails and it yields), sleeps
out the lease plus the clock margin, and only then takes over and verifies
any batch left in flight.

A batch from the daemon is cut into chunks of at most ``MAX_CHUNK_EVENTS``
records, each recorded (its digest batch, the intent), put and committed on
its own, so no batch size reaches a DynamoDB limit. Faults are retried
here for as long as they last; a fault AWS reports as final for this
shard's request stalls this shard alone (logged as ``shard_stalled``), and
only a host-wide one (a missing table or stream, denied access) leaves as
an exception, which ends the process.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import structlog

from copier.config import Config
from copier.errors import AwsError, FatalAwsError, FencedBacklogError, FencedError, TransientAwsError
from copier.forward import Forwarder
from copier.identity import content_digest, identity_of
from copier.limits import MAX_CHUNK_EVENTS
from copier.metrics import MetricsEmitter, ShardMetrics
from copier.packing import digest_columns, pack_digests, unpack_digests
from copier.plan import BatchPlan, Outgoing, PlanSettings, Redo, SourceRecord, chunks, plan_batch
from copier.ports import Clock, Found, Identity, Streams
from copier.positions import Position
from copier.recovery import earlier_copies, resolve
from copier.retry import backoff_ms
from copier.shardmap import shard_number
from copier.state import DigestBatch, ShardState, StateConflict, StateStore, shard_key
from copier.window import DedupWindow

__all__ = ["ShardWorker", "SystemClock", "worker_id"]

T = TypeVar("T")

RECENT_CHUNKS = 64  # committed chunks remembered for discounting identical unkeyed copies (copier.recovery)
MAX_HELD_RECORDS = 200_000  # records a fenced processor holds before it gives up (the process exits)


class SystemClock:
    """Wall-clock time (leases are compared across hosts, so not monotonic)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sleep_ms(self, ms: int) -> None:
        if ms > 0:
            time.sleep(ms / 1000)


def worker_id() -> str:
    """host:pid:random, unique per processor process."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class ShardWorker:
    """Forwards one shard's records exactly once; one instance per record processor."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        streams: Streams,
        clock: Clock | None = None,
        owner: str | None = None,
        log: Any = None,
        chunk_events: int = MAX_CHUNK_EVENTS,
        metrics: MetricsEmitter | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.streams = streams
        self.clock = clock or SystemClock()
        self.owner = owner or worker_id()
        self.log = log or structlog.get_logger("copier")
        self.chunk_events = chunk_events
        self.emitter = metrics
        self.metrics = ShardMetrics(last_emit_ms=self.clock.now_ms())
        self.shard_id = ""
        self.key = ""
        self.state: ShardState | None = None
        self.window = DedupWindow(config.dedup_window_ms, config.dedup_window_max_events)
        self.fenced = False
        self._held: list[SourceRecord] = []  # delivered since this processor's last commit while it is fenced
        self._waiting: list[SourceRecord] = []  # small deliveries waiting to be forwarded together
        self._waiting_since = 0
        self._cut_reported = False
        self._recent: deque[tuple[int, list[int]]] = deque(maxlen=RECENT_CHUNKS)  # (started, unkeyed), newest last
        self.forwarder = Forwarder(
            streams,
            self.clock,
            {"target": config.target_stream_name, "deadletter": config.dead_letter_stream_name or ""},
            self._ensure_lease,
            self._identity_for,
            self._shards_of,
            self._retrying,
            config.put_timeout_millis,
            config.clock_skew_millis,
            config.max_backoff_millis,
            on_retry=self._on_put_retry,
            on_request=self._on_put_request,
            on_stall=lambda error, attempt: self._on_stall("PutRecords", error, attempt),
            discount=lambda started: earlier_copies(started, config.clock_skew_millis, reversed(self._recent)),
            ordered=config.ordering == "partitionKey",
        )

    # -- helpers -------------------------------------------------------------

    def _identity_for(self, destination: str) -> Identity:
        if destination == "deadletter":
            return content_digest
        return lambda pk, data: identity_of(self.config.dedup_key, pk, data)

    def _shards_of(self, destination: str, entries: Sequence[Outgoing]) -> Collection[int] | None:
        """Numbers of the target shards the entries hash to; None (read them all) when unknown or all.

        Each distinct partition key is hashed once, and hashing stops as soon
        as every open shard is covered: a chunk of random keys on a target of
        few shards costs a handful of hashes, not one per record.
        """
        if destination != "target":
            return None
        shard_map = self._retrying("list_target_shards", lambda: self.streams.shard_map(self.config.target_stream_name))
        total = len(shard_map.ranges)
        numbers: set[int] = set()
        for partition_key in dict.fromkeys(entry.partition_key for entry in entries):
            shard = shard_map.shard_for(partition_key)
            if shard is None:
                return None  # mid-reshard: no open shard covers the key
            numbers.add(shard_number(shard))
            if len(numbers) == total:
                return None  # every shard: the same as no bound
        return numbers

    def _on_put_request(self, stream: str, entries: int, failed: int, millis: float | None) -> None:
        self.metrics.saw_put(millis)
        self.log.debug("put_request", stream=stream, entries=entries, failed=failed, millis=millis)

    def _on_put_retry(self, code: str, entries: int, attempt: int) -> None:
        self.metrics.put_retries[code] += entries
        log = self.log.warning if attempt >= 3 else self.log.info
        log("put_retry", code=code, entries=entries, attempt=attempt)

    def _on_stall(self, call: str, error: FatalAwsError, attempt: int) -> None:
        self.metrics.stalled = True
        self._emit()
        self.log.error(
            "shard_stalled",
            call=call,
            code=error.code,
            error=str(error),
            attempt=attempt,
            detail="AWS rejects this shard's request; retrying every copier.maxBackoffMillis, nothing is skipped",
        )

    def _settings(self) -> PlanSettings:
        return PlanSettings(
            dedup_key=self.config.dedup_key,
            unkeyed_policy=self.config.unkeyed_policy,
            dead_letter=self.config.dead_letter_stream_name is not None,
            stream_name=self.config.stream_name,
            shard_id=self.shard_id,
        )

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        """Run a call until it succeeds; a host-wide fatal error, FencedError and StateConflict go up.

        Transient errors are retried with jittered backoff; a fatal error that
        is not host-wide stalls this shard (retried at the longest backoff,
        logged each time) rather than ending a process that serves other shards.
        """
        attempt = 0
        while True:
            try:
                return fn()
            except TransientAwsError as exc:
                level = self.log.warning if attempt >= 3 else self.log.info
                level("retrying", call=what, code=exc.code, attempt=attempt)
                self.clock.sleep_ms(backoff_ms(attempt, self.config.max_backoff_millis))
            except FatalAwsError as exc:
                if exc.host_wide:
                    raise
                self._on_stall(what, exc, attempt)
                self.clock.sleep_ms(self.config.max_backoff_millis)
            attempt += 1

    def _write(self, new: ShardState) -> ShardState:
        """Write as owner; on success the new state is ours. FencedError goes up."""
        owner = self.state
        assert owner is not None
        now = self.clock.now_ms()
        lease = max(now + self.config.lease_millis, owner.lease_until_ms)
        new = replace(new, version=owner.version + 1, lease_until_ms=lease, updated_ms=now)
        self._retrying("write_state", lambda: self.store.write(self.key, owner, new))
        self.state = new
        return new

    def _ensure_lease(self) -> None:
        """Before a put: renew the lease unless it outlives the put with margin to spare."""
        assert self.state is not None
        need = self.config.put_timeout_millis + self.config.clock_skew_millis
        if self.clock.now_ms() + need < self.state.lease_until_ms:
            return
        self._write(self.state)

    def _fence(self, where: str) -> None:
        self.fenced = True
        self.log.warning(
            "fenced",
            where=where,
            detail="another processor took the shard over; forwarding stops, and what the daemon delivers is held "
            "until that owner's lease runs out or this processor's lease is lost",
        )

    def lose_lease(self) -> None:
        """The daemon says another worker has the shard: stop, and drop what is held (it is replayed there)."""
        self.fenced = True
        self._held = []
        self._waiting = []

    # -- initialize ------------------------------------------------------------

    def initialize(self, shard_id: str) -> None:
        """Take the shard over (after sleeping out a valid lease), verify a batch in flight, load the window."""
        self.shard_id = shard_id
        self.key = shard_key(self.config.stream_name, shard_id)
        self.log = self.log.bind(shard=shard_id)
        seen = self._take_over()
        assert self.state is not None
        self.log = self.log.bind(epoch=self.state.epoch)
        self.log.info(
            "took_over",
            previous_owner=seen.owner if seen else None,
            previous_epoch=seen.epoch if seen else None,
            position=str(self.state.position) if self.state.position else None,
            batches=self.state.batches,
        )
        in_flight = self._retrying("get_batch", lambda: self.store.get_batch(self.key, self.state.batches + 1))  # type: ignore[union-attr]
        if in_flight is not None:
            self._verify(in_flight, seen)
        newest = self._retrying("get_batches", lambda: self._chunks_before(self.clock.now_ms()))
        self._recent.extend(reversed(newest))
        self._load_window()

    def _chunks_before(self, started_ms: int) -> list[tuple[int, list[int]]]:
        """(started, unkeyed digests) of the newest committed chunks a verification from ``started_ms`` may read.

        Read a few at a time and only as far back as ``copier.recovery.earlier_copies`` looks.
        """
        assert self.state is not None
        out: list[tuple[int, list[int]]] = []
        newer = started_ms
        for batch in self.store.batches(self.key, self.state.batches, page_size=4):
            if newer < started_ms - 2 * self.config.clock_skew_millis:
                break
            out.append((batch.started_ms, unpack_digests(batch.unkeyed)))
            newer = batch.started_ms
        return out

    def _take_over(self) -> ShardState | None:
        skew = self.config.clock_skew_millis
        waited_for: int | None = None
        while True:
            seen: ShardState | None = self._retrying("get_state", lambda: self.store.get(self.key))
            now = self.clock.now_ms()
            held = seen is not None and seen.owner not in (None, self.owner) and seen.lease_until_ms + skew > now
            if seen is not None and held and waited_for != seen.epoch:
                if seen.successor != self.owner:
                    try:
                        announced = replace(seen, successor=self.owner, version=seen.version + 1)
                        self._retrying("announce", lambda: self.store.replace_if_unchanged(self.key, seen, announced))
                    except StateConflict:
                        continue
                    seen = announced
                wait = seen.lease_until_ms + skew - now
                self.log.info("waiting_for_lease", owner=seen.owner, epoch=seen.epoch, wait_ms=wait)
                self.clock.sleep_ms(wait)
                waited_for = seen.epoch
                continue
            base = seen or ShardState()
            new = replace(
                base,
                epoch=base.epoch + 1,
                version=base.version + 1,
                owner=self.owner,
                successor=None,
                lease_until_ms=now + self.config.lease_millis,
                updated_ms=now,
            )
            try:
                self._retrying("take_over", lambda: self.store.replace_if_unchanged(self.key, seen, new))
            except StateConflict:
                current = self._retrying("get_state", lambda: self.store.get(self.key))
                if current is not None and current.owner == self.owner and current.epoch == new.epoch:
                    self.state = current  # our own write went through before an ambiguous failure
                    return seen
                waited_for = None
                continue
            self.state = new
            return seen

    def _verify(self, batch: DigestBatch, seen: ShardState | None) -> None:
        """Find out which records of a batch left in flight landed (see copier.recovery); commit it.

        Bounded read: only the target shards the batch's entries hash to (and
        their descendants), and only from the batch's start (minus the clock
        margin) to the end of the last lease its writer could have held, plus
        the put timeout and the margin. After that no put of it can land.
        """
        state = self.state
        assert state is not None
        skew, timeout = self.config.clock_skew_millis, self.config.put_timeout_millis
        since = batch.started_ms - skew
        lease_end = max(seen.lease_until_ms if seen else 0, batch.started_ms + self.config.lease_millis)
        until = lease_end + timeout + skew
        found_target = Found()
        if batch.keyed or batch.unkeyed:
            shards = batch.target_shards or None
            identity = self._identity_for("target")
            target = self.config.target_stream_name
            found_target = self._retrying(
                "verify_target", lambda: self.streams.read_identities(target, shards, since, until, identity)
            )
        found_dlq = Found()
        dlq = self.config.dead_letter_stream_name
        if batch.deadletter and dlq:
            found_dlq = self._retrying(
                "verify_deadletter", lambda: self.streams.read_identities(dlq, None, since, until, content_digest)
            )
        before = self._retrying("get_batches", lambda: self._chunks_before(batch.started_ms))
        earlier = earlier_copies(batch.started_ms, skew, before)
        found = found_target.identities - earlier
        result = resolve(batch, found, found_dlq.identities, state.redo_last, state.redo_digests)
        self.log.info(
            "verified_pending",
            batch=batch.index,
            batch_epoch=batch.epoch,
            landed=result.landed,
            to_redo=result.missing,
            redo_until=str(result.redo_last),
            records_read=found_target.records_read + found_dlq.records_read,
            shards_read=found_target.shards_read + found_dlq.shards_read,
            read_from_ms=since,
            read_until_ms=until,
        )
        verified = replace(state, batches=batch.index, redo_last=result.redo_last, redo_digests=result.redo_digests)
        self._write(verified.with_counts(already_landed=result.landed))

    def _reaches_back(self, batches: Sequence[DigestBatch], newest_ms: int) -> bool:
        """Do these batches (newest first) already cover the horizon behind ``newest_ms``?"""
        return bool(batches) and batches[-1].arrival_min_ms <= newest_ms - self.config.dedup_window_ms

    def _newest_first(self, key: str, upto: int) -> Iterator[DigestBatch]:
        return iter(self._retrying("load_window", lambda: list(self._lazy(key, upto))))

    def _lazy(self, key: str, upto: int) -> Iterator[DigestBatch]:
        """The committed batches newest first, read until the window's horizon or cap is reached."""
        cap = self.config.dedup_window_max_events
        taken = 0
        newest: int | None = None
        for batch in self.store.batches(key, upto):
            if newest is None:
                newest = batch.arrival_max_ms
            if taken >= cap or batch.arrival_max_ms < newest - self.config.dedup_window_ms:
                return
            taken += batch.keyed_count
            yield batch

    def _load_window(self) -> None:
        """Rebuild the window from the committed batches: the shard's own, and its ancestors' within the horizon.

        A shard's digest batches hold only what it forwarded itself, and within
        one horizon a shard can be split and merged more than once. So the
        lineage is walked from parents to grandparents, on from every ancestor
        whose own history does not reach back as far as the horizon (chaos seed
        6 found a duplicate on the merged grandchild of the shard that had
        forwarded the original).
        """
        assert self.state is not None
        if not self.window.enabled:
            return
        started = time.monotonic()
        stream = self.config.stream_name
        own = list(self._newest_first(self.key, self.state.batches))
        newest = max([self.state.window_newest_ms] + [b.arrival_max_ms for b in own[:1]])
        inherited: list[DigestBatch] = []
        ancestors: list[str] = []
        frontier = [] if self._reaches_back(own, newest) else [self.shard_id]
        seen = {self.shard_id}
        while frontier:
            child = frontier.pop(0)
            parents = self._retrying("list_parents", lambda: self.streams.parents(stream, child))
            for parent in parents:
                if parent in seen:
                    continue
                seen.add(parent)
                ancestors.append(parent)
                key = shard_key(stream, parent)
                parent_state = self._retrying("get_parent_state", lambda: self.store.get(key))
                batches = list(self._newest_first(key, parent_state.batches)) if parent_state else []
                newest = max([newest, parent_state.window_newest_ms if parent_state else 0])
                newest = max([newest] + [b.arrival_max_ms for b in batches[:1]])
                inherited.extend(batches)
                if not self._reaches_back(batches, newest):
                    frontier.append(parent)
        everything = own + inherited
        self.window.advance(newest)
        self.window.reserve(sum(b.keyed_count for b in everything))
        for batch in sorted(everything, key=lambda b: b.arrival_max_ms):
            low, high = digest_columns(batch.keyed)
            self.window.add_columns(low, high, batch.arrival_max_ms)
        stats = self.window.stats()
        self.log.info(
            "window_loaded",
            ids=stats.ids,
            batches=len(own),
            parents=ancestors,
            parent_batches=len(inherited),
            oldest_ms=stats.oldest_ms,
            newest_ms=stats.newest_ms,
            cut_short=stats.cut_short,
            memory_bytes=stats.memory_bytes,
            seconds=round(time.monotonic() - started, 3),
        )

    # -- records -----------------------------------------------------------------

    def _emit(self, now: bool = False) -> None:
        """Send this interval's metrics if one has passed (or ``now``); nothing when metrics are off."""
        if self.emitter is None or self.state is None:
            return
        at = self.clock.now_ms()
        if not now and not self.metrics.due(at, self.config.metrics_interval_seconds):
            return
        window = self.window.stats()
        span_s = (window.newest_ms - window.oldest_ms) / 1000 if window.ids else 0.0
        values = self.metrics.take(self.state.counters, window.ids, span_s, at)
        self.emitter.emit(self.shard_id, values, self.metrics.take_retries())

    def process(self, records: Sequence[SourceRecord], behind_ms: int | None = None) -> Position | None:
        """:meth:`_process`, then this interval's metrics if it has passed."""
        self.metrics.saw_behind(behind_ms)
        try:
            return self._process(records, behind_ms)
        finally:
            self._emit()

    def _process(self, records: Sequence[SourceRecord], behind_ms: int | None = None) -> Position | None:
        """Forward a batch, chunk by chunk; return the committed position, or None if fenced or nothing moved.

        ``behind_ms`` is the daemon's millisBehindLatest for the batch, kept
        in the state item for ``copier status``.

        Small deliveries wait to be forwarded together (``copier.coalesceEvents``,
        ``copier.coalesceMillis``), which saves two state writes a delivery: a
        waiting record is acknowledged to the daemon but not committed, so the
        KCL checkpoint never passes it and a crash replays it.

        Fenced, a processor holds what it is given (see :meth:`_take_back`):
        the daemon may keep delivering to it when the KCL's lease and copier's
        ownership disagree (two workers both believed they had the shard for
        a moment, and the one that took copier's lease then lost the KCL's).
        """
        if self.state is None:
            return None
        if self.fenced:
            records, self._waiting = self._waiting + list(records), []
            return self._while_fenced(records, behind_ms)
        if self.config.coalescing:
            now = self.clock.now_ms()
            if records and not self._waiting:
                self._waiting_since = now
            self._waiting.extend(records)
            due = now - self._waiting_since >= self.config.coalesce_millis
            if not self._waiting or (len(self._waiting) < self.config.coalesce_events and not due):
                return None
            records, self._waiting = self._waiting, []
        return self._forward(records, behind_ms)

    def flush(self, behind_ms: int | None = None) -> Position | None:
        """Forward whatever small deliveries are waiting (before a shutdown or a shard's end)."""
        records, self._waiting = self._waiting, []
        if not records or self.state is None:
            return None
        if self.fenced:
            return self._while_fenced(records, behind_ms)
        return self._forward(records, behind_ms)

    def _forward(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        """Forward records now, chunk by chunk (see :meth:`process`)."""
        committed: Position | None = None
        parts = chunks(records, self.chunk_events)
        for i, chunk in enumerate(parts):
            position = self._process_chunk(chunk, behind_ms)
            if self.fenced:  # this chunk and the rest are not committed by this processor: hold them
                return self._while_fenced([r for part in parts[i:] for r in part], behind_ms)
            if position is not None:
                committed = position
        return committed

    def _while_fenced(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        self._held.extend(records)
        if len(self._held) > MAX_HELD_RECORDS:
            raise FencedBacklogError(
                f"{self.shard_id}: fenced with {len(self._held)} records delivered and no way to forward them; "
                "exiting so that the daemon restarts and replays them from its checkpoint"
            )
        return self._take_back(behind_ms)

    def _take_back(self, behind_ms: int | None) -> Position | None:
        """Take the shard back once the owner that fenced this processor is gone; then forward what is held.

        The other owner is gone when its lease has run out (an announced
        successor gets one more lease period to take over first). Taking
        back is a takeover like any other: epoch + 1 conditioned on the
        version read, a chunk left in flight verified, the window reloaded.
        What is held follows this processor's last commit without a gap, and
        the committed position is at or past that commit, so planning the
        held records from it forwards each of them exactly once.
        """
        assert self.state is not None
        seen = self._retrying("get_state", lambda: self.store.get(self.key))
        return self._take_back_from(seen, behind_ms)

    def _other_owner_gone_ms(self, seen: ShardState) -> int:
        """When the owner that fenced this processor is gone: its lease, the clock margin, and for an announced
        successor one more lease period to take over first."""
        return seen.lease_until_ms + self.config.clock_skew_millis + (self.config.lease_millis if seen.successor else 0)

    def _take_back_from(self, seen: ShardState | None, behind_ms: int | None) -> Position | None:
        now = self.clock.now_ms()
        if seen is None or self._other_owner_gone_ms(seen) > now:
            return None  # the other owner (or an announced successor) may still be at work
        new = replace(
            seen,
            epoch=seen.epoch + 1,
            version=seen.version + 1,
            owner=self.owner,
            successor=None,
            lease_until_ms=now + self.config.lease_millis,
            updated_ms=now,
        )
        try:
            self._retrying("take_back", lambda: self.store.replace_if_unchanged(self.key, seen, new))
        except StateConflict:
            return None
        self.state = new
        self.fenced = False
        self.log = self.log.bind(epoch=new.epoch)
        self.log.info("took_back", previous_owner=seen.owner, previous_epoch=seen.epoch, held=len(self._held))
        in_flight = self._retrying("get_batch", lambda: self.store.get_batch(self.key, new.batches + 1))
        if in_flight is not None:
            self._verify(in_flight, seen)
        self._recent.clear()
        self._recent.extend(reversed(self._retrying("get_batches", lambda: self._chunks_before(self.clock.now_ms()))))
        self.window = DedupWindow(self.config.dedup_window_ms, self.config.dedup_window_max_events)
        self._load_window()
        held, self._held = self._held, []
        return self._forward(held, behind_ms)

    def _process_chunk(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        state = self.state
        assert state is not None
        self.window.advance(max(r.arrival_ms for r in records))
        redo = Redo(state.redo_last, state.redo_counter) if state.redo_last is not None else None
        plan = plan_batch(records, state.position, self.window, redo, self._settings())
        if plan.last is None:
            return None
        self._report(plan)
        try:
            return self._forward_and_commit(plan, behind_ms)
        except FencedError:
            self._fence("process_records")
            return None

    def _report(self, plan: BatchPlan) -> None:
        for position, reason in plan.unkeyed:
            self.log.warning(
                "unkeyed_event",
                sequence_number=position.seq_str,
                sub_sequence_number=position.subseq,
                reason=reason,
                policy=self.config.unkeyed_policy,
            )
        if plan.redo_missing:
            self.log.error("redo_records_not_replayed", count=plan.redo_missing)

    def _record(self, plan: BatchPlan, index: int, now: int) -> DigestBatch:
        """The chunk's digest batch (its intent), stored before anything is put."""
        assert self.state is not None and plan.last is not None
        target = [o for o in plan.send if o.destination == "target"]
        shards = self._shards_of("target", target) if target else ()
        batch = DigestBatch(
            index=index,
            epoch=self.state.epoch,
            last=plan.last,
            started_ms=now,
            keyed=pack_digests(plan.keyed_digests),
            unkeyed=pack_digests(plan.unkeyed_digests),
            deadletter=pack_digests(plan.deadletter_digests),
            arrival_min_ms=plan.arrival_min_ms,
            arrival_max_ms=plan.arrival_max_ms,
            target_shards=tuple(sorted(shards or ())),
        )
        self._ensure_lease()
        self._retrying("put_batch", lambda: self.store.put_batch(self.key, batch))
        self.log.debug("batch_recorded", batch=index, entries=len(plan.send), last=str(plan.last))
        return batch

    def _forward_and_commit(self, plan: BatchPlan, behind_ms: int | None) -> Position:
        state = self.state
        assert state is not None and plan.last is not None
        index = state.batches
        now = self.clock.now_ms()
        if plan.send:
            index = state.batches + 1
            self._record(plan, index, now)
            stats = self.forwarder.forward(plan.send, now)
            self.log.debug("put_done", batch=index, entries=len(plan.send), requests=stats.requests)
        self.window.add(plan.keyed_digests, plan.arrival_max_ms)
        window = self.window.stats()
        if window.cut_short and not self._cut_reported:
            self.log.warning(
                "window_cut_short",
                ids=window.ids,
                oldest_ms=window.oldest_ms,
                newest_ms=window.newest_ms,
                detail="copier.dedupWindowMaxEvents keeps the window shorter than copier.dedupWindowSeconds",
            )
        self._cut_reported = window.cut_short
        redo_last = plan.redo.last if plan.redo else None
        redo_digests = tuple(sorted(plan.redo.digests.elements())) if plan.redo else ()
        state = self.state
        assert state is not None
        commit = replace(
            state,
            position=plan.last,
            batches=index,
            redo_last=redo_last,
            redo_digests=redo_digests,
            behind_ms=behind_ms,
            window_ids=window.ids,
            window_oldest_ms=window.oldest_ms,
            window_newest_ms=window.newest_ms,
            window_cut=window.cut_short,
        ).with_counts(
            forwarded=sum(1 for o in plan.send if o.destination == "target"),
            dead_lettered=plan.dead_lettered,
            duplicates=plan.duplicates,
            replays=plan.replays,
            unkeyed=len(plan.unkeyed),
            already_landed=plan.already_landed,
        )
        lease_end = state.lease_until_ms
        try:
            self._write(commit)
        except FencedError:
            if plan.send and self.clock.now_ms() > lease_end:
                self.metrics.possible_duplicates += len(plan.send)
                self._emit(now=True)
                self.log.error(
                    "possible_duplicates",
                    batch=index,
                    count=len(plan.send),
                    event_ids=[o.event_id for o in plan.send if o.event_id is not None],
                    detail="the lease ran out during the put; a successor may have verified the batch before it landed",
                )
            raise
        self.metrics.stalled = False
        if plan.send:
            self._recent.append((now, plan.unkeyed_digests))
        self.log.debug(
            "committed",
            batch=index,
            position=str(plan.last),
            forwarded=len(plan.send),
            duplicates=plan.duplicates,
            replays=plan.replays,
        )
        return plan.last

    # -- endings -------------------------------------------------------------------

    def end_shard(self) -> bool:
        """Mark the shard closed; True if the caller may checkpoint SHARD_END.

        The daemon asks once: KCL 3.1.3 measured, a processor that answers
        ``shard_ended`` without a checkpoint has exited, and the daemon then
        retries only its own end-of-shard check, once a second, holding the
        lease with no processor behind it, forever (chaos seed 36). So a fenced
        processor does not return until the shard is done: it waits until the
        owner that fenced it has closed the shard (everything forwarded: the
        checkpoint is due) or is gone (then it takes the shard back, forwards
        what it holds and closes the shard itself).
        """
        self.flush()
        if self.state is None:
            return False
        while True:
            if self.fenced and self._closed_by_other_owner():
                return True
            try:  # as its owner (taken back if it was fenced)
                self._write(replace(self.state, closed=True))
            except FencedError:
                self._fence("shard_ended")
                continue
            break
        self.log.info("shard_ended", position=str(self.state.position))
        self._emit(now=True)
        return True

    def _closed_by_other_owner(self) -> bool:
        """Fenced at the shard's end: True once the other owner has closed the shard, False once this processor
        has taken it back (and forwarded what it held); in between, sleep until the other owner's lease is over.

        The other owner either keeps its lease because it is at work, and then
        it reaches the end and closes the shard, or it is gone, and then its
        lease runs out. (If the daemon has moved this lease meanwhile, the
        checkpoint that follows fails harmlessly.)
        """
        waiting_for: tuple[str | None, int] | None = None
        while True:
            seen = self._retrying("get_state", lambda: self.store.get(self.key))
            if seen is not None and seen.closed:
                self.log.info("shard_ended_by_other_owner", owner=seen.owner, epoch=seen.epoch, held=len(self._held))
                self._held = []
                return True
            self._take_back_from(seen, None)
            if not self.fenced:
                return False
            wait = self.config.lease_millis
            if seen is not None:
                wait = min(max(self._other_owner_gone_ms(seen) - self.clock.now_ms(), 100), wait)
                if waiting_for != (seen.owner, seen.epoch):
                    waiting_for = (seen.owner, seen.epoch)
                    self.log.info("waiting_to_end_shard", owner=seen.owner, epoch=seen.epoch, held=len(self._held))
            self.clock.sleep_ms(wait)

    def release(self, retry: bool = True) -> Position | None:
        """On a requested shutdown: give the lease up so a successor need not sleep; return the position.

        ``retry=False`` when the process is on its way out (the daemon is
        gone): one attempt, and a failure only costs the successor the wait.
        """
        if self.fenced or self.state is None or self.state.lease_until_ms == 0:
            return None
        owner = self.state
        position = owner.position
        released = replace(owner, lease_until_ms=0, version=owner.version + 1)
        try:
            if retry:
                self._retrying("release", lambda: self.store.write(self.key, owner, released))
            else:
                self.store.write(self.key, owner, released)
        except FencedError:
            self._fence("shutdown_requested")
            return None
        except AwsError as exc:
            if retry:
                raise
            self.log.warning("release_failed", error=str(exc), detail="the next owner sleeps out the lease")
            return None
        self._emit(now=True)
        self.state = released
        self.log.info("released", position=str(position) if position else None)
        return position
