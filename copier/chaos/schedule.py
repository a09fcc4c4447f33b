"""What one chaos seed does: a plan drawn from the seed alone, so a seed can be run again.

Pure: ``draw(seed, profile)`` returns the same :class:`Plan` every time. The
plan fixes the pipeline's shape (workers, shards, the KCL's mode), what the
producer writes (plain and KPL-aggregated records, producer duplicates,
late duplicates, poison records) and the faults, each at a time after the
start: process faults, workers joining and leaving, reshards of the staging
and of the target stream, windows in which the proxy injects AWS faults into
the copier's calls, host clocks off AWS time and stepped while they run, and
the settings each worker start runs with (a rolling deploy between owners),
and switches of the staging or the target stream to
``RecordDistributionStrategy = AUTO`` and back (Kinesis then ignores partition
keys: the producer's late duplicates land on any staging shard, the
copier's puts on any target shard).

The four later kinds (clocks, settings, target reshards, AUTO switches) are drawn from
generators of their own, seeded from the seed: with them, a seed draws its
earlier faults as before (the same kinds at the same times).

What cannot be fixed by a seed is the interleaving of real processes (which
request a proxy fault hits, where a SIGKILL lands in a batch): a run of the
same seed injects the same faults at the same times, not into the same
requests. The results record what was injected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from copier.chaos.proxy import AMBIGUOUS_PUTS, FAULT_KINDS

__all__ = [
    "AUTO_SWITCHES",
    "BASE_SETTINGS",
    "CLOCK_KINDS",
    "DEDUP_KEYS",
    "POISON_KINDS",
    "PROCESS_FAULTS",
    "TARGET_RESHARDS",
    "UNKEYED_POLICIES",
    "Action",
    "HostClock",
    "Plan",
    "Profile",
    "Settings",
    "FULL",
    "LIMITS",
    "PROFILES",
    "SMOKE",
    "draw",
    "on_backend",
]

PROCESS_FAULTS = (
    "kill_processor",  # SIGKILL one copier process (its daemon exits too, and is restarted)
    "kill_daemon",  # SIGKILL a worker's JVM only: its processors lose their daemon mid-batch
    "kill_host",  # SIGKILL a worker's JVM and every processor it spawned
    "pause_processor",  # SIGSTOP one copier process, SIGCONT after a while
    "pause_daemon",  # SIGSTOP a worker's JVM, SIGCONT after a while
    "worker_join",  # one more worker
    "worker_leave",  # SIGTERM a worker: the KCL hands its leases over, copier releases its own
)
RESHARDS = ("split", "merge")
TARGET_RESHARDS = ("target_split", "target_merge")  # {"ambiguous_put": a put fault}: at one on the target
AUTO_SWITCHES = ("staging_auto", "target_auto")  # {"seconds": how long the stream ignores partition keys}
CLOCK_KINDS = (
    "none",  # on AWS time
    "within",  # off by up to half of copier.clockSkewMillis: the protocol's assumption holds
    "beyond",  # off by several times copier.clockSkewMillis: the copier must measure it and widen its margins
)
DEDUP_KEYS = ("json:eventId", "json:meta.alt")  # the producer's meta.alt is one to one with eventId
UNKEYED_POLICIES = ("deadletter", "forward")
POISON_KINDS = ("no_id", "not_json", "oversize")  # copier.chaos.producer writes each as its name says
DEFAULT_SKEW_MS = 200  # copier.clockSkewMillis of a seed without clock faults (copier.local.pipeline's)
SETTINGS_STARTS = 16  # settings drawn for this many worker starts; later starts take them again in turn


@dataclass(frozen=True)
class Action:
    """Something the harness does ``at_s`` seconds after the run starts."""

    at_s: float
    kind: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    """The proxy injects ``kind`` into a ``rate`` of the matching requests from ``start_s`` for ``length_s``."""

    kind: str
    start_s: float
    length_s: float
    rate: float


@dataclass(frozen=True)
class HostClock:
    """How far a host's clock is off AWS time when its first worker starts (``offset_ms``: local minus AWS).

    The harness runs the host's ``copier process`` children under libfaketime
    (``copier.chaos.clocks``); ``clock_step`` actions move it while it runs.
    """

    kind: str  # one of CLOCK_KINDS
    offset_ms: int


@dataclass(frozen=True)
class Settings:
    """What one worker start's properties file sets of the plan settings (the rest is the same for all)."""

    dedup_key: str  # one of DEDUP_KEYS
    unkeyed_policy: str  # one of UNKEYED_POLICIES


BASE_SETTINGS = Settings("json:eventId", "deadletter")


