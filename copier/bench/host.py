"""What a shard costs a host, and how long a host takes to start copying.

Three measurements, each on the local backend with real processes:

* *memory per processor* (:func:`processor_memory`): one ``copier process``
  after ``initialize`` and one batch, on the lean path and on botocore's
  (forced by a shared AWS config file in its HOME, as an operator's
  ``~/.aws/config`` would): RSS, PSS (shared pages divided among the
  processes sharing them: what N processors really cost) and USS (pages
  only it holds);
* *a many-shard host* (:func:`run_host`): one ``copier run`` worker holding
  every shard of a staging stream: the time from ``copier run`` until every
  shard has forwarded its first event, the whole process tree's memory
  (the daemon JVM and its children) and its CPU idle and at a steady rate;
* *starting and restarting* (:func:`run_startups`): from ``copier run`` to
  every shard's first event forwarded with a fresh lease table, after a
  restart (SIGTERM, then a new worker: the lease table exists), and after a
  host crash (SIGKILL of the worker's process group, then a new worker), with
  the local runs' KCL timings (``copier.local.pipeline.FAST_KCL``) and with the
  production sample's (``properties/copier.properties`` as shipped).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.adapters.streamreader import Progress, StreamReader
from copier.bench import e2e
from copier.bench.e2e import bench_pipeline
from copier.kcl.classarchive import archive_dir, archive_path
from copier.kcl.daemon import daemon_classpath
from copier.local.multilang import COPIER, Processor, event
from copier.local.pipeline import LocalPipeline, Worker, child_pids, local_properties

__all__ = [
    "MemoryUse",
    "cpu_seconds",
    "memory_of",
    "processor_memory",
    "run_host",
    "run_rolling",
    "run_startups",
]

MB = 1024 * 1024
SAMPLE = Path(__file__).resolve().parents[2] / "properties" / "copier.properties"
# The production sample's lease and read timings (properties/copier.properties): the local runs' 3 s
# failover and 200 ms polls would measure the one-lock local backend's latency under 64 shards' calls
# (leases expiring while their renewals queue), not the copier.
HOST_KCL = {"failoverTimeMillis": "10000", "idleTimeBetweenReadsInMillis": "1000"}
_SAMPLE_LOCAL = {"streamName", "applicationName", "executableName", "metricsLevel", "copier.targetStreamName"}


@dataclass(frozen=True)
class MemoryUse:
    rss: int
    pss: int
    uss: int

    def __add__(self, other: MemoryUse) -> MemoryUse:
        return MemoryUse(self.rss + other.rss, self.pss + other.pss, self.uss + other.uss)

    def to_json(self) -> dict[str, float]:
        return {f"{k}_mb": round(v / MB, 1) for k, v in self.__dict__.items()}


def memory_of(pid: int) -> MemoryUse:
    """A process's RSS, PSS and USS (private pages) from /proc/PID/smaps_rollup; zero if it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return MemoryUse(0, 0, 0)
    kb = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.endswith("kB")}
    return MemoryUse(kb["Rss"] * 1024, kb["Pss"] * 1024, (kb["Private_Clean"] + kb["Private_Dirty"]) * 1024)


def cpu_seconds(pid: int) -> float:
    """A process's own user + system CPU so far (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(child_pids(current))
    return out


def processor_memory(properties: Path, shard: str, home: Path, botocore: bool) -> dict[str, Any]:
    """One processor's memory after ``initialize`` and a batch of 100 events (see the module docstring)."""
    home.mkdir(parents=True, exist_ok=True)
    if botocore:
        (home / ".aws").mkdir(exist_ok=True)
        (home / ".aws" / "config").write_text("[default]\n")
    command = ["env", f"HOME={home}", COPIER, "process", "--properties", str(properties)]
    proc = Processor(properties, f"memory-{shard}", command)
    try:
        proc.initialize(shard)
        proc.process([event(n + 1, f"mem-{uuid.uuid4().hex}") for n in range(100)])
        time.sleep(0.5)
        used = memory_of(proc.proc.pid)
        reasons = [line for line in proc.stderr_lines if "botocore_clients" in line]
    finally:
        proc.close()
    if bool(reasons) != botocore:
        raise AssertionError(f"expected the {'botocore' if botocore else 'lean'} path, the processor said {reasons}")
    return {"path": "botocore" if botocore else "lean", **used.to_json()}


