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
an exception, which ends the process; a fence, wherever it comes (while
verifying a chunk in flight too), never does.

Clocks: every lease comparison between two hosts allows
``copier.clockSkewMillis``, widened to what the two hosts' measured bounds
against AWS time (``copier.clockcheck``, written into every state write)
say their clocks can differ by.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import structlog

from copier.clockcheck import ClockBounds
from copier.config import Config, DedupKey, parse_dedup_key
from copier.errors import AwsError, FatalAwsError, FencedError, IncompatibleStateError, TransientAwsError
from copier.forward import Forwarder
from copier.identity import content_digest, identity_of
from copier.limits import MAX_CHUNK_EVENTS, MAX_RECORD_BYTES
from copier.metrics import MetricsEmitter, ShardMetrics
from copier.packing import digest_columns, pack_digests
from copier.plan import BatchPlan, Outgoing, PlanSettings, Redo, SourceRecord, chunks, plan_batch
from copier.ports import Clock, Found, Identity, Streams
from copier.positions import Position
from copier.recovery import resolve
from copier.retry import backoff_ms
from copier.shardmap import hash_key, shards_covering
from copier.state import DigestBatch, ShardState, StateConflict, StateStore, shard_key
from copier.streamsettings import blocking
from copier.window import DedupWindow

__all__ = ["ShardWorker", "SystemClock", "worker_id"]

T = TypeVar("T")

