"""The simulation's record processors: copier's own session, stream guard and Kinesis adapter for each, on a
simulated clock, their calls answered by the fake account (``copier.bench.sim.account``).

Each :class:`Processor` holds what a ``copier process`` holds for its control-plane calls, built as
``copier.commands.cli`` builds them on the lean path: a :class:`~copier.adapters.kinesis.KinesisStreams` (with
the host's :class:`MemoryShare` in place of the file share, or none: each processor asking for itself) whose
``LeanKinesis`` clients send through :class:`~copier.bench.sim.account.Wire` instead of HTTP, a
:class:`~copier.shard.session.ShardSession` and a :class:`~copier.shard.guard.StreamGuard`. Its takeover and
its batches call what ``copier.shard.worker`` and ``copier.shard.pipeline`` call for the control plane
(:meth:`Processor.take_over`, :meth:`Processor.batch`); every sleep a retry makes is time this processor
waited, counted by its :class:`ProcessorClock`.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

from copier.adapters import shardlistings as listings_adapter
from copier.adapters import summaries as summaries_adapter
from copier.adapters import summaryboard as board_adapter
from copier.adapters.awsjson import JsonClient
from copier.adapters.kinesis import KinesisStreams
from copier.adapters.leankinesis import LeanKinesis
from copier.adapters.summaryboard import ApplicationAnswers
from copier.adapters.summaryshare import SummaryShare
from copier.bench.sim.account import Account, Wire
from copier.core.config import Config, parse_config
from copier.core.plan import SourceRecord
from copier.core.positions import Position
from copier.core.shardmap import Listing, ShardMap, key_hashes
from copier.core.state import BoardItem, StateStore
from copier.core.summaryage import Answer
from copier.shard.guard import StreamGuard
from copier.shard.session import ShardSession
from copier.testing.store import InMemoryStateStore

__all__ = ["CountedBoard", "SimClock", "MemoryShare", "Processor", "ProcessorClock", "simulated_adapter", "sim_config"]

STAGING, TARGET = "staging", "target"


def sim_config() -> Config:
    """The configuration every simulated processor runs: the lean path (an endpoint is configured, so no
    botocore), ``copier.ordering = none`` (a target switched to AUTO is seen and forwarded to, not stopped for:
    a processor stopped by a setting waits by design, not on a call) and no dead-letter stream."""
    text = "\n".join(
        [
            "executableName = copier process",
            "applicationName = copier-sim",
            f"streamName = {STAGING}",
            "regionName = us-east-1",
            "kinesisEndpoint = http://127.0.0.1:9",
            "dynamoDBEndpoint = http://127.0.0.1:9",
            f"copier.targetStreamName = {TARGET}",
            "copier.stateTableName = copier-sim-state",
            "copier.dedupKey = json:eventId",
            "copier.ordering = none",
        ]
    )
    return parse_config(text + "\n", "<simulation>")


class SimClock:
    """The simulation's time, seconds from the start of the day."""

    def __init__(self) -> None:
        self.now = 0.0


class ProcessorClock:
    """One processor's clock: the simulation's time plus what this processor has slept since its current step
    began (``lag``: the time its step waited on its calls). The ``Clock`` port (milliseconds) and the
    adapter's ``monotonic`` and ``sleep`` (seconds) at once."""

    EPOCH_MS = 1_800_000_000_000  # the day's start as wall time

    def __init__(self, sim: SimClock) -> None:
        self.sim = sim
        self.lag = 0.0

    def monotonic(self) -> float:
        return self.sim.now + self.lag

    def sleep(self, seconds: float) -> None:
        self.lag += max(0.0, seconds)

    def now_ms(self) -> int:
        return self.EPOCH_MS + int(self.monotonic() * 1000)

    def sleep_ms(self, ms: int) -> None:
        self.sleep(ms / 1000)


