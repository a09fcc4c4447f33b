"""``python -m copier.bench``: every benchmark, against baselines in the same run; writes docs/benchmarks.*.

    python -m copier.bench                     # the full run (make bench): docs/benchmarks.md, .json, PNG plots
    python -m copier.bench --smoke --out DIR   # tiny sizes, seconds to minutes (tests/test_bench.py)
    python -m copier.bench --only memory,host  # these parts again; the others kept from OUT/benchmarks.json

Parts: processor CPU per event against a plain at-least-once copier
(``copier.bench.cpu``), DynamoDB write units per million events against
per-record idempotency (``copier.bench.cost``), the dedup window's memory,
takeover time and CPU as it grows (``copier.bench.window``), the real
daemon end to end against the plain copier (``copier.bench.e2e``), and what a
shard costs a host: memory per processor, a many-shard host, and the time to
start, restart and take over (``copier.bench.host``), and what a redrive and
a repair cost per event (``copier.bench.sources``: requests by call, write
units; docs/protocol.md's "Cost" paragraphs say what the code implies), and
a simulated day of 10,000 shards' control-plane calls against AWS's limits
(``copier.bench.sim``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FULL", "PARTS", "SMOKE", "Profile", "main", "run"]

PARTS = (
    "cpu",
    "window",
    "ordering",
    "e2e",
    "memory",
    "host",
    "startup",
    "rolling",
    "cost",
    "sources",
    "simulation",
)


@dataclass(frozen=True)
class Profile:
    cpu_cases: tuple[tuple[int, int, int], ...]  # (payload bytes, batch, events)
    cpu_repeats: int
    cost_batches: tuple[int, ...]
    cost_coalesced: tuple[int, ...]  # delivered batch sizes measured again with default coalescing
    cost_events: int
    windows: tuple[int, ...]
    window_events: int
    e2e_shards: tuple[int, ...]
    e2e_rate: int
    e2e_seconds: float
    e2e_burst: int
    ordering_events: int
    ordering_hot_keys: int
    host_shards: tuple[int, ...]
    host_rate: int
    host_measure_s: float
    startup_shards: int  # 0: no startup part
    rolling: tuple[int, int, int, float]  # (workers, shards, events/s, seconds between restarts); 0 workers: none
    sources_events: int = 5000  # events a redrive and a repair send (a multiple of 500)
    simulation_shards: int = 10_000  # the control-plane simulation's staging shards (copier.bench.sim)


FULL = Profile(
    cpu_cases=tuple((200, b, 30_000) for b in (10, 100, 1000, 10_000))
    + tuple((2048, b, 20_000) for b in (100, 1000, 10_000)),
    # A cell's ratio moved by up to 0.3 between runs of 3 on a machine doing other work (2026-11-27: 1.286 and
    # 0.959 in one cell, same code): the median of 5 per-repetition ratios, about 16 minutes on 2 cores.
    cpu_repeats=5,
    cost_batches=(10, 100, 500, 1000, 10_000),
    cost_coalesced=(10, 100),
    cost_events=20_000,
    windows=(10_000, 100_000, 400_000, 1_200_000, 3_600_000),
    window_events=20_000,
    e2e_shards=(1, 2, 4),
    e2e_rate=200,
    e2e_seconds=20.0,
    e2e_burst=10_000,
    ordering_events=10_000,
    ordering_hot_keys=20,
    host_shards=(8, 64),
    host_rate=640,
    host_measure_s=30.0,
    startup_shards=8,
    rolling=(3, 8, 80, 30.0),
)
SMOKE = Profile(
    cpu_cases=((200, 100, 3000), (200, 1000, 5000)),  # at least ~40 ms of CPU each: ticks are 10 ms
    cpu_repeats=1,
    cost_batches=(10, 100),
    cost_coalesced=(10,),
    cost_events=200,
    windows=(1000,),
    window_events=200,
    e2e_shards=(1,),
    e2e_rate=20,
    e2e_seconds=2.0,
    e2e_burst=100,
    ordering_events=200,
    ordering_hot_keys=5,
    host_shards=(1,),
    host_rate=10,
    host_measure_s=2.0,
    startup_shards=0,
    rolling=(0, 0, 0, 0.0),
    sources_events=500,
    simulation_shards=100,
)


@dataclass
class Results:
    cpu: list[dict[str, Any]] = field(default_factory=list)
    cost: dict[str, Any] = field(default_factory=dict)
    window: list[dict[str, Any]] = field(default_factory=list)
    e2e: list[dict[str, Any]] = field(default_factory=list)
    ordering: list[dict[str, Any]] = field(default_factory=list)
    memory: list[dict[str, Any]] = field(default_factory=list)
    host: list[dict[str, Any]] = field(default_factory=list)
    startup: list[dict[str, Any]] = field(default_factory=list)
    rolling: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, Any] = field(default_factory=dict)  # copier.bench.sources: a redrive's and a repair's cost
    simulation: dict[str, Any] = field(default_factory=dict)  # copier.bench.sim: a day of control-plane calls
    method: dict[str, Any] = field(default_factory=dict)


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {name: version(name) for name in ("copier", "amazon-kclpy", "boto3", "pynamodb", "moto")}
    out["python"] = sys.version.split()[0]
    java = subprocess.run(["java", "-version"], capture_output=True, text=True)
    out["java"] = (java.stderr.splitlines() or ["?"])[0]
    return out


def _machine() -> dict[str, Any]:
    import platform

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    memory = next((line.split(":", 1)[1].strip() for line in open("/proc/meminfo") if line.startswith("MemTotal")), "?")
    return {"platform": platform.platform(), "cpu": cpu, "cores": os.cpu_count(), "memory": memory}


def run(profile: Profile, workdir: Path, command: str, parts: tuple[str, ...] = PARTS) -> Results:
    """The parts asked for (every part by default), in order; returns the raw numbers."""
    from copier.adapters.dynamo import DynamoStateStore
    from copier.adapters.kinesis import paged_shards
    from copier.bench import cost, cpu, e2e, host, ordering, sources, window
    from copier.core.config import load_config
    from copier.local.backend import DUMMY_ENV, LocalBackend

    for key, value in DUMMY_ENV.items():
        os.environ.setdefault(key, value)
    from copier.chaos.digest import code_digest

    results = Results(
        method={
            "command": command,
            "machine": _machine(),
            "versions": _versions(),
            "date": time.strftime("%Y-%m-%d"),
            "code": code_digest(),  # the digest a chaos seed's result carries: which copier the figures measured
        }
    )
    started = time.monotonic()
    with LocalBackend() as backend:
        import boto3

        kinesis = boto3.session.Session(region_name="us-east-1").client("kinesis", endpoint_url=backend.endpoint)
        # A copier processor looks its shard up in ListShards: each processor gets a real shard of its own.
        shards = len(profile.cpu_cases) * profile.cpu_repeats * 3 + len(profile.windows) + 6
        for name, count in (("bench-staging", shards), ("bench-target", 4)):
            kinesis.create_stream(StreamName=name, ShardCount=count)
            kinesis.get_waiter("stream_exists").wait(StreamName=name)

        def properties(name: str, **more: str) -> Path:
            return cpu.bench_properties(workdir / f"{name}.properties", backend.endpoint, **more)

        props = properties("bench")
        uncoalesced = properties("bench-uncoalesced", coalesceEvents="1")
        config = load_config(props)
        store = DynamoStateStore(config)
        store.create_table()
        plain = [sys.executable, "-m", "copier.bench.plain", "--properties", str(props)]
        shard_ids = iter(sorted(s["ShardId"] for s in paged_shards(kinesis.list_shards, "bench-staging")))
        for payload_bytes, batch, events in profile.cpu_cases if "cpu" in parts else ():
            _say(f"cpu: {payload_bytes} B, batches of {batch}, {events} events, x{profile.cpu_repeats} each")
            case = cpu.CpuCase(payload_bytes, batch, events)
            alone = uncoalesced if config.coalescing and batch < config.coalesce_events else None
            results.cpu.append(cpu.run_case(props, alone, plain, case, profile.cpu_repeats, shard_ids).to_json())
        for size, shard in zip(profile.windows if "window" in parts else (), shard_ids, strict=False):
            _say(f"window: {size} IDs")
            results.window.append(
                window.measure_window(props, store, "bench-staging", shard, size, profile.window_events).to_json()
            )
        for hot_keys in (0, profile.ordering_hot_keys) if "ordering" in parts else ():
            for mode in ("none", "partitionKey"):
                _say(f"ordering {mode}: {profile.ordering_events} events, {hot_keys or 'distinct'} keys")
                order_props = properties(f"bench-order-{mode}", ordering=mode, coalesceEvents="1")
                measured = ordering.measure(
                    order_props,
                    next(shard_ids),
                    mode,
                    hot_keys,
                    profile.ordering_events,
                    min(1000, profile.ordering_events),
                )
                results.ordering.append(measured.to_json())
        for shards_count in profile.e2e_shards if "e2e" in parts else ():
            for kind in ("plain", "copier"):
                _say(f"end to end: {kind}, {shards_count} shards")
                outcome = e2e.run_e2e(
                    kind,
                    shards_count,
                    backend.endpoint,
                    workdir / f"e2e-{kind}-{shards_count}",
                    profile.e2e_rate,
                    profile.e2e_seconds,
                    profile.e2e_burst,
                )
                results.e2e.append(outcome.to_json())
        for botocore in (False, True) if "memory" in parts else ():
            _say(f"memory: one processor, {'botocore' if botocore else 'lean'} path")
            used = host.processor_memory(props, next(shard_ids), workdir / f"home-{botocore}", botocore)
            results.memory.append(used)
        for shards_count in profile.host_shards if "host" in parts else ():
            _say(f"host: one worker, {shards_count} shards, then {profile.host_rate} events/s")
            results.host.append(
                host.run_host(
                    backend.endpoint,
                    workdir / f"host-{shards_count}",
                    shards_count,
                    profile.host_rate,
                    profile.host_measure_s,
                )
            )
        variants = [(s, w) for s in ("local", "production") for w in (None, "copier-host-a")]
        for settings, worker_id in variants if "startup" in parts and profile.startup_shards else ():
            named = "a stable workerId" if worker_id else "a new workerId each run"
            _say(f"startup: {settings} settings, {named}, {profile.startup_shards} shards: fresh, restart, crash")
            results.startup.append(
                host.run_startups(
                    backend.endpoint,
                    workdir / f"startup-{settings}-{bool(worker_id)}",
                    profile.startup_shards,
                    settings,
                    worker_id,
                )
            )
        workers, rolling_shards, rolling_rate, settle_s = profile.rolling
        for in_place in (True, False) if "rolling" in parts and workers else ():
            how = "in place" if in_place else "new workers"
            _say(f"rolling deploy, {how}: {workers} workers, {rolling_shards} shards, {rolling_rate} events/s")
            results.rolling.append(
                host.run_rolling(
                    backend.endpoint,
                    workdir / f"rolling-{in_place}",
                    workers,
                    rolling_shards,
                    rolling_rate,
                    settle_s,
                    in_place,
                )
            )
    if "cost" in parts:
        _say(f"cost: batches {profile.cost_batches}, coalesced {profile.cost_coalesced}, {profile.cost_events} each")
        cost_dir = workdir / "cost"
        cost_dir.mkdir(exist_ok=True)
        results.cost = cost.measure_costs(
            cost_dir, list(profile.cost_batches), list(profile.cost_coalesced), profile.cost_events
        ).to_json()
    if "sources" in parts:
        _say(f"sources: a redrive and a repair of {profile.sources_events} events")
        results.sources = sources.measure_sources(workdir / "sources", profile.sources_events)
    if "simulation" in parts:
        from copier.bench.sim.day import Day
        from copier.bench.sim.report import run as simulate

        _say(f"simulation: a day of {profile.simulation_shards} shards' control-plane calls")
        results.simulation = simulate(Day(shards=profile.simulation_shards))
    results.method["minutes"] = round((time.monotonic() - started) / 60, 1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m copier.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that every part runs")
    parser.add_argument("--out", default="docs", help="where benchmarks.md, benchmarks.json and the plots go")
    parser.add_argument(
        "--only",
        type=lambda text: tuple(text.split(",")),
        default=PARTS,
        help=f"comma-separated parts to run ({','.join(PARTS)}); the others are kept from OUT/benchmarks.json",
    )
    parser.add_argument(
        "--keep",
        metavar="DIR",
        help="work in DIR and keep it, with copier's log at INFO in the workers' logs (for tracing an outlier); "
        "default: a temporary directory removed at the end, copier's log at WARNING",
    )
    args = parser.parse_args(argv)
    unknown = set(args.only) - set(PARTS)
    if unknown:
        parser.error(f"--only: no part {', '.join(sorted(unknown))} (parts: {', '.join(PARTS)})")
    if args.keep and Path(args.keep).exists() and any(Path(args.keep).iterdir()):
        parser.error(f"--keep: {args.keep} is not empty (a run's logs would be appended to an earlier run's)")
    from copier.adapters.logs import configure_logging
    from copier.bench.report import write

    configure_logging("WARNING")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m copier.bench " + " ".join(argv if argv is not None else sys.argv[1:])
    profile = SMOKE if args.smoke else FULL
    if args.keep:
        from copier.bench import e2e

        e2e.PROCESS_LOG_LEVEL = "INFO"
        kept_dir = Path(args.keep)
        kept_dir.mkdir(parents=True, exist_ok=True)
        results = run(profile, kept_dir, command.strip(), args.only)
    else:
        with tempfile.TemporaryDirectory(prefix="copier-bench-") as workdir:
            results = run(profile, Path(workdir), command.strip(), args.only)
    data = results.__dict__
    previous = out / "benchmarks.json"
    if args.only != PARTS and previous.exists():  # the parts not run again keep their last numbers
        kept = json.loads(previous.read_text())
        for part in set(PARTS) - set(args.only):
            data[part] = kept.get(part, data[part])
        rerun = {key: data["method"].get(key) for key in ("command", "date", "minutes", "code")}
        data["method"] = kept.get("method", data["method"])
        data["method"]["reruns"] = [*data["method"].get("reruns", []), rerun]
    (out / "benchmarks.json").write_text(json.dumps(data, indent=1) + "\n")
    write(data, out)
    _say(f"wrote {out / 'benchmarks.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