@dataclass(frozen=True)
class Profile:
    """Sizes a plan is drawn within: the full suite's, or the short run inside ``make test``."""

    name: str
    workers: tuple[int, int]
    staging_shards: tuple[int, int]
    events: tuple[int, int]
    produce_s: float
    process_faults: tuple[int, int]
    reshards: tuple[int, int]
    windows: tuple[int, int]
    poison: tuple[int, int]
    catch_up_s: float
    late_at_s: float  # when the first events are written again (about that long after the originals)
    clock_share: float  # share of seeds whose hosts' clocks are off AWS time (and stepped)
    clock_skews_ms: tuple[int, ...]  # copier.clockSkewMillis of such a seed, one of these
    clock_steps: tuple[int, int]  # clock steps in such a seed
    settings_share: float  # share of seeds whose worker starts run with changing settings
    target_reshards: tuple[int, int]
    forced: bool  # every seed has each later kind of fault, the interesting cases first (make test runs two)
    auto_share: float = 0.5  # share of seeds with each AUTO switch (a forced profile has both)
    shard_limits: bool = False  # the proxy enforces Kinesis' per-shard limits (copier.chaos.limits)
    event_bytes: int = 80  # the filler each event carries: how many bytes the producer writes
    target_shards: tuple[int, int] = (2, 3)


FULL = Profile(
    "full",
    (2, 4),
    (2, 4),
    (3000, 6000),
    60.0,
    (3, 7),
    (0, 2),
    (2, 5),
    (3, 8),
    300.0,
    120.0,
    clock_share=0.6,
    clock_skews_ms=(200, 500, 1000),
    clock_steps=(1, 3),
    settings_share=0.6,
    target_reshards=(0, 2),
    forced=False,
)
SMOKE = Profile(
    "smoke",
    (2, 3),
    (2, 3),
    (1200, 1800),
    30.0,
    (2, 3),
    (1, 1),
    (2, 3),
    (2, 4),
    240.0,
    40.0,
    clock_share=1.0,
    clock_skews_ms=(200,),
    clock_steps=(2, 2),
    settings_share=1.0,
    target_reshards=(1, 1),
    forced=True,
)
# Kinesis' per-shard limits on the copier's target calls and the producer's staging writes: no proxy fault
# windows, few other faults. 8 KiB events, 1,500 to 2,500 of them in 15 s, are 0.8 to 1.3 MiB/s written to
# the one staging shard, with KPL aggregates of up to 2.4 MiB in one tick: the producer writes staging at and
# over its shard's 1 MiB/s. The target has one shard too: the copier forwards every event of an aggregate as
# a record of its own, and its catch-up after a process fault (puts of up to 5 MiB) meets the target's limits.
LIMITS = Profile(
    "limits",
    (2, 2),
    (1, 1),
    (1500, 2500),
    15.0,
    (1, 2),
    (0, 0),
    (0, 0),
    (1, 2),
    300.0,
    25.0,
    clock_share=0.0,
    clock_skews_ms=(DEFAULT_SKEW_MS,),
    clock_steps=(0, 0),
    settings_share=0.0,
    target_reshards=(0, 0),
    forced=False,
    auto_share=0.0,
    shard_limits=True,
    event_bytes=8192,
    target_shards=(1, 1),
)
PROFILES = {p.name: p for p in (FULL, SMOKE, LIMITS)}


@dataclass(frozen=True)
class Plan:
    """Everything a seed does; see the module docstring."""

    seed: int
    profile: str
    kcl_mode: str  # "3.x" (the default, with a leader) or "2.x" (compatible mode: workers take leases themselves)
    workers: int
    staging_shards: int
    target_shards: int
    events: int
    produce_s: float
    aggregate_share: float  # share of the producer's batches written as KPL aggregates
    aggregate_events: tuple[int, int]  # events an aggregate carries
    retry_share: float  # share of batches whose slice is written again at once (a task retry)
    late_duplicates: int  # the first events, written again at late_at_s
    late_at_s: float
    poison: tuple[str, ...]  # "no_id", "not_json", "oversize"
    actions: tuple[Action, ...]
    windows: tuple[Window, ...]
    catch_up_s: float
    clock_skew_ms: int = DEFAULT_SKEW_MS  # copier.clockSkewMillis of every worker
    clocks: tuple[HostClock, ...] = ()  # the n-th host's clock (in the order hosts first start); (): none faked
    settings: tuple[Settings, ...] = (BASE_SETTINGS,)  # the n-th worker start's settings, taken in turn
    shard_limits: bool = False  # the proxy enforces Kinesis' per-shard limits
    event_bytes: int = 80  # each event's filler

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "profile": self.profile,
            "kcl_mode": self.kcl_mode,
            "workers": self.workers,
            "staging_shards": self.staging_shards,
            "target_shards": self.target_shards,
            "events": self.events,
            "aggregate_share": self.aggregate_share,
            "late_duplicates": self.late_duplicates,
            "late_at_s": self.late_at_s,
            "poison": list(self.poison),
            "actions": [{"at_s": a.at_s, "kind": a.kind, **a.params} for a in self.actions],
            "windows": [w.__dict__ for w in self.windows],
            "clock_skew_ms": self.clock_skew_ms,
            "clocks": [c.__dict__ for c in self.clocks],
            "settings": [s.__dict__ for s in self.settings],
            "shard_limits": self.shard_limits,
            "event_bytes": self.event_bytes,
        }


