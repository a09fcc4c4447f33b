"""One staging shard's protocol: takeover, plan, intent, put, commit (DESIGN section 3).

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
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog

from copier.config import Config
from copier.errors import FencedError, TransientAwsError
from copier.forward import Forwarder
from copier.identity import content_digest, identity_of
from copier.plan import BatchPlan, PlanSettings, Redo, SourceRecord, plan_batch
from copier.positions import Position
from copier.recovery import resolve
from copier.retry import backoff_ms
from copier.state import DigestBatch, Pending, ShardState, StateConflict, StateStore, shard_key
from copier.window import DedupWindow

__all__ = ["ShardWorker", "SystemClock", "worker_id"]


class Clock(Protocol):
    def now_ms(self) -> int: ...
    def sleep_ms(self, ms: int) -> None: ...


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


class StreamsPort(Protocol):
    def put_records(self, stream: str, entries: Sequence[tuple[str, bytes]]) -> list[str | None]: ...
    def identities_since(self, stream: str, since_ms: int, identity: Callable[[str, bytes], bytes]) -> Any: ...
    def parents(self, stream: str, shard_id: str) -> list[str]: ...


@dataclass
class _Retry:
    attempt: int = 0


class ShardWorker:
    """Forwards one shard's records exactly once; one instance per record processor."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        streams: StreamsPort,
        clock: Clock | None = None,
        owner: str | None = None,
        log: Any = None,
    ) -> None:
        self.config = config
        self.store = store
        self.streams = streams
        self.clock = clock or SystemClock()
        self.owner = owner or worker_id()
        self.log = log or structlog.get_logger("copier")
        self.shard_id = ""
        self.key = ""
        self.state: ShardState | None = None
        self.window = DedupWindow(config.dedup_window_events)
        self.fenced = False
        self.forwarder = Forwarder(
            streams,
            self.clock,
            {"target": config.target_stream_name, "deadletter": config.dead_letter_stream_name or ""},
            self._ensure_lease,
            self._identity_for,
            config.put_timeout_millis,
            config.clock_skew_millis,
            config.max_backoff_millis,
            on_retry=self._on_put_retry,
            on_request=lambda stream, entries, failed: self.log.debug(
                "put_request", stream=stream, entries=entries, failed=failed
            ),
        )

    # -- helpers -------------------------------------------------------------

    def _identity_for(self, destination: str) -> Callable[[str, bytes], bytes]:
        if destination == "deadletter":
            return content_digest
        return lambda pk, data: identity_of(self.config.dedup_key, pk, data)

    def _on_put_retry(self, code: str, entries: int, attempt: int) -> None:
        log = self.log.warning if attempt >= 3 else self.log.info
        log("put_retry", code=code, entries=entries, attempt=attempt)

    def _settings(self) -> PlanSettings:
        return PlanSettings(
            dedup_key=self.config.dedup_key,
            unkeyed_policy=self.config.unkeyed_policy,
            dead_letter=self.config.dead_letter_stream_name is not None,
            stream_name=self.config.stream_name,
            shard_id=self.shard_id,
        )

    def _retrying(self, what: str, fn: Callable[[], Any]) -> Any:
        """Run a state-store call until it stops failing transiently; fatal errors go up."""
        attempt = 0
        while True:
            try:
                return fn()
            except TransientAwsError as exc:
                level = self.log.warning if attempt >= 3 else self.log.info
                level("retrying", call=what, code=exc.code, attempt=attempt)
                self.clock.sleep_ms(backoff_ms(attempt, self.config.max_backoff_millis))
                attempt += 1

    def _write(self, new: ShardState, batch: DigestBatch | None = None) -> ShardState:
        """Write as owner; on success the new state is ours. FencedError goes up."""
        assert self.state is not None
        now = self.clock.now_ms()
        new = replace(
            new, version=self.state.version + 1, lease_until_ms=now + self.config.lease_millis, updated_ms=now
        )
        if new.lease_until_ms < self.state.lease_until_ms and self.state.lease_until_ms > 0:
            new = replace(new, lease_until_ms=self.state.lease_until_ms)
        self._retrying("write_state", lambda: self.store.write(self.key, self.state, new, batch))  # type: ignore[arg-type]
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
        self.log.warning("fenced", where=where, detail="another processor owns this shard; forwarding stops")

    # -- initialize ------------------------------------------------------------

    def initialize(self, shard_id: str) -> None:
        """Take the shard over (after sleeping out a valid lease), load the window, verify a pending batch."""
        self.shard_id = shard_id
        self.key = shard_key(self.config.stream_name, shard_id)
        self.log = self.log.bind(shard=shard_id)
        seen = self._take_over()
        self.log = self.log.bind(epoch=self.state.epoch if self.state else None)
        assert self.state is not None
        self.log.info(
            "took_over",
            previous_owner=seen.owner if seen else None,
            previous_epoch=seen.epoch if seen else None,
            position=str(self.state.position) if self.state.position else None,
            pending=self.state.pending.batch_key if self.state.pending else None,
        )
        self._load_window()
        if self.state.pending is not None:
            self._verify_pending()

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
                current = self.store.get(self.key)
                if current is not None and current.owner == self.owner and current.epoch == new.epoch:
                    self.state = current  # our own write went through before an ambiguous failure
                    return seen
                waited_for = None
                continue
            self.state = new
            return seen

    def _load_window(self) -> None:
        assert self.state is not None
        capacity = self.config.dedup_window_events
        own = self._retrying("load_window", lambda: self.store.window_batches(self.key, capacity))
        window = DedupWindow.from_newest_first(capacity, own)
        if len(window) < capacity and self.state.batches < 1 + len(own):
            parents = self._retrying(
                "list_parents", lambda: self.streams.parents(self.config.stream_name, self.shard_id)
            )
            if parents:
                window = DedupWindow(capacity * (1 + len(parents)))
                for parent in parents:
                    batches = self._parent_window(parent, capacity)
                    window.merge(DedupWindow.from_newest_first(capacity, batches))
                window.merge(DedupWindow.from_newest_first(capacity, own))
                self.log.info("inherited_window", parents=parents, digests=len(window))
        self.window = window

    def _parent_window(self, parent: str, capacity: int) -> list[tuple[str, Sequence[bytes]]]:
        key = shard_key(self.config.stream_name, parent)
        batches: list[tuple[str, Sequence[bytes]]] = self._retrying(
            "load_window", lambda: self.store.window_batches(key, capacity)
        )
        return batches

    def _verify_pending(self) -> None:
        """Find out which records of the dead owner's in-flight batch landed (see copier.recovery)."""
        state = self.state
        assert state is not None and state.pending is not None
        pending = state.pending
        batch = self._retrying("get_batch", lambda: self.store.digest_batch(self.key, pending.batch_key))
        since = pending.started_ms - self.config.clock_skew_millis
        if batch is None:
            self.log.error("pending_batch_missing", batch=pending.batch_key, detail="its digests expired; re-planning")
            self._write(replace(state, pending=None))
            return
        found_target = self._retrying(
            "verify_target",
            lambda: self.streams.identities_since(self.config.target_stream_name, since, self._identity_for("target")),
        )
        found_dlq: Any = {}
        if batch.deadletter and self.config.dead_letter_stream_name:
            found_dlq = self._retrying(
                "verify_deadletter",
                lambda: self.streams.identities_since(self.config.dead_letter_stream_name, since, content_digest),  # type: ignore[arg-type]
            )
        result = resolve(pending, batch, found_target, found_dlq, state.redo_last, state.redo_digests)
        self.log.info(
            "verified_pending",
            batch=pending.batch_key,
            landed=result.landed,
            to_redo=result.missing,
            redo_until=str(result.redo_last),
        )
        self._write(
            replace(state, pending=None, redo_last=result.redo_last, redo_digests=result.redo_digests).with_counts(
                already_landed=result.landed
            )
        )

    # -- records -----------------------------------------------------------------

    def process(self, records: Sequence[SourceRecord], behind_ms: int | None = None) -> Position | None:
        """Forward a batch; return the committed position, or None if fenced or nothing moved.

        ``behind_ms`` is the daemon's millisBehindLatest for the batch, kept
        in the state item for ``copier status``.
        """
        if self.fenced or self.state is None:
            return None
        state = self.state
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

    def _forward_and_commit(self, plan: BatchPlan, behind_ms: int | None) -> Position:
        state = self.state
        assert state is not None and plan.last is not None
        redo_last = plan.redo.last if plan.redo else None
        redo_digests = tuple(sorted(plan.redo.digests.elements())) if plan.redo else ()
        batch_key = None
        if plan.send:
            now = self.clock.now_ms()
            number = state.batches + 1
            batch_key = f"batch#{state.epoch:012d}#{number:012d}"
            batch = DigestBatch(
                batch_key,
                tuple(o.identity for o in plan.send if o.destination == "target"),
                tuple(o.identity for o in plan.send if o.destination == "deadletter"),
                tuple(plan.window_digests),
                now,
            )
            intent = replace(
                state,
                pending=Pending(batch_key, plan.last, now),
                batches=number,
                redo_last=redo_last,
                redo_digests=redo_digests,
            )
            state = self._write(intent, batch)
            self.log.debug("intent_recorded", batch=batch_key, entries=len(plan.send), last=str(plan.last))
            stats = self.forwarder.forward(plan.send, now)
            self.log.debug("put_done", batch=batch_key, entries=len(plan.send), requests=stats.requests)
        commit = replace(
            state, position=plan.last, pending=None, redo_last=redo_last, redo_digests=redo_digests, behind_ms=behind_ms
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
                self.log.error(
                    "possible_duplicates",
                    batch=batch_key,
                    count=len(plan.send),
                    event_ids=[o.event_id for o in plan.send if o.event_id is not None],
                    detail="the lease ran out during the put; a successor may have verified the batch before it landed",
                )
            raise
        if batch_key is not None:
            self.window.add_batch(batch_key, plan.window_digests)
        self.log.debug(
            "committed",
            position=str(plan.last),
            forwarded=len(plan.send),
            duplicates=plan.duplicates,
            replays=plan.replays,
        )
        return plan.last

    # -- endings -------------------------------------------------------------------

    def end_shard(self) -> bool:
        """Mark the shard closed; True if the caller may checkpoint SHARD_END."""
        if self.fenced or self.state is None:
            return False
        try:
            self._write(replace(self.state, closed=True))
        except FencedError:
            self._fence("shard_ended")
            return False
        self.log.info("shard_ended", position=str(self.state.position))
        return True

    def release(self) -> Position | None:
        """On a requested shutdown: give the lease up so a successor need not sleep; return the position."""
        if self.fenced or self.state is None:
            return None
        position = self.state.position
        try:
            released = replace(self.state, lease_until_ms=0, version=self.state.version + 1)
            self._retrying("release", lambda: self.store.write(self.key, self.state, released))  # type: ignore[arg-type]
            self.state = released
        except FencedError:
            self._fence("shutdown_requested")
            return None
        self.log.info("released", position=str(position) if position else None)
        return position
