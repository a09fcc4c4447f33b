"""What every part of a shard's protocol shares: who it is, its state item, and the discipline of its AWS calls.

One :class:`ShardSession` per record processor. It holds the shard's
identity (stream, shard, state key, this processor's owner ID), the last
state item this processor wrote as owner, whether it is fenced, the dedup
window, and the ways every part talks to AWS:

* :meth:`retrying`: a call is retried for as long as its fault lasts; a
  fault AWS reports as final for this shard's request stalls this shard
  alone (``shard_stalled``), a host-wide one (a missing table or stream,
  denied access) goes up and ends the process; a fence and a conflict go up.
  AWS refusing a request for its time (this host's clock, see
  ``copier.core.clockcheck.blames_the_clock``) stalls the shard too, the
  clock named: a restart would meet the same clock, and every shard of the
  host with it, every few seconds.
* :meth:`write`: every write as owner renews the lease and records this
  host's measured clock bound; a conditional failure is a fence.
* :meth:`ensure_lease` / :meth:`keep_lease`: before a put the lease must
  outlive it; while reading it is renewed once half of it is gone.
* ``stalls``: a stall, said in the journal, the metrics and, with the owner
  writes, the state item (``copier.shard.stalls``).

It is also what the forwarder is given (``copier.shard.forward.PutSession``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from copier.adapters.metrics import MetricsEmitter, ShardMetrics
from copier.core.audittypes import digest_name
from copier.core.clockcheck import ClockBounds, ClockSnapshot, blames_the_clock
from copier.core.config import Config
from copier.core.errors import AwsError, FatalAwsError, FencedError, IncompatibleStateError, TransientAwsError
from copier.core.identity import content_digest, identity_of
from copier.core.limits import UTF16_UNITS
from copier.core.plan import Outgoing, PlanSettings
from copier.core.ports import Clock, Identity, Streams
from copier.core.retry import backoff_ms
from copier.core.shardmap import shards_covering
from copier.core.state import ShardState, StateStore, shard_key
from copier.core.streamsettings import StreamSettings, planned_limit
from copier.core.window import DedupWindow
from copier.shard.margins import ClockMargins
from copier.shard.progress import ProgressLine
from copier.shard.retention import MIN_RETENTION_MS, Retentions
from copier.shard.stalls import StallWatch

__all__ = ["MIN_RETENTION_MS", "ShardSession"]

T = TypeVar("T")

HOUR_MS = 3_600_000


class ShardSession:
    """One processor's shared state and AWS discipline; see the module docstring."""

    def __init__(
        self,
        config: Config,
        store: StateStore,
        streams: Streams,
        clock: Clock,
        owner: str,
        log: Any,
        emitter: MetricsEmitter | None,
        clock_bounds: ClockBounds | None,
        key_prefix: str = "",
    ) -> None:
        self.config = config
        self.store = store
        self.streams = streams
        self.clock = clock
        self.owner = owner
        self.log = log
        self.emitter = emitter
        self.metrics = ShardMetrics(last_emit_ms=clock.now_ms())
        self.clock_bounds = clock_bounds
        self.margins = ClockMargins(config.clock_skew_millis, clock, clock_bounds, self)
        self.key_prefix = key_prefix
        self.shard_id = ""
        self.key = ""
        self.state: ShardState | None = None  # the item as this processor last wrote (or read) it as owner
        self.fenced = False
        self.window = DedupWindow(config.dedup_window_ms, config.dedup_window_max_events)
        self.stalls = StallWatch(self)
        self._retentions = Retentions(streams, clock)
        self.unread: set[str] = set()  # streams whose settings the last read could not get (throttled, denied)
        self._progress = ProgressLine(config.progress_interval_seconds, clock)

    def key_of(self, shard_id: str) -> str:
        """A shard's items' key: ``<stream>/<shardId>`` after a source's ``key_prefix`` (``copier.shard.source``)."""
        return self.key_prefix + shard_key(self.config.stream_name, shard_id)

    # -- what records become --------------------------------------------------------

    def settings(self, refresh: bool = False, now: bool = False) -> PlanSettings:
        """What decides what a record becomes now: the configuration, and the target's and dead-letter
        stream's record limits as DescribeStreamSummary gives them (cached; when never read, the most a
        stream takes: the put decides, never a guess, ``copier.core.streamsettings.planned_limit``). A put
        was refused, and a limit may have been lowered since the cached answer: ``refresh`` asks again
        unless asked within ``SUMMARY_RETRY_S``, ``now`` asks now (the last answer when that fails)."""
        target = self._stream_settings(self.config.target_stream_name, refresh, now)
        dlq_name = self.config.dead_letter_stream_name
        dlq = self._stream_settings(dlq_name, refresh, now) if dlq_name else None
        return PlanSettings(
            dedup_key=self.config.dedup_key,
            unkeyed_policy=self.config.unkeyed_policy,
            dead_letter_stream=dlq_name,
            stream_name=self.config.stream_name,
            shard_id=self.shard_id,
            target_stream=self.config.target_stream_name,
            max_record_bytes=planned_limit(target),
            dead_letter_max_bytes=planned_limit(dlq),
        )

    def _stream_settings(self, stream: str, refresh: bool, now: bool) -> StreamSettings | None:
        if now:
            try:
                found: StreamSettings | None = self.streams.describe(stream, keep=True)  # the host's answer too
                self.unread.discard(stream)
                return found
            except AwsError:
                self.unread.add(stream)  # throttled or denied: the last answer (asked again at the next refusal)
        found = self.streams.settings(stream, refresh=refresh)
        if found is None:
            self.unread.add(stream)
        return found

    def stored_settings(self, text: str, what: str) -> PlanSettings:
        """Plan settings a digest batch or the state item recorded ("" for an earlier copier's: the current
        configuration, with IDs read as that copier read them, the integer 7 as the string "7", and keys
        counted as it counted them, in UTF-16 units: docs/protocol.md, "Partition keys")."""
        if not text:
            return replace(self.settings(), typed_ids=False, key_count=UTF16_UNITS)
        try:
            return PlanSettings.decode(text, self.config.stream_name, self.shard_id)
        except ValueError as exc:
            raise IncompatibleStateError(f"{self.key}: {what}: {exc}") from exc

    def identity_for(self, destination: str) -> Identity:
        if destination == "deadletter":
            return content_digest
        return lambda pk, data: identity_of(self.config.dedup_key, pk, data)

    def target_shards(
        self, stream: str, partition_keys: Iterable[str], hashes: Mapping[str, int] | None = None
    ) -> set[int] | None:
        """Numbers of the target shards these keys go to (from a map taken now, before the put); ``hashes``: keys
        already hashed (``copier.core.shardmap.key_hashes``)."""
        shard_map = self.retrying("list_target_shards", lambda: self.streams.shard_map(stream))
        return shards_covering(shard_map, partition_keys, hashes)

    # -- AWS calls ------------------------------------------------------------------

    def retrying(self, what: str, fn: Callable[[], T]) -> T:
        """Run a call until it succeeds; a host-wide fatal error, FencedError and StateConflict go up.

        Transient errors are retried with jittered backoff; a fatal error that
        is not host-wide stalls this shard (retried at the longest backoff,
        logged each time) rather than ending a process that serves other shards.
        """
        attempt = 0
        while True:
            try:
                result = fn()
            except (TransientAwsError, FatalAwsError) as exc:
                if isinstance(exc, FatalAwsError) and self.host_wide(exc):
                    raise
                if isinstance(exc, FatalAwsError) or self.blames_clock(exc):
                    self.on_stall(what, exc, attempt)
                    self.clock.sleep_ms(self.config.max_backoff_millis)
                else:
                    level = self.log.warning if attempt >= 3 else self.log.info
                    level("retrying", call=what, code=exc.code, attempt=attempt)
                    self.clock.sleep_ms(backoff_ms(attempt, self.config.max_backoff_millis))
            else:
                self.stalls.passed(what)
                return result
            attempt += 1

    def clock_snapshot(self) -> ClockSnapshot | None:
        """What this host knows of its clock against AWS time (None: not measured by this processor)."""
        return self.clock_bounds.snapshot() if self.clock_bounds is not None else None

    def blames_clock(self, error: AwsError) -> bool:
        """Did AWS refuse the request for this host's clock (``copier.core.clockcheck.blames_the_clock``)?"""
        return blames_the_clock(error, self.clock_snapshot())

    def host_wide(self, error: FatalAwsError) -> bool:
        """Does the error end the process? A host-wide fault does, unless it is this host's clock: every
        shard of the host would meet the same clock after a restart, and waiting for it to be corrected
        keeps the shards (a stall, the clock named) instead of restarting them all every few seconds."""
        return error.host_wide and not self.blames_clock(error)

    def write(self, new: ShardState) -> ShardState:
        """Write as owner, with the lease renewed, this host's clock bound and the stall as it is now; on success
        the new state is ours. FencedError goes up."""
        owner = self.state
        assert owner is not None
        now = self.clock.now_ms()
        lease = max(now + self.config.lease_millis, owner.lease_until_ms)
        bound = self.margins.own_bound()
        new = replace(
            new,
            version=owner.version + 1,
            lease_until_ms=lease,
            updated_ms=now,
            clock_bound_ms=bound,
            **self.stalls.fields(),
        )
        try:
            self.retrying("write_state", lambda: self.store.write(self.key, owner, new))
        except FencedError:
            # Refused: fenced, or a retry of ours whose first attempt went through (its answer was lost).
            if self.retrying("get_state", lambda: self.store.get(self.key)) != new:
                raise
        self.state = new
        self.margins.note()
        return new

    def ensure_lease(self) -> None:
        """Before a put: renew the lease unless it outlives the put with margin to spare.

        The margin is the configured skew or this host's measured clock bound,
        whichever is larger: a clock stepped back since the lease was written
        reads too early, and its own bound (from the answers since) says by how
        much. A renewal also records the new bound for a successor to see.
        """
        assert self.state is not None
        need = self.config.put_timeout_millis + self.margins.arrival()
        if self.clock.now_ms() + need < self.state.lease_until_ms:
            return
        self.write(self.state)

    def keep_lease(self) -> None:
        """While reading (a verification): renew the lease once half of it is gone, so that a slow page
        (a GetRecords can take seconds) never lets it run out; FencedError goes up."""
        assert self.state is not None
        if self.clock.now_ms() + self.config.lease_millis // 2 >= self.state.lease_until_ms:
            self.write(self.state)

    def fence(self, where: str) -> None:
        self.fenced = True
        self.log.warning(
            "fenced",
            where=where,
            detail="another processor took the shard over; forwarding stops, and what the daemon delivers is held "
            "until that owner's lease runs out or this processor's lease is lost",
        )

    # -- retention ------------------------------------------------------------------

    def retention(self, stream: str) -> int | None:
        """A stream's retention (ms), None when it cannot be read (``copier.shard.retention``)."""
        return self._retentions.get(stream, self.log)

    def beyond_retention(self, stream: str, since_ms: int) -> bool:
        """Could records from ``since_ms`` on have expired from ``stream`` already (``copier.shard.retention``)?"""
        return self._retentions.beyond(stream, since_ms, self.log)

    # -- what is said ---------------------------------------------------------------

    def emit(self, now: bool = False) -> None:
        """Send this interval's metrics if one has passed (or ``now``); nothing when metrics are off."""
        if self.emitter is None or self.state is None:
            return
        at = self.clock.now_ms()
        if not now and not self.metrics.due(at, self.config.metrics_interval_seconds):
            return
        window = self.window.stats()
        span_s = (window.newest_ms - window.oldest_ms) / 1000 if window.ids else 0.0
        values = self.metrics.take(self.state.counters, window.ids, span_s, at, self.margins.own_bound())
        self.emitter.emit(self.shard_id, values, self.metrics.take_retries(), self.metrics.properties())

    def progress(self) -> None:
        """A ``progress`` line at INFO every ``copier.progressIntervalSeconds`` (``copier.shard.progress``)."""
        self._progress.tick(self.state, self.log)

    def progress_from_here(self) -> None:
        """The next progress line and the next metrics count from the state as it is now (after a takeover): the
        item's counters are the shard's totals over every owner, and an interval's metrics are what this
        processor added to them (before, the first document after a takeover counted the shard's whole history
        as forwarded in that interval)."""
        self._progress.restart(self.state)
        self.metrics.counts_at_emit = dict(self.state.counters) if self.state is not None else {}

    def on_put_request(self, stream: str, entries: int, failed: int, millis: float | None) -> None:
        self.metrics.saw_put(millis)
        self.log.debug("put_request", stream=stream, entries=entries, failed=failed, millis=millis)

    def on_landed(self, destination: str, entries: Sequence[Outgoing], at_ms: int) -> None:
        """Entries landed at local ``at_ms``: their ages at the target, in AWS time (``copier.core.recordage``)."""
        if destination == "target":
            self.metrics.record_age.add_landed(self.margins.aws_ms(at_ms), (o.arrival_ms for o in entries))

    def on_put_retry(self, code: str, entries: int, attempt: int) -> None:
        self.metrics.put_retries[code] += entries
        log = self.log.warning if attempt >= 3 else self.log.info
        log("put_retry", code=code, entries=entries, attempt=attempt)

    def possible_duplicates(
        self, index: int, sent: Sequence[Outgoing], since_ms: int, detail: str, unkeyed: Sequence[int] = ()
    ) -> None:
        """Log (and count) what of a chunk may have landed twice: the event IDs of ``sent``, and the records
        without one (``unkeyed_digests``: the content digest of each as put, ``sent``'s and ``unkeyed``'s, once
        per copy that may be extra), so that an audit can tell each extra copy from a loss or a bug.

        ``window_from_ms``: no copy this report excuses arrived before it (the
        chunk's start, or the resend's, less this host's clock margin); a copy
        may arrive any time after (a successor redoes the chunk when the daemon
        replays it). An audit excuses one extra copy per ID or digest named, no
        more (``copier.core.audit``).
        """
        names = [digest_name(o.identity) for o in sent if o.event_id is None] + [digest_name(d) for d in unkeyed]
        self.metrics.possible_duplicates += len(sent) + len(unkeyed)
        self.emit(now=True)
        self.log.error(
            "possible_duplicates",
            batch=index,
            count=len(sent) + len(unkeyed),
            event_ids=[o.event_id for o in sent if o.event_id is not None],
            unkeyed_digests=names,
            window_from_ms=since_ms - self.margins.arrival(),
            detail=detail,
        )

    def on_unverifiable_resend(self, entries: Sequence[Outgoing], read_from_ms: int) -> None:
        """Entries without an event ID whose put's outcome is unknown are sent again (the forwarder cannot tell
        their copy from an identical record's): said before they are, as every possible duplicate is."""
        assert self.state is not None
        self.possible_duplicates(
            self.state.batches + 1,
            entries,
            read_from_ms,
            "sent again after a put whose outcome is unknown: records without an event ID cannot be told from "
            "identical ones, so their first copy may have landed",
        )

    def latest_arrival_ms(self) -> int:
        """Where a verification read ends (``ClockMargins.latest_aws_ms``)."""
        return self.margins.latest_aws_ms()

    def on_stall(self, call: str, error: AwsError, attempt: int) -> None:
        """AWS refuses the request as final: the shard stalls (``copier.shard.stalls.StallWatch.refused``)."""
        self.stalls.refused(call, error, attempt)
