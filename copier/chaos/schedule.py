"""What one chaos seed does: a plan drawn from the seed alone, so a seed can be run again.

Pure: ``draw(seed, profile)`` returns the same :class:`Plan` every time. The
plan fixes the pipeline's shape (workers, shards, the KCL's mode), what the
producer writes (plain and KPL-aggregated records, producer duplicates,
late duplicates, poison records) and the faults, each at a time after the
start: process faults, workers joining and leaving, reshards, and windows
in which the proxy injects AWS faults into the copier's calls.

What cannot be fixed by a seed is the interleaving of real processes (which
request a proxy fault hits, where a SIGKILL lands in a batch): a run of the
same seed injects the same faults at the same times, not into the same
requests. The results record what was injected.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from copier.chaos.proxy import FAULT_KINDS

__all__ = ["PROCESS_FAULTS", "Action", "Plan", "Profile", "FULL", "SMOKE", "draw"]

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


FULL = Profile("full", (2, 4), (2, 4), (3000, 6000), 60.0, (3, 7), (0, 2), (2, 5), (3, 8), 300.0, 120.0)
SMOKE = Profile("smoke", (2, 3), (2, 3), (1200, 1800), 30.0, (2, 3), (1, 1), (2, 3), (2, 4), 240.0, 40.0)


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
    poison = tuple(rng.choice(["no_id", "not_json", "oversize"]) for _ in range(rng.randint(*profile.poison)))
    return Plan(
        seed=seed,
        profile=profile.name,
        kcl_mode=rng.choice(["3.x", "2.x"]),
        workers=rng.randint(*profile.workers),
        staging_shards=rng.randint(*profile.staging_shards),
        target_shards=rng.randint(2, 3),
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
    )
