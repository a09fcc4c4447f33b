"""A simulated day of an account running copier: discrete events on a heap, no threads, no sleeps.

The day (times from its start; :class:`Day`'s fields hold the numbers):

* **fleet start** (00:00): every host boots within ``start_spread_s``; its ``check-config --shared`` and its
  ``copier run`` check the streams (``preflight.stream_verdicts``: DescribeStreamSummary of staging and target,
  through the application's answers), then its KCL worker
  lists the staging stream once (the KCL's shard sync) and is given its shards' leases within
  ``assign_s``; each processor takes its shard over (:meth:`Processor.take_over`), the KCL gets it a shard
  iterator, and it forwards a batch every ``interval_s`` from a random phase.
* **reshards**: ``reshard_share`` of the staging shards split at 03:00, one SplitShard every ``split_gap_s``
  (Kinesis splits one shard of a stream at a time); a parent's processor ends and its host takes the two
  children over. The target likewise at 04:00 (processors see it in their next shard map). Each pair of
  children is merged back, staging from 15:00 and the target from 16:00.
* **AUTO switches**: the target's RecordDistributionStrategy AUTO at 06:00 and back at 08:00, its
  MaxRecordSize raised to 10 MiB at 09:00: seen through DescribeStreamSummary (each processor's lag is kept).
* **a host loss** (12:00): one host stops; its leases expire after ``lease_s`` and other hosts take its shards
  over, each successor verifying a chunk in flight (GetShardIterator on ``verify_shards`` target shards).
* **a rolling deploy** (18:00): every host replaced by a new one, one every ``deploy_step_s``; the new host
  starts as at the fleet start and takes the old one's shards (graceful handoff).

A batch stands for a processor's chunks over ``interval_s``: the record path's GetRecords, PutRecords and
state writes are not simulated call by call (GetRecords is the KCL's, one every ``idle_s`` a shard: reported
as that rate); every control-plane call copier makes is.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from copier.bench.sim.account import Account, Stream
from copier.bench.sim.processors import (
    STAGING,
    TARGET,
    MemoryShare,
    Processor,
    SimClock,
    sim_config,
    simulated_adapter,
)
from copier.core.config import Config
from copier.core.errors import AwsError
from copier.core.shardmap import hash_key
from copier.core.streamsettings import AUTO, PARTITION_KEY
from copier.testing.store import InMemoryStateStore

__all__ = ["Day", "Outcome", "simulate"]

HOUR = 3600.0
DAY_S = 24 * HOUR


@dataclass(frozen=True)
class Day:
    """What is simulated: the fleet, the day's events and how a batch stands for forwarding."""

    shards: int = 1000
    shards_per_host: int = 16
    # One batch per processor per interval stands for its chunks' control-plane calls. 301 s: a processor's
    # shard map (SHARD_MAP_MAX_AGE_S, 300 s) is listed again at every batch, as often as chunks every second
    # would list it; a host of 16 looks at its shared answers every 19 s or so.
    interval_s: float = 301.0
    shared: bool = True  # False: each processor asks DescribeStreamSummary for itself (before the host share)
    application: bool = True  # False: each host asks for itself (before the application's answers)
    enforce: bool = True  # False: the account counts without refusing (what copier would ask unthrottled)
    seed: int = 47
    duration_s: float = DAY_S
    start_spread_s: float = 300.0  # hosts boot within this (an autoscaling group's launch)
    assign_s: float = 20.0  # a worker is given its leases within this (the KCL leader's assignment interval)
    lease_s: float = 10.0  # a lost host's leases expire after this (failoverTimeMillis)
    reshard_share: float = 0.01  # the staging (and target) shards split, then merged back
    split_gap_s: float = 10.0
    verify_shards: int = 4  # target shards a successor reads to verify a chunk in flight
    idle_s: float = 1.0  # the KCL's idleTimeBetweenReadsInMillis: one GetRecords a shard this often
    deploy_step_s: float = 20.0  # a rolling deploy replaces one host this often


@dataclass
class Outcome:
    """What the day did: the account's counts, the processors' waits and how late each switch was seen."""

    day: Day
    account: Account
    hosts: int
    batches: int = 0
    batch_waits: list[float] = field(default_factory=list)  # seconds a batch waited on its calls
    takeover_waits: list[float] = field(default_factory=list)
    preflight_failures: int = 0
    switch_lag: dict[str, float] = field(default_factory=dict)  # switch -> the latest any processor saw it


class _Keys:
    """A partition key for each shard that hashes into its range (records are put by key): keys ``k0``,
    ``k1``, ... hashed in order until every shard asked about has one."""

    def __init__(self) -> None:
        self._next = 0
        self._found: dict[tuple[int, int], str] = {}
        self._spare: list[tuple[int, str]] = []

    def for_range(self, low: int, high: int) -> str:
        found = self._found.get((low, high))
        if found is not None:
            return found
        for hashed, key in self._spare:
            if low <= hashed <= high:
                self._found[(low, high)] = key
                return key
        while True:
            key = f"k{self._next}"
            self._next += 1
            hashed = hash_key(key)
            if len(self._spare) < 200_000:
                self._spare.append((hashed, key))
            if low <= hashed <= high:
                self._found[(low, high)] = key
                return key