def _by_shard(pipeline: LocalPipeline, tag: str) -> list[dict[str, Any]]:
    """One event for each open staging shard, its partition key chosen so that its MD5 hash falls in that
    shard's range (as Kinesis routes it: no ExplicitHashKey, which copier would report as misrouted)."""
    shards = pipeline.kinesis.list_shards(StreamName=pipeline.staging)["Shards"]
    ranges = [
        (int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
        for s in shards
        if "EndingSequenceNumber" not in s["SequenceNumberRange"]
    ]
    keys: dict[int, str] = {}
    candidate = 0
    while len(keys) < len(ranges):
        key = f"{tag}-{candidate}"
        hashed = int(hashlib.md5(key.encode()).hexdigest(), 16)  # noqa: S324 - Kinesis' own routing hash
        keys.setdefault(next(n for n, (low, high) in enumerate(ranges) if low <= hashed <= high), key)
        candidate += 1
    return [_record(key) for key in keys.values()]


def _record(key: str) -> dict[str, Any]:
    """An event whose ID is its partition key, 150 bytes of body."""
    return {"PartitionKey": key, "Data": json.dumps({"eventId": key, "body": "x" * 150}).encode()}


def _put(kinesis: Any, stream: str, records: list[dict[str, Any]]) -> None:
    for first in range(0, len(records), 500):
        left = records[first : first + 500]
        while left:
            answer = kinesis.put_records(StreamName=stream, Records=left)
            left = [r for r, a in zip(left, answer["Records"], strict=True) if a.get("ErrorCode")]


def _until_forwarded(pipeline: LocalPipeline, wanted: set[str], started: float, timeout_s: float) -> float:
    """Seconds from ``started`` until every wanted event ID is in the target (polled every second: each poll
    reads the whole target, on the same backend as the copier)."""
    reader = StreamReader(pipeline.kinesis, Progress(io.StringIO()))
    deadline = started + timeout_s
    while True:
        found = set(reader.read(pipeline.target, pipeline.target, lambda _shard, r: json.loads(r["Data"])["eventId"]))
        if wanted <= found:
            return round(time.monotonic() - started, 1)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(wanted - found)} of {len(wanted)} events not forwarded in {timeout_s:.0f} s")
        time.sleep(1.0)