class MemoryShare(SummaryShare):
    """A host's shared DescribeStreamSummary answers and shard listings in memory, in place of its files: the
    simulation's calls take no simulated time, so the turn to ask is always free (``SummaryShare.turn`` holds a
    lock only while one call is out)."""

    def __init__(self) -> None:
        super().__init__(Path("/nonexistent"))
        self.answers: dict[str, Answer] = {}
        self.listings: dict[str, Listing] = {}
        self.entries: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    def read(self, stream: str) -> Answer | None:
        return self.answers.get(stream)

    def write(self, stream: str, answer: Answer) -> None:
        self.answers[stream] = answer

    def read_listing(self, stream: str) -> Listing | None:
        return self.listings.get(stream)

    def write_listing(self, stream: str, listing: Listing) -> None:
        self.listings[stream] = listing

    def read_entries(self, stream: str) -> tuple[float, list[dict[str, Any]]] | None:
        return self.entries.get(stream)

    def write_entries(self, stream: str, listed_s: float, shards: list[dict[str, Any]]) -> None:
        self.entries[stream] = (listed_s, shards)

    @contextmanager
    def turn(self, stream: str, wait_s: float = 0.0, what: str = "summary") -> Iterator[bool]:
        yield True


class CountedBoard:
    """The application's answers (``copier.core.summaryboard``) in one state store for the whole simulated
    application, each read and write counted by the account against its item's partition limits (a refused
    one raised as DynamoDB refuses it): what one processor's :class:`ApplicationAnswers` calls."""

    def __init__(self, store: InMemoryStateStore, account: Account, clock: ProcessorClock) -> None:
        self.store, self.account, self.clock = store, account, clock

    def _count(self, api: str, key: str) -> None:
        if not self.account.call(api, key, "copier", self.clock.monotonic()):
            raise self.account.refuse(api)

    def get_posted(self, key: str) -> BoardItem | None:
        self._count("GetItem", key)
        return self.store.get_posted(key)

    def post(self, key: str, seen: BoardItem | None, text: str, expires_ms: int) -> BoardItem:
        self._count("PutItem", key)
        return self.store.post(key, seen, text, expires_ms)


class _TrustedPages(LeanKinesis):
    """The lean client, its ListShards pages not checked field by field (``kinesisanswers.shards_page``): the
    fake's pages are well formed, and checking 1,000 shards a page, every few minutes for each of 10,000
    processors, would be most of the simulation's CPU."""

    def list_shards(self, **params: Any) -> dict[str, Any]:
        return self._call("ListShards", params, lambda page: page)


class _NoCredentials:
    def get_frozen_credentials(self) -> Any:
        raise AssertionError("the simulation signs nothing")