class _Host:
    def __init__(self, number: int, shared: bool) -> None:
        self.number = number
        self.share = MemoryShare() if shared else None
        self.processors: dict[str, Processor] = {}
        self.alive = True


class _Run:
    """The event loop and the day's events (module docstring)."""

    def __init__(self, day: Day) -> None:
        self.day = day
        self.rng = random.Random(day.seed)
        self.sim = SimClock()
        self.staging = Stream.even(STAGING, day.shards)
        self.target = Stream.even(TARGET, day.shards)
        self.account = Account([self.staging, self.target], enforce=day.enforce)
        self.config: Config = sim_config()
        self.keys = _Keys()
        self.application = InMemoryStateStore() if day.application else None  # the state table's answers
        self.hosts: list[_Host] = []
        self.owner: dict[str, _Host] = {}  # staging shard -> its host
        self.out = Outcome(day, self.account, hosts=math.ceil(day.shards / day.shards_per_host))
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        # a switch -> when it was made, whether a processor acts on it, and the processors running then that
        # have not acted on it yet
        self._switches: dict[str, tuple[float, Callable[[Processor], bool], set[Processor]]] = {}

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def run(self) -> Outcome:
        self._plan()
        with simulated_adapter(self.day.seed):
            while self._events:
                when, _, action = heapq.heappop(self._events)
                if when > self.day.duration_s:
                    break
                self.sim.now = when
                action()
        return self.out

    # -- the day's events ---------------------------------------------------------------------------------

    def _plan(self) -> None:
        d = self.day
        shards = self.staging.open_ids()
        for number in range(self.out.hosts):
            host = _Host(number, d.shared)
            self.hosts.append(host)
            mine = shards[number * d.shards_per_host : (number + 1) * d.shards_per_host]
            self.at(self.rng.uniform(0, d.start_spread_s), partial(self._boot, host, mine))
        self._reshard(self.staging, 3 * HOUR, 15 * HOUR)
        self._reshard(self.target, 4 * HOUR, 16 * HOUR)
        self._switch("target AUTO", 6 * HOUR, lambda: setattr(self.target, "distribution", AUTO), AUTO)
        self._switch(
            "target USER_PARTITION_KEY",
            8 * HOUR,
            lambda: setattr(self.target, "distribution", PARTITION_KEY),
            PARTITION_KEY,
        )
        self._switch("target MaxRecordSize 10 MiB", 9 * HOUR, lambda: setattr(self.target, "max_record_kib", 10240))
        self.at(12 * HOUR, self._lose_host)
        self.at(18 * HOUR, self._deploy)

    def _boot(self, host: _Host, shards: list[str]) -> None:
        """A host's start: the service's ``check-config --shared`` (``ExecStartPre``), then its ``copier run``,
        each checking the streams (the preflight's DescribeStreamSummary of each, through the application's
        answers when there are, with botocore's standard retries: three attempts; still throttled, it says so
        and the start goes on, ``preflight.check_before_run``), ``copier run``'s answers kept in the run's share
        as the processors' first; then the KCL's shard sync, then its leases."""
        lag = 0.0
        for share in (None, host.share):  # check-config has no run share; copier run has the run's
            checker = Processor(self.config, self.account, self.sim, "preflight", "", share, self.application)
            checker.clock.lag = lag
            for name in (STAGING, TARGET):
                for tries in range(3):
                    try:
                        checker.streams.summaries.starting(name)
                        break
                    except AwsError:
                        checker.clock.sleep(self.rng.uniform(0, 2**tries))
                else:
                    self.out.preflight_failures += 1
                    break
            lag = checker.clock.lag
        ready = self.sim.now + lag
        self.at(ready, lambda: self._kcl_sync(ready))
        for shard_id in shards:
            self.at(ready + self.rng.uniform(0, self.day.assign_s), partial(self._start, host, shard_id))

    def _kcl_sync(self, now: float) -> None:
        """The KCL worker's shard sync at its start: the staging stream listed once (counted as the KCL's)."""
        pages = self.staging.pages()
        for n in range(len(pages)):
            self.account.call("ListShards", STAGING, "kcl", now + n * 0.01)

    def _start(self, host: _Host, shard_id: str) -> None:
        if not host.alive or self.owner.get(shard_id) not in (None, host):
            return
        keys = self.staging.entry(shard_id)["HashKeyRange"]
        key = self.keys.for_range(int(keys["StartingHashKey"]), int(keys["EndingHashKey"]))
        processor = Processor(self.config, self.account, self.sim, shard_id, key, host.share, self.application)
        host.processors[shard_id] = processor
        self.owner[shard_id] = host
        processor.take_over(self.out.takeover_waits)
        self.account.call("GetShardIterator", f"{STAGING}/{shard_id}", "kcl", self.sim.now)
        self.at(self.sim.now + self.rng.uniform(0, self.day.interval_s), lambda: self._batch(processor))

    def _batch(self, processor: Processor) -> None:
        if not processor.alive:
            return
        processor.batch(self.out.batch_waits)
        self.out.batches += 1
        for name, (since, seen, pending) in self._switches.items():
            if processor in pending and seen(processor):
                pending.discard(processor)
                self.out.switch_lag[name] = max(self.out.switch_lag.get(name, 0.0), self.sim.now - since)
        self.at(self.sim.now + self.day.interval_s, lambda: self._batch(processor))

    def _stop(self, host: _Host, shard_id: str) -> None:
        processor = host.processors.pop(shard_id, None)
        if processor is not None:
            processor.alive = False
        if self.owner.get(shard_id) is host:
            del self.owner[shard_id]

    def _reshard(self, stream: Stream, split_at: float, merge_at: float) -> None:
        count = max(1, int(self.day.shards * self.day.reshard_share))
        parents = self.rng.sample(stream.open_ids(), count)
        children: list[list[str]] = []

        def split(parent: str) -> None:
            made = stream.split(parent)
            children.append(made)
            if stream is self.staging:
                self._hand_on([parent], made)

        def merge(n: int) -> None:
            pair = children[n]
            made = stream.merge(pair[0], pair[1])
            if stream is self.staging:
                self._hand_on(pair, [made])

        for n, parent in enumerate(parents):
            self.at(split_at + n * self.day.split_gap_s, partial(split, parent))
        for n in range(count):
            self.at(merge_at + n * self.day.split_gap_s, partial(merge, n))

    def _hand_on(self, parents: list[str], children: list[str]) -> None:
        """A staging shard ended: its processor stops (the KCL learns its children from GetRecords), and the
        parent's host takes the children over once the lease assignment runs."""
        host = self.owner.get(parents[0])
        for parent in parents:
            owner = self.owner.get(parent)
            if owner is not None:
                self._stop(owner, parent)
        if host is None or not host.alive:
            host = self.rng.choice([h for h in self.hosts if h.alive])
        for child in children:
            self.at(self.sim.now + self.rng.uniform(0, self.day.assign_s), partial(self._start, host, child))

    def _switch(self, name: str, when: float, change: Callable[[], None], value: str | None = None) -> None:
        """``change`` the target at ``when``; each processor's first batch acting on it is when it saw it
        (``value``: the distribution it is seen as; None: the raised record limit)."""

        def seen(p: Processor) -> bool:
            answer = p.target_answer()
            if answer is None or answer.settings is None or answer.fetched_s is None or answer.fetched_s < when:
                return False
            if value is None:
                return answer.settings.max_record_bytes == 10240 * 1024
            return answer.settings.distribution == value

        def apply() -> None:
            change()
            running = {p for h in self.hosts if h.alive for p in h.processors.values()}
            self._switches[name] = (when, seen, running)

        self.at(when, apply)

    def _lose_host(self) -> None:
        host = self.hosts[0]
        host.alive = False
        lost = list(host.processors)
        for shard_id in lost:
            self._stop(host, shard_id)
        others = [h for h in self.hosts if h.alive]
        for shard_id in lost:
            heir = self.rng.choice(others)
            when = self.sim.now + self.day.lease_s + self.rng.uniform(0, self.day.assign_s)
            self.at(when, partial(self._succeed, heir, shard_id))

    def _succeed(self, host: _Host, shard_id: str) -> None:
        """A successor's takeover: as any, plus the chunk in flight verified by reading the target shards its
        keys went to (a shard iterator each; the reads themselves are GetRecords, the record path's)."""
        self._start(host, shard_id)
        for target_shard in self.rng.sample(self.target.open_ids(), self.day.verify_shards):
            self.account.call("GetShardIterator", f"{TARGET}/{target_shard}", "copier", self.sim.now)

    def _deploy(self) -> None:
        step = self.day.deploy_step_s
        for n, old in enumerate([h for h in self.hosts if h.alive]):
            self.at(self.sim.now + n * step, partial(self._replace, old))

    def _replace(self, old: _Host) -> None:
        new = _Host(len(self.hosts), self.day.shared)
        self.hosts.append(new)
        shards = list(old.processors)
        for shard_id in shards:
            self._stop(old, shard_id)
        old.alive = False
        self._boot(new, shards)


def simulate(day: Day) -> Outcome:
    """Run ``day`` (see the module docstring)."""
    return _Run(day).run()


def phase_of(second: int) -> str:
    """The day's event a second falls in, for the report."""
    events = [(0, "fleet start"), (3 * HOUR, "staging reshard"), (4 * HOUR, "target reshard")]
    events += [(6 * HOUR, "target AUTO"), (8 * HOUR, "target back"), (9 * HOUR, "record limit raised")]
    events += [(12 * HOUR, "host loss"), (15 * HOUR, "staging merges"), (16 * HOUR, "target merges")]
    events += [(18 * HOUR, "rolling deploy")]
    starts = [start for start, _ in events]
    return events[max(0, bisect_right(starts, second) - 1)][1]