MAX_HELD_RECORDS = 200_000  # records a fenced processor holds in memory; past it, it reads them again later
MAX_HELD_BYTES = 64 * 1024 * 1024  # and their bytes
HOUR_MS = 3_600_000
MIN_RETENTION_MS = 24 * HOUR_MS  # Kinesis keeps records at least this long
RETENTION_SLACK_MS = 5 * 60_000  # a read starting this close to the trim horizon may miss what expires under it


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
        clock_bounds: ClockBounds | None = None,
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
        self.clock_bounds = clock_bounds
        self.fenced = False
        self._held: list[SourceRecord] = []  # delivered since this processor's last commit while it is fenced
        self._held_bytes = 0
        self._gap: tuple[Position, Position] | None = None  # held records dropped past the cap: read them again
        self._waiting: list[SourceRecord] = []  # small deliveries waiting to be forwarded together
        self._waiting_since = 0
        self._cut_reported = False
        self._widened = 0  # the last widened clock margin logged
        # (dedup key, typed IDs) the window's IDs were read under -> their newest arrival
        self._keys: dict[tuple[str, bool], int] = {}
        self._retention_unknown: set[str] = set()  # streams whose retention could not be read (said once)
        self._range: tuple[int, int] | None = None  # this staging shard's hash key range (see _scattered)
        self._scattered_now: set[Position] = set()  # the chunk's records outside it
        self._blocked = False  # forwarding stopped by a stream setting (see _await_streams)
        self.forwarder = Forwarder(
            streams,
            self.clock,
            {"target": config.target_stream_name, "deadletter": config.dead_letter_stream_name or ""},
            self._ensure_lease,
            self._identity_for,
            self._retrying,
            config.put_timeout_millis,
            config.max_backoff_millis,
            on_retry=self._on_put_retry,
            on_request=self._on_put_request,
            on_stall=lambda error, attempt: self._on_stall("PutRecords", error, attempt),
            ordered=config.ordering == "partitionKey",
        )

    # -- helpers -------------------------------------------------------------

    def _identity_for(self, destination: str) -> Identity:
        if destination == "deadletter":
            return content_digest
        return lambda pk, data: identity_of(self.config.dedup_key, pk, data)

    def _target_shards(self, stream: str, partition_keys: Iterable[str]) -> set[int] | None:
        """Numbers of the target shards these keys go to (from a map taken now, before the put)."""
        shard_map = self._retrying("list_target_shards", lambda: self.streams.shard_map(stream))
        return shards_covering(shard_map, partition_keys)

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
        """What decides what a record becomes now: the configuration, and the target's and dead-letter
        stream's record limits as DescribeStreamSummary gives them (cached; 1 MiB when unknown, so a
        record is dead-lettered rather than refused)."""
        target = self.streams.settings(self.config.target_stream_name)
        dlq_name = self.config.dead_letter_stream_name
        dlq = self.streams.settings(dlq_name) if dlq_name else None
        return PlanSettings(
            dedup_key=self.config.dedup_key,
            unkeyed_policy=self.config.unkeyed_policy,
            dead_letter_stream=dlq_name,
            stream_name=self.config.stream_name,
            shard_id=self.shard_id,
            target_stream=self.config.target_stream_name,
            max_record_bytes=target.max_record_bytes if target is not None else MAX_RECORD_BYTES,
            dead_letter_max_bytes=dlq.max_record_bytes if dlq is not None else MAX_RECORD_BYTES,
        )

    def _stored_settings(self, text: str, what: str) -> PlanSettings:
        """Plan settings a digest batch or the state item recorded ("" for an earlier copier's: the current
        configuration, with IDs read as that copier read them, the integer 7 as the string "7")."""
        if not text:
            return replace(self._settings(), typed_ids=False)
        try:
            return PlanSettings.decode(text, self.config.stream_name, self.shard_id)
        except ValueError as exc:
            raise IncompatibleStateError(f"{self.key}: {what}: {exc}") from exc

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
        new = replace(
            new, version=owner.version + 1, lease_until_ms=lease, updated_ms=now, clock_bound_ms=self._own_bound()
        )
        self._retrying("write_state", lambda: self.store.write(self.key, owner, new))
        self.state = new
        self._note_clock()
        return new

    # -- clocks ------------------------------------------------------------------

    def _own_bound(self) -> int | None:
        """This host's measured clock bound against AWS time (None: not measured)."""
        return self.clock_bounds.bound_ms() if self.clock_bounds is not None else None

    def _arrival_margin(self) -> int:
        """How far this host's clock may be off Kinesis' arrival stamps (AWS time): the configured skew, or the
        measured bound when it is larger."""
        return max(self.config.clock_skew_millis, self._own_bound() or 0)

    def _margin(self, other_bound: int | None) -> int:
        """How far this host's clock and another's (bound ``other_bound``) may differ: at least
        ``copier.clockSkewMillis``; more when the two measured bounds say so (an unmeasured host counts
        half the configured skew, the protocol's assumption)."""
        skew = self.config.clock_skew_millis
        own = self._own_bound()
        margin = max(skew, (skew // 2 if own is None else own) + (skew // 2 if other_bound is None else other_bound))
        if margin > skew and margin != self._widened:
            self._widened = margin
            self.log.warning(
                "clock_margin_widened",
                margin_ms=margin,
                configured_ms=skew,
                own_bound_ms=own,
                other_bound_ms=other_bound,
                detail="the measured clock offsets could exceed copier.clockSkewMillis: leases are given that "
                "much more time (fix the hosts' time sync)",
            )
        return margin

    def _note_clock(self) -> None:
        """Log the measured clock bound when it moved (``copier.clockcheck``)."""
        bounds = self.clock_bounds
        if bounds is None or not bounds.changed_since_report():
            return
        snap = bounds.snapshot()
        half = self.config.clock_skew_millis // 2
        level = self.log.warning if snap.bound_ms is not None and snap.bound_ms > half else self.log.info
        level(
            "clock_bound",
            offset_ms=snap.offset_ms,
            error_ms=snap.error_ms,
            bound_ms=snap.bound_ms,
            samples=snap.samples,
            steps=snap.steps,
        )

    def _ensure_lease(self) -> None:
        """Before a put: renew the lease unless it outlives the put with margin to spare.

        The margin is the configured skew or this host's measured clock bound,
        whichever is larger: a clock stepped back since the lease was written
        reads too early, and its own bound (from the answers since) says by how
        much. A renewal also records the new bound for a successor to see.
        """
        assert self.state is not None
        need = self.config.put_timeout_millis + self._arrival_margin()
        if self.clock.now_ms() + need < self.state.lease_until_ms:
            return
        self._write(self.state)

    def _keep_lease(self) -> None:
        """While reading (a verification): renew the lease once half of it is gone, so that a slow page
        (a GetRecords can take seconds) never lets it run out; FencedError goes up."""
        assert self.state is not None
        if self.clock.now_ms() + self.config.lease_millis // 2 >= self.state.lease_until_ms:
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
        self._drop_held()
        self._waiting = []

    def _drop_held(self) -> None:
        self._held = []
        self._held_bytes = 0
        self._gap = None

    # -- initialize ------------------------------------------------------------

    def initialize(self, shard_id: str) -> None:
        """Take the shard over (after sleeping out a valid lease), verify a batch in flight, load the window.

        A fence during the verification (a rival took over while it read)
        leaves this processor fenced, as any fence does: it holds what the
        daemon delivers and takes the shard back when it can.
        """
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
        try:
            self._verify_in_flight(seen)
        except FencedError:
            self._fence("initialize")
            return
        self._load_window()

    def _retention(self, stream: str) -> int | None:
        """A stream's retention (ms), None when it cannot be read (then the rules that need it fall back,
        and say so once until it can be read again)."""
        try:
            retention = self.streams.retention(stream)
        except AwsError as exc:
            retention, error = None, str(exc)
        else:
            error = "DescribeStreamSummary gave no retention"
        if retention is None and stream not in self._retention_unknown:
            self._retention_unknown.add(stream)
            self.log.warning("retention_unknown", stream=stream, error=error)
        elif retention is not None:
            self._retention_unknown.discard(stream)
        return retention

    def _verify_in_flight(self, seen: ShardState | None) -> None:
        """Verify the digest batch above the committed index, if one was left; FencedError goes up."""
        assert self.state is not None
        index = self.state.batches + 1
        in_flight = self._retrying("get_batch", lambda: self.store.get_batch(self.key, index))
        if in_flight is not None:
            self._verify(in_flight, seen)

    def _take_over(self) -> ShardState | None:
        """Announce this processor as successor of a valid lease and sleep it out, then take the shard.

        The announced owner can no longer renew (its writes are conditioned
        on no successor), so its lease only runs out; the wait ends when this
        host's clock says so, checked again after every sleep (a clock that
        stepped back during it makes the wait longer, never shorter).
        """
        while True:
            seen: ShardState | None = self._retrying("get_state", lambda: self.store.get(self.key))
            now = self.clock.now_ms()
            margin = self._margin(seen.clock_bound_ms if seen is not None else None)
            held = seen is not None and seen.owner not in (None, self.owner) and seen.lease_until_ms + margin > now
            if seen is not None and held:
                if seen.successor != self.owner:
                    try:
                        announced = replace(seen, successor=self.owner, version=seen.version + 1)
                        self._retrying("announce", lambda: self.store.replace_if_unchanged(self.key, seen, announced))
                    except StateConflict:
                        continue
                    seen = announced
                wait = seen.lease_until_ms + margin - now
                self.log.info("waiting_for_lease", owner=seen.owner, epoch=seen.epoch, wait_ms=wait)
                self.clock.sleep_ms(wait)
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
                clock_bound_ms=self._own_bound(),
            )
            try:
                self._retrying("take_over", lambda: self.store.replace_if_unchanged(self.key, seen, new))
            except StateConflict:
                current = self._retrying("get_state", lambda: self.store.get(self.key))
                if current is not None and current.owner == self.owner and current.epoch == new.epoch:
                    self.state = current  # our own write went through before an ambiguous failure
                    return seen
                continue
            self.state = new
            return seen

    def _verify(self, batch: DigestBatch, seen: ShardState | None) -> None:
        """Find out which records of a batch left in flight landed (see copier.recovery); commit it.

        Under the settings the batch was recorded with (its target, dead-letter
        stream and dedup key), whatever this processor's own are. Bounded read:
        only the target shards the batch's entries hash to (and their
        descendants), and only from the batch's start (minus its writer's clock
        margin) to the end of the last lease its writer could have held, plus
        the put timeout and the margin. After that no put of it can land. The
        lease is kept while reading (a read of many shards at 5 GetRecords a
        second can outlast it); a fence raises FencedError.

        A read that starts within the stream's retention of now may miss
        records that expired: what it does not find is sent again and
        reported as possible duplicates (the redo set is marked suspect).
        """
        settings = self._stored_settings(batch.settings, f"{batch.key} settings")
        skew, timeout = self.config.clock_skew_millis, self.config.put_timeout_millis
        since = batch.started_ms - max(skew, batch.clock_bound_ms or 0)
        lease_end = max(seen.lease_until_ms if seen else 0, batch.started_ms + self.config.lease_millis)
        owner_bound = max(seen.clock_bound_ms or 0 if seen else 0, batch.clock_bound_ms or 0)
        until = lease_end + timeout + max(skew, owner_bound)
        target = settings.target_stream or self.config.target_stream_name
        key = settings.dedup_key

        def read_target(shards: Collection[int] | None) -> Found:
            return self._read_recorded(
                "verify_target",
                target,
                lambda: self.streams.read_identities(
                    target,
                    shards,
                    since,
                    until,
                    lambda pk, data: identity_of(key, pk, data, settings.typed_ids),
                    self._keep_lease,
                ),
            )

        found_target = Found()
        suspect = False
        if batch.keyed:
            found_target = read_target(batch.target_shards or None)
            suspect = self._beyond_retention(target, since)
        found_dlq = Found()
        dlq = settings.dead_letter_stream
        if batch.deadletter and dlq:
            found_dlq = self._read_recorded(
                "verify_deadletter",
                dlq,
                lambda: self.streams.read_identities(dlq, None, since, until, content_digest, self._keep_lease),
            )
            suspect = suspect or self._beyond_retention(dlq, since)
        state = self.state
        assert state is not None
        result = resolve(batch, found_target.identities, found_dlq.identities, state.redo_last, state.redo_digests)
        if result.missing and batch.keyed and batch.target_shards:
            # Not where their keys hash to: the target may ignore keys (RecordDistributionStrategy = AUTO, even
            # switched since): every shard, before anything is sent again.
            found_target = read_target(None)
            result = resolve(batch, found_target.identities, found_dlq.identities, state.redo_last, state.redo_digests)
        self.log.info(
            "verified_pending",
            batch=batch.index,
            batch_epoch=batch.epoch,
            landed=result.landed,
            to_redo=result.missing,
            unkeyed_resent=result.unkeyed_resent,
            redo_until=str(result.redo_last),
            records_read=found_target.records_read + found_dlq.records_read,
            shards_read=found_target.shards_read + found_dlq.shards_read,
            read_from_ms=since,
            read_until_ms=until,
            settings_changed=bool(batch.settings) and batch.settings != self._settings().encode(),
        )
        if suspect and result.missing:
            self.log.warning(
                "verification_beyond_retention",
                batch=batch.index,
                to_redo=result.missing,
                read_from_ms=since,
                detail="the chunk's records may have expired from the target before this read: what was not "
                "found is sent again and reported as possible duplicates",
            )
        if batch.epoch < state.epoch:
            # Sealed under this epoch before the state vouches for it: a fenced writer of a lower epoch whose
            # write of this index is still on its way can no longer replace what was verified (its IDs would
            # enter every later window as forwarded, and the records it names that were not would be lost).
            sealed = replace(batch, epoch=state.epoch)
            self._retrying("seal_batch", lambda: self.store.put_batch(self.key, sealed))
        verified = replace(
            state,
            batches=batch.index,
            redo_last=result.redo_last,
            redo_digests=result.redo_digests,
            redo_settings=result.redo_settings,
            redo_suspect=state.redo_suspect or (suspect and result.missing > 0),
        )
        self._write(verified.with_counts(already_landed=result.landed))

    def _read_recorded(self, call: str, stream: str, read: Callable[[], Found]) -> Found:
        """A verification read of a stream a chunk in flight was put to. A stream the current configuration no
        longer names and that no longer exists took what the chunk put there with it: nothing is found (the
        chunk is redone under the current configuration) rather than a host-wide fault on every restart."""
        try:
            return self._retrying(call, read)
        except FatalAwsError as exc:
            current = (self.config.target_stream_name, self.config.dead_letter_stream_name)
            if exc.code != "ResourceNotFoundException" or stream in current:
                raise
            self.log.warning(
                "verification_stream_gone",
                stream=stream,
                detail="the stream a chunk in flight was put to no longer exists, nor does the configuration "
                "name it: what the chunk put there is gone with it; it is redone under the current configuration",
            )
            return Found()

    def _beyond_retention(self, stream: str, since_ms: int) -> bool:
        """Could records from ``since_ms`` on have expired from ``stream`` already? A retention that cannot be
        read counts as Kinesis' shortest (24 h): the answer may then be yes when it is no, never the reverse."""
        retention = self._retention(stream) or MIN_RETENTION_MS
        return since_ms < self.clock.now_ms() - retention + RETENTION_SLACK_MS

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
            ancestor = child != self.shard_id
            parents = self._retrying("list_parents", lambda: self.streams.parents(stream, child, ancestor))
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
        self._keys = {}
        keys: dict[str, tuple[str, bool]] = {}  # stored settings -> their dedup key, typed IDs
        for batch in sorted(everything, key=lambda b: b.arrival_max_ms):
            for column in (batch.keyed, batch.dead_ids):
                if column:
                    low, high = digest_columns(column)
                    self.window.add_columns(low, high, batch.arrival_max_ms)
            if batch.settings not in keys:
                stored = self._stored_settings(batch.settings, f"{batch.key} settings")
                keys[batch.settings] = (str(stored.dedup_key), stored.typed_ids)
            self._saw_key(keys[batch.settings], batch.arrival_max_ms)
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

    def _saw_key(self, key: tuple[str, bool], arrival_ms: int) -> None:
        """The window holds IDs read under ``key`` (dedup key, typed IDs) up to ``arrival_ms``."""
        if arrival_ms > self._keys.get(key, -1):
            self._keys[key] = arrival_ms

    def _older_keys(self) -> list[tuple[DedupKey, bool]]:
        """Dedup keys (with whether their IDs were typed) other than the current one whose IDs the window still
        holds (a configuration change, or an upgrade from a version that read the integer 7 as "7", within
        the window): a record whose ID under one of them was forwarded is a duplicate too."""
        current = (str(self.config.dedup_key), True)
        horizon = self.window.newest_ms - self.config.dedup_window_ms
        return [
            (parse_dedup_key(k), typed)
            for (k, typed), newest in self._keys.items()
            if (k, typed) != current and newest >= horizon
        ]

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
        values = self.metrics.take(self.state.counters, window.ids, span_s, at, self._own_bound())
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
        return self._forward_or_hold(records, behind_ms)

    def flush(self, behind_ms: int | None = None) -> Position | None:
        """Forward whatever small deliveries are waiting (before a shutdown or a shard's end)."""
        records, self._waiting = self._waiting, []
        if not records or self.state is None:
            return None
        if self.fenced:
            return self._while_fenced(records, behind_ms)
        return self._forward_or_hold(records, behind_ms)

    def _forward_or_hold(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        committed, rest = self._forward(records, behind_ms)
        if rest:  # fenced on the way: the rest is not committed by this processor
            return self._while_fenced(rest, behind_ms)
        return committed

    def _forward(
        self, records: Sequence[SourceRecord], behind_ms: int | None
    ) -> tuple[Position | None, list[SourceRecord]]:
        """Forward records now, chunk by chunk (see :meth:`process`): the last committed position, and the
        records left unforwarded because this processor was fenced on the way."""
        committed: Position | None = None
        parts = chunks(records, self.chunk_events)
        for i, chunk in enumerate(parts):
            position = self._process_chunk(chunk, behind_ms)
            if self.fenced:
                return committed, [r for part in parts[i:] for r in part]
            if position is not None:
                committed = position
        return committed, []

    def _while_fenced(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        """Hold what a fenced processor is given, then see whether the shard can be taken back.

        Past ``MAX_HELD_RECORDS`` records or ``MAX_HELD_BYTES`` bytes, what is
        held is dropped and only its range kept: once the shard is taken back,
        that range is read again from the staging stream (as the daemon would
        deliver it). No delivery size makes a fenced processor exit.
        """
        self._held.extend(records)
        self._held_bytes += sum(len(r.data) for r in records)
        if self._held and (len(self._held) > MAX_HELD_RECORDS or self._held_bytes > MAX_HELD_BYTES):
            first = self._gap[0] if self._gap is not None else self._held[0].position
            self._gap = (first, self._held[-1].position)
            self.log.warning(
                "fenced_backlog_dropped",
                records=len(self._held),
                bytes=self._held_bytes,
                first=str(first),
                last=str(self._gap[1]),
                detail="fenced and holding too much: once the shard is taken back, this range is read again "
                "from the staging stream",
            )
            self._held = []
            self._held_bytes = 0
        return self._take_back(behind_ms)

    def _take_back(self, behind_ms: int | None) -> Position | None:
        """Take the shard back once the owner that fenced this processor is gone; then forward what is held.

        The other owner is gone when its lease has run out (an announced
        successor gets one more lease period to take over first). Taking
        back is a takeover like any other: epoch + 1 conditioned on the
        version read, a chunk left in flight verified, the window reloaded.
        What is held (the range read again from staging, then the records
        kept) follows this processor's last commit without a gap, and the
        committed position is at or past that commit, so planning the held
        records from it forwards each of them exactly once.
        """
        assert self.state is not None
        seen = self._retrying("get_state", lambda: self.store.get(self.key))
        return self._take_back_from(seen, behind_ms)

    def _other_owner_gone_ms(self, seen: ShardState) -> int:
        """When the owner that fenced this processor is gone: its lease, the clock margin, and for an announced
        successor one more lease period to take over first."""
        margin = self._margin(seen.clock_bound_ms)
        return seen.lease_until_ms + margin + (self.config.lease_millis if seen.successor else 0)

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
            clock_bound_ms=self._own_bound(),
        )
        try:
            self._retrying("take_back", lambda: self.store.replace_if_unchanged(self.key, seen, new))
        except StateConflict:
            return None
        self.state = new
        self.fenced = False
        self.log = self.log.bind(epoch=new.epoch)
        self.log.info(
            "took_back", previous_owner=seen.owner, previous_epoch=seen.epoch, held=len(self._held), gap=bool(self._gap)
        )
        try:
            self._verify_in_flight(seen)
        except FencedError:
            self._fence("take_back")
            return None
        self.window = DedupWindow(self.config.dedup_window_ms, self.config.dedup_window_max_events)
        self._load_window()
        committed = self._read_gap_again(behind_ms)
        if self.fenced:
            return committed
        held, self._held, self._held_bytes = self._held, [], 0
        position, rest = self._forward(held, behind_ms)
        if rest:
            self._held = rest
            self._held_bytes = sum(len(r.data) for r in rest)
        return position or committed

    def _read_gap_again(self, behind_ms: int | None) -> Position | None:
        """Forward the range a fenced processor dropped, read again from the staging stream; on a new fence,
        keep what is left of it as the range to read next time."""
        if self._gap is None:
            return None
        first, last = self._gap
        self._gap = None
        cursor = [first]
        committed: list[Position | None] = [None]
        stream = self.config.stream_name
        self.log.info("reading_again", first=str(first), last=str(last))

        def run() -> None:
            for page in self.streams.read_source(stream, self.shard_id, cursor[0], last):
                if not page:
                    continue
                position, rest = self._forward(page, behind_ms)
                committed[0] = position or committed[0]
                if rest:
                    self._gap = (rest[0].position, last)
                    return
                cursor[0] = page[-1].position  # a retry starts here: the plan drops what is committed

        self._retrying("read_staging", run)
        return committed[0]

    def _process_chunk(self, records: Sequence[SourceRecord], behind_ms: int | None) -> Position | None:
        scattered = self._scattered(records)
        try:
            self._await_streams(refresh=bool(scattered))
        except FencedError:
            self._fence("stream_settings")
            return None
        state = self.state
        assert state is not None
        self._scattered_now = scattered
        settings = self._settings()
        redo = self._redo(state, settings)
        plan = plan_batch(records, state.position, self.window, redo, settings, self._older_keys())
        if plan.last is None:
            return None
        self._report(plan)
        try:
            return self._forward_and_commit(plan, settings, behind_ms)
        except FencedError:
            self._fence("process_records")
            return None

    def _own_range(self) -> tuple[int, int]:
        """This staging shard's hash key range, from ListShards (closed shards keep theirs), read once. A
        shard ListShards does not list gets an empty range: every record counts as outside it (reported),
        never none."""
        if self._range is None:
            listed = self._retrying("list_staging_shards", lambda: self.streams.shards(self.config.stream_name))
            mine = next((s for s in listed if s["ShardId"] == self.shard_id and "HashKeyRange" in s), None)
            if mine is None:
                self.log.warning(
                    "shard_range_unknown",
                    detail="ListShards does not list this shard: every record is taken as put here against its "
                    "partition key (reported as a possible duplicate)",
                )
                self._range = (1, 0)
            else:
                keys = mine["HashKeyRange"]
                self._range = (int(keys["StartingHashKey"]), int(keys["EndingHashKey"]))
        return self._range

    def _scattered(self, records: Sequence[SourceRecord]) -> set[Position]:
        """Records whose partition key this shard's hash range does not hold. Kinesis put them here against
        their key: the staging stream ignores keys (RecordDistributionStrategy = AUTO, perhaps only for a
        while), or the producer set an ExplicitHashKey. A copy of the same event may then be on another
        shard, forwarded by its processor; KPL aggregates never show here (the KCL drops their user records
        outside the range before copier sees them)."""
        low, high = self._own_range()
        return {r.position for r in records if not low <= hash_key(r.partition_key) <= high}

    def _await_streams(self, refresh: bool) -> None:
        """Stop forwarding while a stream setting makes exactly-once impossible, holding the lease and
        asking again every copier.maxBackoffMillis (the answer is cached: a change is seen within
        SUMMARY_MAX_AGE_S, sooner when records show it): the staging stream ignoring partition keys, or the
        target doing so under copier.ordering = partitionKey. FencedError goes up."""
        while True:
            staging = self.streams.settings(self.config.stream_name, refresh=refresh)
            target = self.streams.settings(self.config.target_stream_name)
            problem = blocking(staging, target, self.config.ordering)
            if problem is None:
                if self._blocked:
                    self._blocked = False
                    self.metrics.stalled = False
                    self.log.warning("stream_settings_ok", detail="forwarding again")
                return
            assert self.state is not None
            if staging is not None and staging.auto and "auto_seen_ms" not in self.state.counters:
                self._write(replace(self.state, counters={**self.state.counters, "auto_seen_ms": self.clock.now_ms()}))
            self._blocked = True
            self.metrics.stalled = True
            self._emit()
            self.log.error("stream_settings_block", detail=problem)
            self._write(self.state)  # the lease is kept: nobody else would do better
            self.clock.sleep_ms(self.config.max_backoff_millis)
            refresh = True

    def _redo(self, state: ShardState, settings: PlanSettings) -> Redo | None:
        """The committed redo set, with the settings its identities were computed under (None: these)."""
        if state.redo_last is None:
            return None
        stored = None
        if state.redo_settings and state.redo_settings != settings.encode():
            stored = self._stored_settings(state.redo_settings, "redo settings")
        return Redo(state.redo_last, state.redo_counter, stored, state.redo_suspect)

    def _report(self, plan: BatchPlan) -> None:
        for position, reason in plan.unkeyed:
            self.log.warning(
                "unkeyed_event",
                sequence_number=position.seq_str,
                sub_sequence_number=position.subseq,
                reason=reason,
                policy=self.config.unkeyed_policy,
            )
        for position, reason in plan.rerouted:
            self.log.warning(
                "rerouted",
                sequence_number=position.seq_str,
                sub_sequence_number=position.subseq,
                reason=reason,
                to="deadletter" if self.config.dead_letter_stream_name else "target under a replacement partition key",
            )
        if plan.redo_missing:
            self.log.error(
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
        """
        floor = now + self.config.digest_ttl_hours * HOUR_MS
        retention = self._retention(self.config.stream_name)  # cached by the adapter; read again when it failed
        if retention is None:
            return floor
        return max(floor, plan.arrival_max_ms + self.config.dedup_window_ms + retention + HOUR_MS)

    def _start(self) -> tuple[int, int]:
        """This host's clock reading and the bound on its offset from AWS time *at that moment*: read around
        it, so that a step between the two reads is counted (the larger bound). Pairing a time with a bound
        measured later, after a step back, would make a verification read start after what landed."""
        before = self._own_bound() or 0
        now = self.clock.now_ms()
        return now, max(before, self._own_bound() or 0)

    def _record(self, plan: BatchPlan, settings: PlanSettings, index: int, now: int, bound: int) -> DigestBatch:
        """The chunk's digest batch (its intent), stored before anything is put. ``now`` and ``bound``: the
        start and the clock bound read with it (:meth:`_start`); the larger of it and the bound now is kept."""
        assert self.state is not None and plan.last is not None
        target = [o.partition_key for o in plan.send if o.destination == "target"]
        shards = self._target_shards(settings.target_stream, target) if target else ()
        redo_ids = b""
        redo_settings = ""
        if plan.redo_ids:
            redo_ids = pack_digests(plan.redo_ids[o.position] for o in plan.in_batch_order())
            redo_settings = self.state.redo_settings
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
            settings=settings.encode(),
            dead_ids=pack_digests(plan.dead_ids),
            redo_ids=redo_ids,
            redo_settings=redo_settings,
            expires_ms=self._expires_ms(plan, now),
            clock_bound_ms=max(bound, self._own_bound() or 0) or None,
        )
        self._ensure_lease()
        self._retrying("put_batch", lambda: self.store.put_batch(self.key, batch))
        self.log.debug("batch_recorded", batch=index, entries=len(plan.send), last=str(plan.last))
        return batch

    def _forward_and_commit(self, plan: BatchPlan, settings: PlanSettings, behind_ms: int | None) -> Position:
        state = self.state
        assert state is not None and plan.last is not None
        index = state.batches
        now, bound = self._start()
        if plan.send:
            index = state.batches + 1
            if state.redo_suspect and plan.redo_sent:  # said before the put: a crash during it must not hide it
                self._possible_duplicates(
                    index,
                    plan.redo_sent,
                    now,
                    "sent again after a verification that started past the target's retention: the first copy "
                    "may have landed and expired from what the verification could read",
                )
            outside = [o for o in plan.send if o.position in self._scattered_now and o.event_id is not None]
            if outside:  # said before the put, as the other reports: a crash during it must not hide it
                self._possible_duplicates(
                    index,
                    outside,
                    now,
                    "put on this staging shard against its partition key (RecordDistributionStrategy AUTO, now or "
                    "earlier, or an ExplicitHashKey): a copy of the same event on another shard may be forwarded too",
                )
            self._record(plan, settings, index, now, bound)
            try:
                stats = self.forwarder.forward(plan.send, now - max(self.config.clock_skew_millis, bound))
            except FencedError:
                self._fenced_after_putting(index, self.forwarder.attempted, now)
                raise
            self.log.debug("put_done", batch=index, entries=len(plan.send), requests=stats.requests)
        self.window.add(plan.keyed_digests + plan.dead_ids, plan.arrival_max_ms)
        self._saw_key((str(settings.dedup_key), settings.typed_ids), plan.arrival_max_ms)
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
        redo = plan.redo
        state = self.state
        assert state is not None
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
        ).with_counts(
            forwarded=sum(1 for o in plan.send if o.destination == "target"),
            dead_lettered=plan.dead_lettered,
            duplicates=plan.duplicates,
            replays=plan.replays,
            unkeyed=len(plan.unkeyed),
            already_landed=plan.already_landed,
        )
        try:
            self._write(commit)
        except FencedError:
            self._fenced_after_putting(index, plan.send, now)
            raise
        self.metrics.stalled = False
        self.log.debug(
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
        assert self.state is not None
        # A clock stepped back reads the lease as longer than it was: its measured bound makes up for it.
        if attempted and self.clock.now_ms() + (self._own_bound() or 0) > self.state.lease_until_ms:
            self._possible_duplicates(
                index,
                attempted,
                started_ms,
                "the lease ran out during the put; a successor may have verified the batch before it landed",
            )

    def _possible_duplicates(self, index: int, sent: Sequence[Outgoing], since_ms: int, detail: str) -> None:
        """Log (and count) the events of a chunk that may have landed twice, with their IDs.

        ``window_from_ms``: no copy this report excuses arrived before it (the
        chunk's start, or the resend's, less this host's clock margin); a copy
        may arrive any time after (a successor redoes the chunk when the daemon
        replays it). An audit excuses one extra copy per ID named, no more
        (``copier.audit``).
        """
        self.metrics.possible_duplicates += len(sent)
        self._emit(now=True)
        self.log.error(
            "possible_duplicates",
            batch=index,
            count=len(sent),
            event_ids=[o.event_id for o in sent if o.event_id is not None],
            window_from_ms=since_ms - self._arrival_margin(),
            detail=detail,
        )

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
                self._drop_held()
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