class _Quiet:
    """A logger that drops everything (the simulation counts calls, not log lines)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


_NO_STORE = InMemoryStateStore()  # no state is written: the record path is not simulated
_SHARD_MAPS: dict[tuple[int, int, int], ShardMap] = {}


@contextmanager
def simulated_adapter(seed: int) -> Iterator[None]:
    """While the simulation runs, the Kinesis adapter's jitter (an answer's expiry) is drawn from a generator
    seeded with ``seed``: a day comes out the same each time. And ``ShardListings.shard_map`` builds a
    listing's ShardMap once: the fake answers the same page objects until the stream changes (and a change
    appends shards), so a listing of the same length and first and last entries is the same listing. Each
    processor still lists the stream as often as copier does; only the parsing of the answer is shared."""

    class Memo(ShardMap):
        @classmethod
        def of(cls, shards: Any) -> ShardMap:
            listed = shards if isinstance(shards, list) else list(shards)  # paged_shards' list: not copied
            key = (len(listed), id(listed[0]) if listed else 0, id(listed[-1]) if listed else 0)
            found = _SHARD_MAPS.get(key)
            if found is None:
                found = _SHARD_MAPS[key] = ShardMap.of(listed)
            return found

    names, board, listings = vars(summaries_adapter), vars(board_adapter), vars(listings_adapter)
    saved = listings["ShardMap"], names["random"], board["random"]
    draws = random.Random(seed)
    listings["ShardMap"], names["random"], board["random"] = Memo, draws, draws
    try:
        yield
    finally:
        listings["ShardMap"], names["random"], board["random"] = saved
        _SHARD_MAPS.clear()


class Processor:
    """One staging shard's processor on a host; see the module docstring."""

    def __init__(
        self,
        config: Config,
        account: Account,
        sim: SimClock,
        shard_id: str,
        partition_key: str,
        share: SummaryShare | None,
        application: InMemoryStateStore | None = None,
    ) -> None:
        """``application``: the state store the application's answers are in (None: each host asks alone)."""
        self.shard_id = shard_id
        self.clock = ProcessorClock(sim)
        board = None
        if application is not None:
            counted = cast(StateStore, CountedBoard(application, account, self.clock))  # what the board calls
            board = ApplicationAnswers(config, counted, wall_ms=self.clock.now_ms, sleep=self.clock.sleep)
        self.streams = KinesisStreams(
            config,
            sleep=self.clock.sleep,
            monotonic=self.clock.monotonic,
            lean=_NoCredentials(),
            share=share,
            board=board,
        )
        wire = cast(JsonClient, Wire(account, self.clock))  # what LeanKinesis calls of it: call()
        self.streams._staging = _TrustedPages(wire, self.clock.sleep)  # noqa: SLF001 - the fake in place of HTTP
        self.streams._read = _TrustedPages(wire, self.clock.sleep)  # noqa: SLF001
        self.session = ShardSession(
            config, _NO_STORE, self.streams, self.clock, f"sim:{shard_id}", _Quiet(), None, None
        )
        self.session.shard_id = shard_id
        self.session.key = self.session.key_of(shard_id)
        self.guard = StreamGuard(self.session)
        self.alive = True
        self.partition_key = partition_key  # one that hashes into this shard's range: records put by key
        self.sequence = 0

    @contextmanager
    def _step(self, waits: list[float]) -> Iterator[None]:
        self.clock.lag = 0.0
        try:
            yield
        finally:
            waits.append(self.clock.lag)
            self.clock.lag = 0.0

    def take_over(self, waits: list[float]) -> None:
        """What a takeover asks of the control plane before the first chunk (``ShardWorker.initialize``): the
        history's lineage walk (``History.load``: this shard's parents, from a listing of the staging
        stream, cached ``LINEAGE_MAX_AGE_S``) and the guard's own hash key range (``StreamGuard.own_range``),
        each retried by ``ShardSession.retrying`` as the worker retries them."""
        s = self.session
        with self._step(waits):
            s.retrying("list_parents", lambda: s.streams.parents(s.config.stream_name, self.shard_id))
            self.guard.own_range()

    def batch(self, waits: list[float]) -> None:
        """One chunk's control-plane calls, as ``ChunkPipeline`` makes them (``copier.shard.pipeline``): the
        guard's look at the records and the stream settings, the plan's settings (the target's record
        limit), the digest lifetime's staging retention, and the target shards its keys go to (from a shard
        map at most ``SHARD_MAP_MAX_AGE_S`` old)."""
        s = self.session
        with self._step(waits):
            self.sequence += 1
            record = SourceRecord(Position(self.sequence), self.partition_key, b"{}", s.clock.now_ms())
            hashes = key_hashes([self.partition_key])  # hashed once for the chunk, as the pipeline does
            scattered = self.guard.scattered([record], hashes)
            self.guard.await_streams(refresh=bool(scattered))
            settings = s.settings()
            s.retention(s.config.stream_name)
            s.target_shards(settings.target_stream, [self.partition_key], hashes)

    def target_answer(self) -> Answer | None:
        """The target's DescribeStreamSummary answer this processor acts on now."""
        return self.streams.summaries.held(TARGET)
