"""One chaos seed: the real pipeline on the local backend, under the faults its plan draws, then the check.

What runs: fresh staging, target and dead-letter streams and a state table
on a shared local backend; 2 to 4 ``copier run`` workers (the KCL
MultiLangDaemon in Java spawning ``copier process`` children), whose copier
calls (target, dead-letter, state table) pass through the fault-injecting
proxy; and the producer (``copier.chaos.producer``) writing to staging.

While it runs, the harness carries out the plan's actions at their times
(SIGKILL of a processor, a daemon or a whole worker; SIGSTOP and SIGCONT of
a processor or a daemon, shorter or longer than the lease; workers joining
and leaving with SIGTERM; staging splits and merges) and opens the proxy's
fault windows. Like systemd's ``Restart=always``, it restarts a worker whose
daemon exits, a second later; an exit it did not cause (a processor exited
on its own) is counted, and more than two are a crash loop.

The plan's clock starts once every staging shard has a processor (the KCL
takes 5 to 30 s to hand out its first leases), so that the producer and the
faults meet a copier that is forwarding. After the producer is done and the
last action ran, every staging shard
must commit up to the last record written to it within the plan's catch-up
time: a shard that does not is reported as stalled, and fails the seed.
Then the workers are stopped with SIGTERM, and ``copier.chaos.check`` judges
the streams and logs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from copier.chaos.check import check
from copier.chaos.producer import ChaosProducer
from copier.chaos.proxy import FaultProxy, FaultWindow
from copier.chaos.schedule import Action, Plan
from copier.local.pipeline import LocalPipeline, Worker

__all__ = ["SeedResult", "run_seed"]

RESTART_DELAY_S = 1.0
RETRIES = 15  # an action that finds no worker with processors is tried again every 2 s, this many times
CRASH_LOOP = 3  # unexpected daemon exits in one seed that count as a crash loop
LEASE_MS = 3000
PUT_TIMEOUT_MS = 1000
# Small GetRecords batches: many puts and state writes, so that the proxy's fault windows meet traffic.
KCL_BATCHES = {"maxRecords": "200"}
KCL_2X = {"clientVersionConfig": "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"}


@dataclass
class SeedResult:
    """What a seed did and found: JSON-ready, one row of docs/reliability.md."""

    seed: int
    profile: str
    kcl_mode: str
    workers: int
    ok: bool = False
    failures: list[str] = field(default_factory=list)
    events: int = 0  # distinct keyed events produced
    events_written: int = 0  # events written to staging, duplicates included
    staging_records: int = 0
    aggregates: int = 0
    largest_aggregate: int = 0
    producer_duplicates: int = 0
    target_records: int = 0
    dead_letter_records: int = 0
    lost: int = 0
    duplicated: int = 0
    explained_duplicates: int = 0
    out_of_order: int = 0
    poison: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    proxy_requests: dict[str, int] = field(default_factory=dict)  # the copier's calls through the proxy, by class
    unexpected_exits: int = 0
    restarts: int = 0
    startup_s: float = 0.0  # until every staging shard had a processor; the plan's clock starts then
    caught_up_s: float | None = None  # after the producer finished and the last action ran
    total_s: float = 0.0
    workdir: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> SeedResult:
        """A result read back from the JSON report (``--resume``); keys it does not know are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known})


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a daemon's ``copier process`` children)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class _Harness:
    def __init__(self, plan: Plan, endpoint: str, workdir: Path) -> None:
        self.plan = plan
        self.workdir = workdir
        self.rng_names = iter(range(1, 10_000))
        self.faults: Counter[str] = Counter()
        self.expected_exit: set[int] = set()  # daemon pids the harness itself brought down
        self.stopped: dict[int, float] = {}  # SIGSTOPped pid -> when to SIGCONT
        self.unexpected = 0
        self.restarts = 0
        self.live: list[Worker] = []
        run = f"c{plan.seed}-{uuid.uuid4().hex[:6]}"
        self.proxy = FaultProxy(endpoint, plan.seed, hang_s=PUT_TIMEOUT_MS / 1000 + 0.5)
        self.proxy.__enter__()
        dead_letter = f"{run}-dlq"
        self.pipeline = LocalPipeline(
            endpoint,
            workdir,
            staging=f"{run}-staging",
            target=f"{run}-target",
            application=run,
            kcl={**KCL_BATCHES, **(KCL_2X if plan.kcl_mode == "2.x" else {})},
            copier={
                "targetEndpoint": self.proxy.endpoint,
                "stateTableEndpoint": self.proxy.endpoint,
                "unkeyedPolicy": "deadletter",
                "deadLetterStreamName": dead_letter,
                "putTimeoutMillis": str(PUT_TIMEOUT_MS),
                "maxBackoffMillis": "2000",
                "logLevel": "INFO",
            },
        )
        self.pipeline.create(plan.staging_shards, plan.target_shards)
        self.pipeline.kinesis.create_stream(StreamName=dead_letter, ShardCount=1)
        self.pipeline.kinesis.get_waiter("stream_exists").wait(StreamName=dead_letter)
        self.producer = ChaosProducer(self.pipeline.kinesis, self.pipeline.staging, plan, run)

    # -- workers ------------------------------------------------------------------------

    def start_worker(self) -> Worker:
        worker = self.pipeline.start_worker(f"w{next(self.rng_names)}")
        self.live.append(worker)
        return worker

    def supervise(self) -> None:
        """Restart every worker whose daemon exited (counting the exits the harness did not cause)."""
        for worker in list(self.live):
            if worker.alive:
                continue
            self.live.remove(worker)
            worker.log.close()
            if worker.proc.pid not in self.expected_exit:
                self.unexpected += 1
            self.restarts += 1
            time.sleep(RESTART_DELAY_S)
            self.start_worker()

    def resume_due(self, now: float) -> None:
        for pid, when in list(self.stopped.items()):
            if now >= when:
                _signal(pid, signal.SIGCONT)
                del self.stopped[pid]

    def _pick(self, rng_index: int) -> Worker | None:
        """A live, running worker that has processors (a daemon just restarted has none yet)."""
        candidates = [w for w in self.live if w.alive and w.proc.pid not in self.stopped and _children(w.proc.pid)]
        return candidates[rng_index % len(candidates)] if candidates else None

    def act(self, action: Action, index: int) -> bool:
        """Carry out one action of the plan (``index`` picks the worker); False if it found nothing to act on."""
        kind = action.kind
        if kind == "worker_join":
            self.start_worker()
        elif kind in ("split", "merge"):
            if not self._reshard(kind):
                return False
        else:
            worker = self._pick(index)
            if worker is None or not self._act_on(worker, action, index):
                return False
        label = f"{kind}_past_lease" if action.params.get("past_lease") else kind
        self.faults[label] += 1
        return True

    def _act_on(self, worker: Worker, action: Action, index: int) -> bool:
        kind, pid = action.kind, worker.proc.pid
        until = time.monotonic() + float(action.params.get("seconds", 0))
        if kind == "worker_leave":
            if len([w for w in self.live if w.alive]) < 2:
                return False
            self.live.remove(worker)
            worker.terminate()  # graceful: the KCL hands its leases over, processors release theirs
            threading.Thread(target=worker.stop, daemon=True).start()
            return True
        if kind in ("kill_daemon", "kill_host", "pause_daemon"):
            if kind == "pause_daemon":
                self.stopped[pid] = until
                return _signal(pid, signal.SIGSTOP)
            self.expected_exit.add(pid)
            worker.kill_daemon() if kind == "kill_daemon" else worker.kill_host()
            return True
        children = _children(pid)
        if not children:
            return False
        child = children[index % len(children)]
        if kind == "pause_processor":
            self.stopped[child] = until
            return _signal(child, signal.SIGSTOP)
        self.expected_exit.add(pid)  # the daemon exits when one of its children does
        return _signal(child, signal.SIGKILL)

    def _reshard(self, kind: str) -> bool:
        kinesis, stream = self.pipeline.kinesis, self.pipeline.staging
        done = {"ok": False}

        def change() -> None:
            shards = [
                s
                for s in kinesis.list_shards(StreamName=stream)["Shards"]
                if "EndingSequenceNumber" not in s["SequenceNumberRange"]
            ]
            shards.sort(key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
            if kind == "split":
                widest = max(
                    shards,
                    key=lambda s: int(s["HashKeyRange"]["EndingHashKey"]) - int(s["HashKeyRange"]["StartingHashKey"]),
                )
                low, high = int(widest["HashKeyRange"]["StartingHashKey"]), int(widest["HashKeyRange"]["EndingHashKey"])
                kinesis.split_shard(
                    StreamName=stream, ShardToSplit=widest["ShardId"], NewStartingHashKey=str((low + high) // 2)
                )
            elif len(shards) >= 2:
                kinesis.merge_shards(
                    StreamName=stream, ShardToMerge=shards[0]["ShardId"], AdjacentShardToMerge=shards[1]["ShardId"]
                )
            else:
                return
            kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
            done["ok"] = True

        self.producer.reshard(change)
        return done["ok"]

    def close(self) -> None:
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        self.pipeline.stop_workers([w for w in self.pipeline.workers if not w.log.closed])
        self.proxy.__exit__()


def run_seed(plan: Plan, endpoint: str, workdir: Path) -> SeedResult:
    """Run one seed on the backend at ``endpoint``; its logs stay in ``workdir``."""
    started = time.monotonic()
    result = SeedResult(plan.seed, plan.profile, plan.kcl_mode, plan.workers, workdir=str(workdir))
    harness = _Harness(plan, endpoint, workdir)
    try:
        _drive(plan, harness, result)
    finally:
        harness.close()
    out = harness.producer.out
    result.events, result.events_written, result.staging_records = len(set(out.manifest)), out.events, out.records
    result.aggregates, result.largest_aggregate = out.aggregates, out.largest_aggregate
    result.producer_duplicates = out.duplicates
    result.poison = len(out.poison)
    result.faults = dict(
        sorted({**harness.faults, **{f"proxy_{k}": v for k, v in harness.proxy.injected.items()}}.items())
    )
    for kind in plan.poison:
        result.faults[f"poison_{kind}"] = result.faults.get(f"poison_{kind}", 0) + 1
    result.unexpected_exits, result.restarts = harness.unexpected, harness.restarts
    result.proxy_requests = dict(harness.proxy.requests)
    if harness.unexpected >= CRASH_LOOP:
        result.failures.append(f"crash loop: {harness.unexpected} daemon exits the harness did not cause")
    if harness.producer.error is not None:
        result.failures.append(f"producer failed: {harness.producer.error!r}")
    direct = replace(harness.pipeline.config, target_endpoint=endpoint)  # the check reads past the proxy
    verdict = check(direct, out, sorted(workdir.glob("worker-*.log")))
    result.target_records, result.dead_letter_records = verdict.target_records, verdict.dead_letter_records
    result.lost, result.duplicated = verdict.lost, verdict.duplicated
    result.explained_duplicates, result.out_of_order = verdict.explained_duplicates, verdict.out_of_order
    result.failures.extend(verdict.failures)
    result.ok = not result.failures
    result.total_s = round(time.monotonic() - started, 1)
    return result


def _wait_ready(harness: _Harness, timeout_s: float) -> float:
    """Wait until every staging shard has a processor (the KCL took a while to start); seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        harness.supervise()
        states = harness.pipeline.shard_states()
        if states and len(states) == harness.plan.staging_shards and all(s.owner for s in states.values()):
            break
        time.sleep(1.0)
    return round(time.monotonic() - started, 1)


def _drive(plan: Plan, harness: _Harness, result: SeedResult) -> None:
    for _ in range(plan.workers):
        harness.start_worker()
    result.startup_s = _wait_ready(harness, 120)  # the plan's times count from here: faults hit a busy copier
    t0 = time.monotonic()
    for window in plan.windows:
        harness.proxy.add(
            FaultWindow(window.kind, t0 + window.start_s, t0 + window.start_s + window.length_s, window.rate)
        )
    threading.Thread(target=harness.producer.run, name="chaos-producer", daemon=True).start()
    pending = [(t0 + action.at_s, index, action, 0) for index, action in enumerate(plan.actions)]
    while pending or not harness.producer.done.is_set():
        now = time.monotonic()
        harness.resume_due(now)
        for item in [p for p in pending if p[0] <= now]:
            pending.remove(item)
            when, index, action, tries = item
            if not harness.act(action, index):  # nothing to act on yet (workers restarting): a little later
                if tries < RETRIES:
                    pending.append((now + 2.0, index, action, tries + 1))
                else:
                    harness.faults[f"skipped_{action.kind}"] += 1
        harness.supervise()
        time.sleep(0.25)
    for pid in list(harness.stopped):  # no pause outlasts the plan
        harness.stopped[pid] = min(harness.stopped[pid], time.monotonic() + 15)
    settled = time.monotonic()
    deadline = settled + plan.catch_up_s
    last = harness.producer.out.last
    while time.monotonic() < deadline:
        harness.resume_due(time.monotonic())
        harness.supervise()
        if not harness.stopped and harness.pipeline.caught_up(last):
            result.caught_up_s = round(time.monotonic() - settled, 1)
            return
        time.sleep(1.0)
    states = harness.pipeline.shard_states()
    behind = {}
    for shard, position in last.items():
        committed = states[shard].position if shard in states else None
        if committed is None or committed < position:
            behind[shard] = f"{committed} < {position}"
    result.failures.append(f"not caught up within {plan.catch_up_s:.0f} s: stalled shards {behind}")
