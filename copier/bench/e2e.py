"""End to end with the real KCL daemon: throughput and added latency, copier against the plain copier.

For each kind of processor (``copier process``, and the plain at-least-once
copier of ``copier.bench.plain`` under the same daemon settings) and each
staging shard count, on the local backend:

1. one ``copier run`` worker starts; a warm-up event per shard waits for
   the daemon to have handed out every lease;
2. *latency*: events are written at a steady rate; an event's added latency
   is its arrival in the target minus its arrival in staging (both
   ApproximateArrivalTimestamps, stamped by the same backend clock): p50, p99;
3. *throughput*: a burst of events is written as fast as the backend takes
   them; throughput is the burst divided by the time from its first arrival
   in staging to its last arrival in the target.

The backend is moto behind one lock, shared by the producer, the daemon and
the processor, so absolute numbers say little about AWS; the ratio of
copier to the plain copier, measured the same way in the same run, is the
point.
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from copier.adapters.streamreader import Progress, StreamReader
from copier.local.pipeline import LocalPipeline

__all__ = ["E2EResult", "bench_pipeline", "run_e2e"]


@dataclass(frozen=True)
class E2EResult:
    kind: str
    shards: int
    events: int
    throughput_eps: float
    latency_p50_ms: float
    latency_p99_ms: float

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


# copier's log level in the benchmark's pipelines: WARNING, as a benchmark reads numbers, not logs;
# ``python -m copier.bench --keep DIR`` sets INFO, for tracing an outlier in the logs it keeps.
PROCESS_LOG_LEVEL = "WARNING"


def bench_pipeline(endpoint: str, workdir: Path, run: str, kcl: dict[str, str]) -> LocalPipeline:
    """A pipeline of its own for one measurement: streams and application named after ``run``, copier's
    log at ``PROCESS_LOG_LEVEL``."""
    return LocalPipeline(
        endpoint,
        workdir,
        staging=f"{run}-s",
        target=f"{run}-t",
        application=run,
        kcl=kcl,
        copier={"logLevel": PROCESS_LOG_LEVEL},
    )


def _put(kinesis: Any, stream: str, events: list[str]) -> None:
    for first in range(0, len(events), 500):
        left = [
            {"PartitionKey": e, "Data": json.dumps({"eventId": e, "body": "x" * 150}).encode()}
            for e in events[first : first + 500]
        ]
        while left:
            answer = kinesis.put_records(StreamName=stream, Records=left)
            left = [r for r, a in zip(left, answer["Records"], strict=True) if a.get("ErrorCode")]


def _arrivals(reader: StreamReader, stream: str) -> dict[str, float]:
    """Event ID -> arrival time (epoch seconds) of its first copy in the stream."""
    out: dict[str, float] = {}

    def convert(_shard: str, r: dict[str, Any]) -> tuple[str, float]:
        return json.loads(r["Data"])["eventId"], r["ApproximateArrivalTimestamp"].timestamp()

    for event_id, at in reader.read(stream, stream, convert):
        out.setdefault(event_id, at)
    return out


def _wait_for(reader: StreamReader, stream: str, wanted: set[str], timeout_s: float) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = _arrivals(reader, stream)
        if wanted <= found.keys() or time.monotonic() > deadline:
            missing = wanted - found.keys()
            if missing:
                raise RuntimeError(f"{len(missing)} events never reached {stream} within {timeout_s:.0f} s")
            return found
        time.sleep(1.0)


def run_e2e(kind: str, shards: int, endpoint: str, workdir: Path, rate: int, seconds: float, burst: int) -> E2EResult:
    """One kind ("copier" or "plain") at one shard count; see the module docstring."""
    run = f"e2e-{kind}-{shards}-{uuid.uuid4().hex[:6]}"
    workdir.mkdir(parents=True, exist_ok=True)
    kcl: dict[str, str] = {}
    if kind == "plain":
        kcl["executableName"] = f"{sys.executable} -m copier.bench.plain --properties {workdir / 'copier.properties'}"
    pipeline = bench_pipeline(endpoint, workdir, run, kcl)
    reader = StreamReader(pipeline.kinesis, Progress(io.StringIO()))
    try:
        pipeline.create(shards, shards)
        pipeline.start_worker("w1")
        warm = [f"warm-{n}" for n in range(64 * shards)]  # keys over every shard
        _put(pipeline.kinesis, pipeline.staging, warm)
        _wait_for(reader, pipeline.target, set(warm), 180)

        steady = [f"lat-{n}" for n in range(int(rate * seconds))]
        tick = 0.1
        per_tick = max(1, int(rate * tick))
        start = time.monotonic()
        for i, first in enumerate(range(0, len(steady), per_tick)):
            time.sleep(max(0.0, start + i * tick - time.monotonic()))
            _put(pipeline.kinesis, pipeline.staging, steady[first : first + per_tick])
        in_target = _wait_for(reader, pipeline.target, set(steady), 180)
        in_staging = _arrivals(reader, pipeline.staging)
        latencies = sorted((in_target[e] - in_staging[e]) * 1000 for e in steady)

        flood = [f"burst-{n}" for n in range(burst)]
        _put(pipeline.kinesis, pipeline.staging, flood)
        in_target = _wait_for(reader, pipeline.target, set(flood), 300)
        in_staging = _arrivals(reader, pipeline.staging)
        span = max(in_target[e] for e in flood) - min(in_staging[e] for e in flood)
    finally:
        pipeline.stop_all()
    return E2EResult(
        kind=kind,
        shards=shards,
        events=len(steady) + burst,
        throughput_eps=round(burst / max(span, 1e-3), 1),
        latency_p50_ms=round(statistics.median(latencies), 1),
        latency_p99_ms=round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))], 1),
    )