class _Producer:
    """Events at a steady rate in a thread, each on a known staging shard (its key hashes there)."""

    def __init__(self, pipeline: LocalPipeline, rate: int) -> None:
        shards = pipeline.kinesis.list_shards(StreamName=pipeline.staging)["Shards"]
        self.ranges = [
            (s["ShardId"], int(s["HashKeyRange"]["StartingHashKey"]), int(s["HashKeyRange"]["EndingHashKey"]))
            for s in shards
        ]
        self.pipeline, self.rate = pipeline, rate
        self.written: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def shard_of(self, key: str) -> str:
        hashed = int(hashlib.md5(key.encode()).hexdigest(), 16)  # noqa: S324 - Kinesis' own routing hash
        return str(next(shard for shard, low, high in self.ranges if low <= hashed <= high))

    def _run(self) -> None:
        started, tick, n = time.monotonic(), 0, 0
        per_tick = max(1, self.rate // 10)
        while not self._stop.is_set():
            time.sleep(max(0.0, started + tick * 0.1 - time.monotonic()))
            keys = [f"roll-{n + i}" for i in range(per_tick)]
            n, tick = n + per_tick, tick + 1
            _put(self.pipeline.kinesis, self.pipeline.staging, [_record(k) for k in keys])
            self.written.extend(keys)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop writing (idempotent); ``written`` then holds every event written."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _sample_properties(pipeline: LocalPipeline, path: Path, more: dict[str, str]) -> Path:
    """``properties/copier.properties`` as shipped, pointed at the local backend and this pipeline's streams."""
    keep = []
    for line in SAMPLE.read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if line.strip() and not line.lstrip().startswith("#") and key not in _SAMPLE_LOCAL:
            keep.append(line)
    path.write_text(
        "\n".join(
            [
                *keep,
                f"executableName = {pipeline.copier_bin} process --properties {path}",
                f"applicationName = {pipeline.application}",
                f"streamName = {pipeline.staging}",
                f"kinesisEndpoint = {pipeline.endpoint}",
                f"dynamoDBEndpoint = {pipeline.endpoint}",
                "metricsLevel = NONE",  # no CloudWatch on the local backend
                f"copier.targetStreamName = {pipeline.target}",
                "copier.jvmArgs = -Daws.cborEnabled=false",
                "copier.logLevel = WARNING",
                *(f"{key} = {value}" for key, value in more.items()),
            ]
        )
        + "\n"
    )
    return path


def _tree_cpu(worker: Worker) -> float:
    return sum(cpu_seconds(pid) for pid in _tree(worker.proc.pid))


def _tree_memory(worker: Worker) -> tuple[MemoryUse, MemoryUse, list[MemoryUse]]:
    """(the whole tree, the daemon JVM alone, each processor)."""
    jvm = worker.jvm_pid
    processors = [memory_of(pid) for pid in worker.processor_pids()]
    total = MemoryUse(0, 0, 0)
    for pid in _tree(worker.proc.pid):
        total += memory_of(pid)
    return total, memory_of(jvm) if jvm else MemoryUse(0, 0, 0), processors


def run_host(endpoint: str, workdir: Path, shards: int, rate: int, measure_s: float) -> dict[str, Any]:
    """One worker holding ``shards`` shards: time to every first event, memory, CPU idle and at ``rate``/s."""
    run = f"host{shards}-{uuid.uuid4().hex[:6]}"
    pipeline = bench_pipeline(endpoint, workdir, run, HOST_KCL)
    try:
        pipeline.create(shards, min(shards, 4))
        first = _by_shard(pipeline, "first")
        _put(pipeline.kinesis, pipeline.staging, first)
        started = time.monotonic()
        worker = pipeline.start_worker("w1")
        all_first_s = _until_forwarded(pipeline, {r["PartitionKey"] for r in first}, started, 900)
        time.sleep(min(5.0, measure_s))  # let the last leases settle before measuring idle
        before, at = _tree_cpu(worker), time.monotonic()
        time.sleep(measure_s)
        idle_cpu = (_tree_cpu(worker) - before) / (time.monotonic() - at)
        total, jvm, processors = _tree_memory(worker)

        producer = _Producer(pipeline, rate)
        before, at = _tree_cpu(worker), time.monotonic()
        producer.start()
        time.sleep(measure_s)
        producer.stop()
        steady_cpu = (_tree_cpu(worker) - before) / (time.monotonic() - at)
        _until_forwarded(pipeline, set(producer.written), time.monotonic(), 600)
    finally:
        pipeline.stop_all()
    pss = [p.pss for p in processors]
    return {
        "shards": shards,
        "processors": len(processors),
        "all_first_event_s": all_first_s,
        "tree": total.to_json(),
        "daemon": jvm.to_json(),
        "processor_pss_mb": round(sum(pss) / max(1, len(pss)) / MB, 1),
        "idle_cpu_percent": round(idle_cpu * 100, 1),
        "steady_rate": rate,
        "steady_cpu_percent": round(steady_cpu * 100, 1),
        "steady_cpu_us_per_event": round(steady_cpu / rate * 1e6, 1) if rate else None,
    }


def _class_archive_in_place(pipeline: LocalPipeline) -> bool:
    """Will the daemon JVM map a class-data archive (``copier.kcl.classarchive``), or write one at its exit?"""
    directory = archive_dir(pipeline.config.jvm_class_archive, os.environ)
    java = shutil.which("java") or "java"
    return directory is not None and archive_path(java, daemon_classpath(), directory).is_file()


def run_startups(
    endpoint: str, workdir: Path, shards: int, settings: str, worker_id: str | None = None
) -> dict[str, Any]:
    """Seconds from ``copier run`` to every shard's first event forwarded: fresh, restart, crash takeover.

    ``settings``: "local" (the local runs' KCL timings) or "production" (the shipped sample's);
    ``worker_id``: the daemon's ``workerId``, the same for every worker started (as a host's own ID would
    be across its restarts), else the KCL's default (a new one each run).
    """
    run = f"start-{settings}-{uuid.uuid4().hex[:6]}"
    kcl = {"workerId": worker_id} if worker_id else {}
    pipeline = bench_pipeline(endpoint, workdir, run, kcl)
    properties = pipeline.properties
    if settings == "production":
        properties = _sample_properties(pipeline, workdir / "production.properties", kcl)
    out: dict[str, Any] = {
        "settings": settings,
        "worker_id": "stable" if worker_id else "new each run",
        "shards": shards,
    }
    out["class_archive"] = "mapped" if _class_archive_in_place(pipeline) else "written by the fresh start"
    try:
        pipeline.create(shards, min(shards, 4))
        for case in ("fresh", "restart", "crash"):
            records = _by_shard(pipeline, f"{case}-{uuid.uuid4().hex[:6]}")
            _put(pipeline.kinesis, pipeline.staging, records)
            started = time.monotonic()
            worker = pipeline.start_worker(case, properties)
            out[f"{case}_s"] = _until_forwarded(pipeline, {r["PartitionKey"] for r in records}, started, 900)
            if case == "fresh":
                worker.terminate()
                worker.stop(60)
            elif case == "restart":
                time.sleep(3)  # the worker holds its leases and has checkpointed: then the host dies
                worker.kill_host()
                worker.stop(5)
    finally:
        pipeline.stop_all()
    return out


def run_rolling(
    endpoint: str, workdir: Path, workers: int, shards: int, rate: int, settle_s: float, in_place: bool
) -> dict[str, Any]:
    """A rolling deploy under a steady rate: each worker in turn stopped with SIGTERM and started again.

    ``in_place``: each worker keeps its own ``workerId`` across its restart (a host restarted in place, as
    scripts/copier.yaml's hosts do); else every start is a new worker (a host replaced by a new one).

    The pause of a shard is the longest gap between two consecutive arrivals in the target of events
    from that staging shard while the deploy runs (events arrive many times a second otherwise); every
    event written must be in the target exactly once.
    """
    run = f"roll-{uuid.uuid4().hex[:6]}"
    pipeline = bench_pipeline(endpoint, workdir, run, HOST_KCL)
    producer: _Producer | None = None
    try:
        pipeline.create(shards, min(shards, 4))
        producer = _Producer(pipeline, rate)
        own = [pipeline.properties] * workers
        if in_place:  # a file of its own each (executableName names the file the daemon reads)
            own = [
                local_properties(
                    workdir / f"host-{n}.properties",
                    endpoint,
                    run,
                    pipeline.staging,
                    pipeline.target,
                    pipeline.copier_bin,
                    {**HOST_KCL, "workerId": f"host-{n}"},
                    logLevel=e2e.PROCESS_LOG_LEVEL,
                )
                for n in range(workers)
            ]
        running = [pipeline.start_worker(f"w{n}", own[n]) for n in range(workers)]
        producer.start()
        if not pipeline.wait(lambda: sum(pipeline.shards_owned().values()) == shards, 300):
            raise RuntimeError(f"the {workers} workers did not take all {shards} shards within 300 s")
        _until_settled(pipeline, settle_s)  # the KCL's first balancing moves are not the deploy's
        deploy_from = time.time()
        restarts: list[float] = []
        for n in range(workers):
            old = running[n]
            restarts.append(time.time())
            old.terminate()
            old.stop(60)
            running[n] = pipeline.start_worker(f"w{n}-new", own[n])
            _until_settled(pipeline, settle_s)
        deploy_to = time.time()
        producer.stop()
        wanted = set(producer.written)
        _until_forwarded(pipeline, wanted, time.monotonic(), 600)
        reader = StreamReader(pipeline.kinesis, Progress(io.StringIO()))
        landed = reader.read(
            pipeline.target,
            pipeline.target,
            lambda _shard, r: (json.loads(r["Data"])["eventId"], r["ApproximateArrivalTimestamp"].timestamp()),
        )
    finally:
        if producer is not None:
            producer.stop()
        pipeline.stop_all()
    counts: dict[str, int] = {}
    arrivals: dict[str, list[float]] = {}
    for event_id, at in landed:
        counts[event_id] = counts.get(event_id, 0) + 1
        if event_id in wanted and deploy_from <= at <= deploy_to + 120:
            arrivals.setdefault(producer.shard_of(event_id), []).append(at)
    gaps = {shard: _longest_gap(ats) for shard, ats in arrivals.items()}
    pauses = {shard: gap for shard, (gap, _at) in gaps.items()}
    longest = max(gaps.values(), default=(0.0, deploy_from))
    return {
        "workers": workers,
        "restart": "in place, own workerId" if in_place else "new worker",
        "shards": shards,
        "rate": rate,
        "events": len(wanted),
        "lost": len(wanted - counts.keys()),
        "duplicated": sum(1 for e in wanted if counts.get(e, 0) > 1),
        "longest_pause_s": round(max(pauses.values(), default=0.0), 1),
        "median_pause_s": round(sorted(pauses.values())[len(pauses) // 2], 1) if pauses else 0.0,
        "deploy_s": round(deploy_to - deploy_from, 1),
        "settle_s": settle_s,
        **_pause_restart(longest, restarts),
    }


def _pause_restart(longest: tuple[float, float], restarts: list[float]) -> dict[str, Any]:
    """Which restart the longest pause belongs to (the last SIGTERM before it ended) and when it began,
    in seconds from that SIGTERM (negative: the last event before it was forwarded before the SIGTERM)."""
    gap, began = longest
    n = sum(1 for r in restarts if r <= began + gap)
    if not n:
        return {"longest_pause_restart": 0, "longest_pause_from_sigterm_s": None}
    return {"longest_pause_restart": n, "longest_pause_from_sigterm_s": round(began - restarts[n - 1], 1)}


def _longest_gap(arrivals: list[float]) -> tuple[float, float]:
    """The longest gap between consecutive arrivals, and when it began."""
    ordered = sorted(arrivals)
    return max(((b - a, a) for a, b in zip(ordered, ordered[1:], strict=False)), default=(0.0, 0.0))


def _until_settled(pipeline: LocalPipeline, quiet_s: float, limit_s: float = 300) -> None:
    """Wait until no shard has changed hands for ``quiet_s`` seconds (at most ``limit_s``): the KCL balances
    leases for a while after a worker joins, and a restart measured meanwhile would count its moves too."""
    deadline = time.monotonic() + limit_s
    seen, since = pipeline.owners(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(1)
        now = pipeline.owners()
        if now != seen or None in now.values():
            seen, since = now, time.monotonic()
