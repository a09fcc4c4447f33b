"""The chaos suite's hosts: what each worker start runs with (its properties file, its host's clock).

A *host* is where a worker runs. Its clock outlives a restart of its worker
(systemd restarting ``copier run`` on the same machine): the harness
restarts a dead worker on its host, and a worker that joins is a new host.
Its properties do not: each worker start, restarts included, takes the
plan's next :class:`~copier.chaos.schedule.Settings`, as a rolling deploy
would (``copier.dedupKey`` and ``copier.unkeyedPolicy`` changing between
the owners of a shard).

In a seed with clock faults, every host's processors run under libfaketime
(``copier.chaos.clocks``; a host drawn "none" at offset 0, so that a clock
step can hit it too), and the worker's ``executableName`` is the wrapper.
What was injected, and what the processors measured of it (the
``clock_bound`` and ``clock_margin_widened`` lines of their logs), go into
the seed's results (:meth:`Hosts.clock_results`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from copier.chaos.check import copier_events
from copier.chaos.clocks import find_libfaketime, noted_pids, remove_stale_shm, running, write_offset, write_wrapper
from copier.chaos.schedule import HostClock, Plan, Settings
from copier.core.config import load_config
from copier.local.pipeline import LocalPipeline, local_properties

__all__ = ["Host", "Hosts", "Start"]

MEASURED_OFFSETS = 8  # distinct measured offsets kept in a host's results


@dataclass
class Host:
    """One host: its drawn clock, where its clock stands now, its workers and the steps it took."""

    number: int
    clock: HostClock
    offset_ms: int
    clock_file: Path | None  # None: its processors run on the real clock
    workers: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Start:
    """One worker start: which worker, on which host, with which settings and clock offset."""

    worker: str
    host: int
    settings: Settings
    offset_ms: int | None  # None: not under libfaketime


class Hosts:
    """The hosts and worker starts of one seed; see the module docstring."""

    def __init__(self, plan: Plan, pipeline: LocalPipeline) -> None:
        self.plan = plan
        self.pipeline = pipeline
        self.library = find_libfaketime() if plan.clocks else None
        self.hosts: list[Host] = []
        self.starts: list[Start] = []
        self.host_of: dict[str, Host] = {}
        self.pids = pipeline.workdir / "faketime-pids"  # every processor run under libfaketime

    def new_host(self) -> Host:
        """The next host, on the plan's next clock (its clock file written, when the seed fakes clocks)."""
        number = len(self.hosts) + 1
        clocks = self.plan.clocks
        clock = clocks[(number - 1) % len(clocks)] if clocks else HostClock("none", 0)
        clock_file = None
        if self.library is not None:
            clock_file = self.pipeline.workdir / f"host-{number}.faketime"
            write_offset(clock_file, clock.offset_ms)
        host = Host(number, clock, clock.offset_ms, clock_file)
        self.hosts.append(host)
        return host

    def properties(self, host: Host, worker: str) -> Path:
        """Write the properties file ``worker`` starts with on ``host``: the next settings, and for a faked
        clock the wrapper as ``executableName``. Loaded once here, so that a bad file fails the seed at once."""
        settings = self.plan.settings[len(self.starts) % len(self.plan.settings)]
        p = self.pipeline
        path = p.workdir / f"worker-{worker}.properties"
        kcl = dict(p.kcl)
        if host.clock_file is not None and self.library is not None:
            command = [p.copier_bin, "process", "--properties", str(path)]
            script = p.workdir / f"worker-{worker}.sh"
            kcl["executableName"] = str(write_wrapper(script, command, host.clock_file, self.library, self.pids))
        keys = {**p.copier, "dedupKey": settings.dedup_key, "unkeyedPolicy": settings.unkeyed_policy}
        local_properties(
            path, p.endpoint, p.application, p.staging, p.target, p.copier_bin, kcl, p.dynamodb_endpoint, **keys
        )
        load_config(path)
        offset = host.offset_ms if host.clock_file is not None else None
        self.starts.append(Start(worker, host.number, settings, offset))
        host.workers.append(worker)
        self.host_of[worker] = host
        return path

    def step(self, worker: str, step_ms: int, at_s: float, processors: int) -> str | None:
        """Step the clock of ``worker``'s host by ``step_ms`` (``processors`` of it running); the fault's name,
        or None if the host is on the real clock."""
        host = self.host_of[worker]
        if host.clock_file is None:
            return None
        host.offset_ms += step_ms
        write_offset(host.clock_file, host.offset_ms)
        step = {"at_s": round(at_s, 1), "step_ms": step_ms, "offset_ms": host.offset_ms, "processors": processors}
        host.steps.append(step)
        return "clock_step_forward" if step_ms > 0 else "clock_step_back"

    def faults(self) -> Counter[str]:
        """What was injected at starts: hosts whose workers started off time, and starts that changed settings."""
        out: Counter[str] = Counter()
        for host in self.hosts:
            if host.workers and host.clock_file is not None and host.clock.kind != "none":
                out[f"clock_offset_{host.clock.kind}"] += 1
        previous = None
        for start in self.starts:
            if previous is not None and start.settings != previous:
                out["settings_change"] += 1
            previous = start.settings
        return out

    def unkeyed_forwarded(self) -> bool:
        """Whether any worker started with ``copier.unkeyedPolicy = forward`` (events without an ID: at least once)."""
        return any(s.settings.unkeyed_policy == "forward" for s in self.starts)

    def clock_results(self) -> list[dict[str, Any]]:
        """Per host: the drawn clock, the steps, and what its processors measured and logged of it."""
        return [self._clock_result(host) for host in self.hosts if host.clock_file is not None]

    def _clock_result(self, host: Host) -> dict[str, Any]:
        logs = [self.pipeline.workdir / f"worker-{w}.log" for w in host.workers]
        events = copier_events([p for p in logs if p.is_file()], {"clock_bound", "clock_margin_widened"})
        bounds = [e for e in events if e["event"] == "clock_bound" and e.get("bound_ms") is not None]
        widened = [e for e in events if e["event"] == "clock_margin_widened"]
        # A clock_bound's offset_ms is AWS time minus local time: the host's offset, negated.
        measured = sorted({-round(e["offset_ms"], -2) for e in bounds if e.get("offset_ms") is not None})
        return {
            "host": host.number,
            "kind": host.clock.kind,
            "offset_ms": host.clock.offset_ms,
            "final_offset_ms": host.offset_ms,
            "steps": host.steps,
            "workers": host.workers,
            "measured_offsets_ms": _spread(measured, MEASURED_OFFSETS),
            "max_bound_ms": max((int(e["bound_ms"]) for e in bounds), default=None),
            "steps_seen": max((int(e.get("steps") or 0) for e in bounds), default=0),
            "margin_widened": len(widened),
            "max_margin_ms": max((int(e["margin_ms"]) for e in widened), default=None),
        }

    def settings_results(self) -> list[dict[str, Any]]:
        """Per worker start: its worker, host, settings and clock offset."""
        return [{**asdict(s), "settings": asdict(s.settings)} for s in self.starts]

    def cleanup(self, settle_s: float = 5.0) -> int:
        """Remove what libfaketime left in /dev/shm for processors that are gone (SIGKILLed ones), after
        waiting up to ``settle_s`` for those just killed with their workers to be gone."""
        deadline = time.monotonic() + settle_s
        while any(running(pid) for pid in noted_pids(self.pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return remove_stale_shm(self.pids)


def _spread(values: list[int], keep: int) -> list[int]:
    """At most ``keep`` of the sorted ``values``, the lowest and the highest among them."""
    if len(values) <= keep:
        return values
    step = (len(values) - 1) / (keep - 1)
    return sorted({values[round(i * step)] for i in range(keep)})