def _process_fault(rng: random.Random, at: float, lease_s: float) -> Action:
    kind = rng.choice(PROCESS_FAULTS)
    params: dict[str, Any] = {}
    if kind.startswith("pause"):
        longer = rng.random() < 0.5
        params["seconds"] = round(
            rng.uniform(lease_s * 1.5, lease_s * 4) if longer else rng.uniform(0.3, lease_s / 2), 1
        )
        params["past_lease"] = longer
    return Action(round(at, 1), kind, params)


def _window(rng: random.Random, produce_s: float) -> Window:
    """A proxy fault window while the producer writes: an outage is total and short, the rest partial."""
    kind = rng.choice(FAULT_KINDS)
    if kind == "state_outage":
        return Window(kind, round(rng.uniform(15, produce_s), 1), round(rng.uniform(3, 10), 1), 1.0)
    return Window(kind, round(rng.uniform(15, produce_s), 1), round(rng.uniform(8, 25), 1), rng.choice([0.1, 0.3, 0.6]))


def draw(seed: int, profile: Profile = FULL, lease_s: float = 3.0) -> Plan:
    """The plan of ``seed``; ``lease_s`` is the lease the pipeline runs with (pauses are drawn around it)."""
    rng = random.Random(seed)
    produce = profile.produce_s
    faults = sorted(
        (
            _process_fault(rng, rng.uniform(12, produce + 20), lease_s)
            for _ in range(rng.randint(*profile.process_faults))
        ),
        key=lambda a: a.at_s,
    )
    reshards = [
        Action(round(rng.uniform(10, produce), 1), rng.choice(RESHARDS)) for _ in range(rng.randint(*profile.reshards))
    ]
    windows = tuple(
        sorted((_window(rng, produce) for _ in range(rng.randint(*profile.windows))), key=lambda w: w.start_s)
    )
    poison = tuple(rng.choice(POISON_KINDS) for _ in range(rng.randint(*profile.poison)))
    if profile.forced:  # every kind, drawn without touching the generator (the rest of the plan stays the same)
        poison += tuple(k for k in POISON_KINDS if k not in poison)
    plan = Plan(
        seed=seed,
        profile=profile.name,
        kcl_mode=rng.choice(["3.x", "2.x"]),
        workers=rng.randint(*profile.workers),
        staging_shards=rng.randint(*profile.staging_shards),
        target_shards=rng.randint(*profile.target_shards),
        events=rng.randint(*profile.events),
        produce_s=produce,
        aggregate_share=round(rng.uniform(0.2, 0.6), 2),
        aggregate_events=(50, 300),
        retry_share=round(rng.uniform(0.1, 0.3), 2),
        late_duplicates=rng.randint(20, 80),
        late_at_s=profile.late_at_s,
        poison=poison,
        actions=tuple(sorted(faults + reshards, key=lambda a: a.at_s)),
        windows=windows,
        catch_up_s=profile.catch_up_s,
        shard_limits=profile.shard_limits,
        event_bytes=profile.event_bytes,
    )
    return _later_faults(plan, profile)


#: What a plan may hold that a backend cannot serve: kinesis-mock 0.6.2 has neither UpdateMaxRecordSize (no
#: record over 1 MiB, so no ``oversize`` poison) nor RecordDistributionStrategy (no AUTO switch).
UNSERVED = {"moto": (), "independent": ("oversize", *AUTO_SWITCHES)}


def on_backend(plan: Plan, backend: str) -> Plan:
    """``plan`` without what ``backend`` (``copier local-backend --impl``) cannot serve (:data:`UNSERVED`);
    the rest of the plan is the seed's as drawn."""
    unserved = UNSERVED[backend]
    return replace(
        plan,
        poison=tuple(p for p in plan.poison if p not in unserved),
        actions=tuple(a for a in plan.actions if a.kind not in unserved),
    )


def _later_faults(plan: Plan, profile: Profile) -> Plan:
    """Add the clock, settings and target-reshard faults, each from its own generator (see the module docstring)."""
    hosts = plan.workers + sum(1 for a in plan.actions if a.kind == "worker_join")
    skew, clocks, steps = _clocks(random.Random(f"{plan.seed}:clocks"), profile, hosts)
    settings = _settings(random.Random(f"{plan.seed}:settings"), profile)
    reshards = _target_reshards(random.Random(f"{plan.seed}:target"), profile)
    switches = _auto_switches(random.Random(f"{plan.seed}:auto"), profile)
    return replace(
        plan,
        clock_skew_ms=skew,
        clocks=clocks,
        settings=settings,
        actions=tuple(sorted(plan.actions + steps + reshards + switches, key=lambda a: a.at_s)),
    )


