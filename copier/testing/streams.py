"""InMemoryStreams: Kinesis streams in lists, for processors and tests run in process.

It is held to the same answers as ``copier.adapters.kinesis.KinesisStreams`` on the
local backend (``tests/test_streams_contract.py``). Its shards and their
resharding live in :mod:`copier.testing.shards`; this module has the rest:
stream settings, puts (validation, fault injection, routing), reads of
identities and of staging records.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from copier.core.errors import FatalAwsError, TransientAwsError
from copier.core.limits import MAX_PARTITION_KEY_CHARS, MAX_RECORD_BYTES, record_size
from copier.core.plan import SourceRecord
from copier.core.ports import Found, Identity
from copier.core.positions import Position
from copier.core.shardmap import ShardMap, descendants, shard_id_of, shard_number
from copier.core.streamsettings import AUTO, PARTITION_KEY, SUMMARY_MAX_AGE_S, SUMMARY_RETRY_S, StreamSettings
from copier.testing.clock import FakeClock
from copier.testing.shards import ShardLayout

__all__ = ["THROTTLED", "EntryOutcome", "InMemoryStreams", "PutFault"]


#: An entry's fate in a fault: landed or not (answered ``ProvisionedThroughputExceededException`` when not), or
#: (landed or not, the ``ErrorCode`` answered for it): an ``InternalFailure`` may have been written.
EntryOutcome = bool | tuple[bool, str]
PutFault = Callable[[str, list[tuple[str, bytes]]], tuple[Sequence[EntryOutcome], BaseException | None]]
THROTTLED = "ProvisionedThroughputExceededException"


def _all_land(stream: str, entries: list[tuple[str, bytes]]) -> tuple[list[bool], BaseException | None]:
    return [True] * len(entries), None


class InMemoryStreams(ShardLayout):
    """Kinesis streams in lists, routed to shards by partition key, with what the tests need to draw.

    * Shards: each stream starts with ``shard_counts.get(stream, 1)`` shards splitting the hash key space
      evenly; :meth:`split` and :meth:`merge` reshard it as Kinesis does (the parents close and keep
      their records, the children take new ones, ListShards names the parents).
    * The shard map a processor gets (:meth:`shard_map`) may be stale, as the real one is (cached for
      minutes): with ``map_max_age_ms`` set it is a snapshot refreshed when older than that on the fake
      clock, or by :meth:`refresh_map`.
    * Retention: records older than ``retention_ms[stream]`` (default 24 h) can no longer be read.
    * Reads page: ``read_page`` records a GetRecords page (0: one page a shard), each page advancing
      the clock by ``page_ms`` and calling ``on_read_page`` (a test's hook: a rival takes over mid-read).
    * Validation as Kinesis does it: a request with a partition key that is empty, longer than 256
      code points or not Unicode text (a lone surrogate: ``SerializationException``), or with a record
      larger than the stream's ``max_record_bytes``, is refused whole (``ValidationException``, as Kinesis
      and moto answer). With ``oversize_entry_code`` set, a record
      over the limit is answered that per-entry code instead, not written, and the rest of the request goes
      on (an answer AWS does not document, which copier handles all the same).
    * ``fault(stream, entries)`` returns each entry's fate (:data:`EntryOutcome`) and an optional exception to
      raise after landing them: per-entry throttling (entries that do not land get
      ``ProvisionedThroughputExceededException``), an ``InternalFailure`` that was or was not written, an
      ambiguous put (``AmbiguousPutError`` after a subset landed), a crash mid-put; ``after_put``, if set, runs
      once after the landed entries are stored and before that exception (a reshard while a put is
      ambiguous); ``on_refused``, if set, runs when a request is refused whole, before the error is raised.
    * Staging: :meth:`add_staging` keeps records a processor can read back (:meth:`read_source`).
    * Record distribution: a stream in ``auto`` ignores partition keys, as Kinesis' ``AUTO`` strategy does:
      each landed entry goes to an open shard drawn by ``scatter`` (default: round robin);
      ``auto_until[stream]``, if set, is when the stream is switched back (on the fake clock);
      :meth:`settings` reports the strategy and the record limit as DescribeStreamSummary would; with
      ``cache_settings`` from a cache as old as the real adapter's may be (a switch seen minutes late); a
      stream in ``unreadable`` cannot be described (DescribeStreamSummary throttled or denied): :meth:`describe`
      raises, :meth:`settings` answers the last answer it cached, or None, as the adapter does.
    * Layout: :meth:`set_ranges` gives a stream shards of chosen hash key ranges instead of even ones.
    """

    def __init__(
        self,
        clock: FakeClock | None = None,
        shard_counts: dict[str, int] | None = None,
        *,
        retention_ms: dict[str, int] | None = None,
        max_record_bytes: dict[str, int] | None = None,
    ) -> None:
        self.records: dict[str, list[tuple[str, bytes, int, int]]] = {}  # (pk, data, arrival, shard number)
        self.shard_parents: dict[str, list[str]] = {}
        self.shard_counts = dict(shard_counts or {})
        self.retention_ms = dict(retention_ms or {})
        self.max_record_bytes = dict(max_record_bytes or {})
        self.fault: PutFault = _all_land
        self.clock = clock or FakeClock()
        self.put_calls = 0
        self.reads: list[Found] = []
        self.map_max_age_ms: int | None = None
        self.read_page = 0
        self.page_ms = 0
        self.on_read_page: Callable[[], None] | None = None
        self.after_put: Callable[[], None] | None = None  # once, after a request's entries landed
        self.on_refused: Callable[[], None] | None = None  # when a request is refused whole
        self.oversize_entry_code: str | None = None
        self.unlisted: set[str] = set()  # shards ListShards no longer lists (expired with the retention)
        self._listed: dict[str, list[dict[str, Any]]] = {}
        self._maps: dict[str, tuple[int, ShardMap]] = {}
        self._staging: dict[str, list[SourceRecord]] = {}
        self.arrival_reads: list[tuple[str, int, int]] = []  # read_arrivals' (shard, since, until), in order
        self.auto: set[str] = set()  # streams with RecordDistributionStrategy = AUTO
        self.auto_until: dict[str, int] = {}  # stream -> when it goes back to USER_PARTITION_KEY
        self.cache_settings = False  # answer settings() as KinesisStreams does: from a cache (SUMMARY_MAX_AGE_S)
        self._summaries: dict[str, tuple[int, StreamSettings]] = {}
        self.described: dict[str, int] = {}  # DescribeStreamSummary calls per stream
        self.unreadable: set[str] = set()  # streams whose DescribeStreamSummary fails (LimitExceededException)
        self._turn = 0
        self.scatter: Callable[[int], int] = self._round_robin  # open shards -> the index of the one to take

    def _round_robin(self, n: int) -> int:
        self._turn += 1
        return self._turn % n

    def settings(self, stream: str, refresh: bool = False) -> StreamSettings | None:
        """What DescribeStreamSummary says of the stream; with ``cache_settings``, what it said up to
        ``SUMMARY_MAX_AGE_S`` ago (``refresh``: ``SUMMARY_RETRY_S``), as ``KinesisStreams.settings`` answers."""
        now = self.clock.now_ms()
        if stream in self.auto_until and now >= self.auto_until[stream]:
            self.auto.discard(stream)
            del self.auto_until[stream]
        cached = self._summaries.get(stream)
        max_age_ms = int((SUMMARY_RETRY_S if refresh else SUMMARY_MAX_AGE_S) * 1000)
        if self.cache_settings and cached is not None and now - cached[0] <= max_age_ms:
            return cached[1]
        if stream in self.unreadable:
            return cached[1] if cached is not None else None
        settings = self._describe(stream)
        self._summaries[stream] = (now, settings)
        return settings

    def describe(self, stream: str, keep: bool = False) -> StreamSettings:
        """DescribeStreamSummary now, uncached (``KinesisStreams.describe``)."""
        settings = self._describe(stream)
        if keep:
            self._summaries[stream] = (self.clock.now_ms(), settings)
        return settings

    def forget_settings(self) -> None:
        """A new processor starts with no cached settings (its own process): its first answers are fresh."""
        self._summaries.clear()

    def _describe(self, stream: str) -> StreamSettings:
        self.described[stream] = self.described.get(stream, 0) + 1
        if stream in self.unreadable:
            raise TransientAwsError("DescribeStreamSummary", "LimitExceededException", "Rate exceeded for stream")
        return StreamSettings(
            name=stream,
            retention_ms=self._kept_ms(stream),
            max_record_bytes=self.max_record_bytes.get(stream, MAX_RECORD_BYTES),
            distribution=AUTO if stream in self.auto else PARTITION_KEY,
            open_shards=len(self.current_map(stream).ranges),
        )

    def retention(self, stream: str) -> int | None:
        """The stream's retention in milliseconds (DescribeStreamSummary)."""
        return self._kept_ms(stream)

    def _kept_ms(self, stream: str) -> int:
        return self.retention_ms.get(stream, 24 * 3_600_000)

    # -- puts ---------------------------------------------------------------------------------------

    def _oversize(self, stream: str, pk: str, data: bytes) -> bool:
        return record_size(pk, data) > self.max_record_bytes.get(stream, MAX_RECORD_BYTES)

    def _validate(self, stream: str, pairs: list[tuple[str, bytes]]) -> None:
        for i, (pk, data) in enumerate(pairs):
            problem = None
            if not 1 <= len(pk) <= MAX_PARTITION_KEY_CHARS:  # code points, as Kinesis counts (copier.core.limits)
                problem = f"partition key of {len(pk)} characters"
            elif any("\ud800" <= c <= "\udfff" for c in pk):
                if self.on_refused is not None:
                    self.on_refused()
                raise FatalAwsError("PutRecords", "SerializationException", "partition key is not Unicode text")
            elif self._oversize(stream, pk, data) and self.oversize_entry_code is None:
                limit = self.max_record_bytes.get(stream, MAX_RECORD_BYTES)
                problem = f"1 validation error detected: Value at 'records.{i + 1}.member.data' failed to satisfy "
                problem += f"constraint: Member must have length less than or equal to {limit}"
            if problem is not None:
                if self.on_refused is not None:
                    self.on_refused()
                raise FatalAwsError("PutRecords", "ValidationException", problem)

    def put_records(
        self,
        stream: str,
        entries: Sequence[tuple[str, bytes] | tuple[str, bytes, str | None]],
        deadline: float | None = None,
    ) -> list[str | None]:
        self.put_calls += 1
        pairs = [(entry[0], entry[1]) for entry in entries]
        self._validate(stream, pairs)
        land, error = self.fault(stream, pairs)
        routes = self.current_map(stream)
        out: list[str | None] = []
        for (pk, data), outcome in zip(pairs, land, strict=True):
            ok, code = (outcome, None if outcome else THROTTLED) if isinstance(outcome, bool) else outcome
            if self.oversize_entry_code is not None and self._oversize(stream, pk, data):
                ok, code = False, self.oversize_entry_code
            if ok:
                if stream in self.auto:
                    shard = shard_number(routes.ranges[self.scatter(len(routes.ranges))][2])
                else:
                    shard = shard_number(routes.shard_for(pk) or routes.ranges[0][2])
                self.records.setdefault(stream, []).append((pk, data, self.clock.now_ms(), shard))
            out.append(code)
        hook, self.after_put = self.after_put, None
        if hook is not None:
            hook()
        if error is not None:
            raise error
        return out

    # -- reads --------------------------------------------------------------------------------------

    def read_identities(
        self,
        stream: str,
        shards: Collection[int] | None,
        since_ms: int,
        until_ms: int | None,
        identity: Identity,
        keep_alive: Callable[[], None] | None = None,
    ) -> Found:
        listed = self.shards(stream)
        if shards is None:
            wanted = {s["ShardId"] for s in listed}
        else:
            wanted = descendants(listed, {shard_id_of(n) for n in shards})
        found = Found(shards_read=len(wanted))
        oldest = self.clock.now_ms() - self._kept_ms(stream)
        for shard_id in sorted(wanted):
            number = shard_number(shard_id)
            page = 0
            for pk, data, at, shard in list(self.records.get(stream, [])):
                if shard != number or at < since_ms or at < oldest:
                    continue
                found.records_read += 1
                if until_ms is not None and at > until_ms:
                    break
                found.identities[identity(pk, data)] += 1
                page += 1
                if self.read_page and page >= self.read_page:
                    page = 0
                    self._next_page(keep_alive)
            self._next_page(keep_alive)
        self.reads.append(found)
        return found

    def _next_page(self, keep_alive: Callable[[], None] | None) -> None:
        self.clock.advance(self.page_ms)
        if self.on_read_page is not None:
            self.on_read_page()
        if keep_alive is not None:
            keep_alive()

    def data(self, stream: str) -> list[bytes]:
        return [data for _, data, _, _ in self.records.get(stream, [])]

    # -- staging ------------------------------------------------------------------------------------

    def add_staging(self, shard_id: str, records: Sequence[SourceRecord]) -> None:
        """Records written to a staging shard, readable back by :meth:`read_source` within retention."""
        self._staging.setdefault(shard_id, []).extend(records)

    def set_staging(self, shard_id: str, records: Sequence[SourceRecord]) -> None:
        """The staging shard holds these records instead (a test rewrote some)."""
        self._staging[shard_id] = list(records)

    def read_arrivals(
        self, stream: str, shard_id: str, since_ms: int, until_ms: int, keep_alive: Callable[[], None] | None = None
    ) -> Iterator[list[SourceRecord]]:
        """The staging shard's records from the first that arrived at or after ``since_ms`` (AT_TIMESTAMP) up to
        the first that arrived at or after ``until_ms``, still within retention (``KinesisStreams.read_arrivals``);
        a shard ListShards does not list cannot be read (ShardNotListed, as the real reads raise it)."""
        self.arrival_reads.append((shard_id, since_ms, until_ms))
        error = self.not_listed(stream, shard_id)
        if error is not None:
            raise error
        oldest = self.clock.now_ms() - self._kept_ms(stream)
        held = self._staging.get(shard_id, [])
        begin = next((i for i, r in enumerate(held) if r.arrival_ms >= since_ms), len(held))
        end = next((i for i in range(begin, len(held)) if held[i].arrival_ms >= until_ms), len(held))
        wanted = [r for r in held[begin:end] if r.arrival_ms >= oldest]
        size = self.read_page or len(wanted) or 1
        for i in range(0, len(wanted), size):
            self._next_page(keep_alive)  # the clock moves by page_ms a page, as for a verification's reads
            yield wanted[i : i + size]

    def read_source(self, stream: str, shard_id: str, first: Position, last: Position) -> Iterator[list[SourceRecord]]:
        """The staging shard's records from ``first`` to ``last`` (both included), still within retention."""
        oldest = self.clock.now_ms() - self._kept_ms(stream)
        wanted = [r for r in self._staging.get(shard_id, []) if first <= r.position <= last and r.arrival_ms >= oldest]
        for i in range(0, len(wanted), self.read_page or len(wanted) or 1):
            yield wanted[i : i + (self.read_page or len(wanted))]