def _host_clock(rng: random.Random, kind: str, skew_ms: int) -> HostClock:
    """A clock of ``kind``: within is 10% to 50% of the skew off (either way), beyond 3 to 8 times the skew."""
    if kind == "none":
        return HostClock(kind, 0)
    sign = rng.choice((1, -1))
    low, high = (0.1, 0.5) if kind == "within" else (3.0, 8.0)
    return HostClock(kind, sign * round(rng.uniform(low, high) * skew_ms))


def _clocks(rng: random.Random, profile: Profile, hosts: int) -> tuple[int, tuple[HostClock, ...], tuple[Action, ...]]:
    """copier.clockSkewMillis, each host's clock, and the clock steps (2 to 6 times the skew, either way).

    A forced profile has a host beyond the margin and steps both forward and back.
    """
    if rng.random() >= profile.clock_share:
        return DEFAULT_SKEW_MS, (), ()
    skew = rng.choice(profile.clock_skews_ms)
    clocks = [_host_clock(rng, rng.choice(CLOCK_KINDS), skew) for _ in range(hosts)]
    if profile.forced and all(c.kind != "beyond" for c in clocks):
        clocks[0] = _host_clock(rng, "beyond", skew)
    steps = []
    for n in range(rng.randint(*profile.clock_steps)):
        sign = (1, -1)[n % 2] if profile.forced else rng.choice((1, -1))
        at = round(rng.uniform(5, profile.produce_s + 20), 1)
        steps.append(Action(at, "clock_step", {"step_ms": sign * round(rng.uniform(2.0, 6.0) * skew)}))
    return skew, tuple(clocks), tuple(steps)


def _settings(rng: random.Random, profile: Profile) -> tuple[Settings, ...]:
    """The settings of successive worker starts; a forced profile changes both between the first two."""
    if rng.random() >= profile.settings_share:
        return (BASE_SETTINGS,)
    starts = [Settings(rng.choice(DEDUP_KEYS), rng.choice(UNKEYED_POLICIES)) for _ in range(SETTINGS_STARTS)]
    if profile.forced:
        starts[:2] = [BASE_SETTINGS, Settings("json:meta.alt", "forward")]
    return tuple(starts)


def _target_reshards(rng: random.Random, profile: Profile) -> tuple[Action, ...]:
    """Target splits and merges; most of them (a forced profile's first) at an ambiguous target put.

    An ambiguous one names a put fault (``ambiguous_put``: put_timeout or put_lost_response): the
    harness opens a window of that fault on the target's puts, waits for the proxy to inject it once,
    and reshards at that moment, so that the copier verifies that put across the reshard. It is drawn
    in the first 20% of the producer's time, while target puts are still to come: the producer's
    aggregates of 50 to 300 events use the plan's events up early (the last new event of smoke seeds
    8 and 10 is written 12.5 and 8 s into their 30 s, of full seeds 1 to 5 20 to 31.5 s into 60),
    and a reshard that waits from later may see no target put at all.
    """
    actions = []
    for n in range(rng.randint(*profile.target_reshards)):
        kind = rng.choice(TARGET_RESHARDS)
        put: str | None = None
        if (profile.forced and n == 0) or rng.random() < 0.6:
            at, put = rng.uniform(2, 0.2 * profile.produce_s), rng.choice(AMBIGUOUS_PUTS)
        else:
            at = rng.uniform(10, profile.produce_s)
        actions.append(Action(round(at, 1), kind, {"ambiguous_put": put}))
    return tuple(actions)


def _auto_switches(rng: random.Random, profile: Profile) -> tuple[Action, ...]:
    """Switches of a stream to AUTO and back, each while something is written to it.

    The staging stream ignores keys around the moment the producer writes its late duplicates (plain
    records: a KPL aggregate put under AUTO lands where the KCL drops its user records, a loss the
    producer avoids by writing none while the switch lasts), so they land on other shards than their
    originals; the target ignores keys early, while the copier is putting the bulk of the events.
    """
    actions = []
    if profile.forced or rng.random() < profile.auto_share:
        at = profile.late_at_s - rng.uniform(0.5, 2.0)
        actions.append(Action(round(at, 1), "staging_auto", {"seconds": round(rng.uniform(4.0, 8.0), 1)}))
    if profile.forced or rng.random() < profile.auto_share:
        at = rng.uniform(2, 0.2 * profile.produce_s)
        actions.append(Action(round(at, 1), "target_auto", {"seconds": round(rng.uniform(5.0, 10.0), 1)}))
    return tuple(actions)
