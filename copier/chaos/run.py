"""One chaos seed: the real pipeline on the local backend, under the faults its plan draws, then the check.

What runs: fresh staging, target and dead-letter streams and a state table
on a shared local backend; 2 to 4 ``copier run`` workers (the KCL
MultiLangDaemon in Java spawning ``copier process`` children), whose copier
calls (target, dead-letter, state table) pass through the fault-injecting
proxy; and the producer (``copier.chaos.producer``) writing to staging.

While it runs, the harness carries out the plan's actions at their times
(SIGKILL of a processor, a daemon or a whole worker; SIGSTOP and SIGCONT of
a processor or a daemon, shorter or longer than the lease; workers joining
and leaving with SIGTERM; staging splits and merges; target splits and
merges, an ambiguous one the moment the proxy makes a target put ambiguous,
so that the copier verifies that put across the reshard; clock steps of a
host) and opens the proxy's fault windows. Each worker start runs with its
own properties file and on its host's clock (``copier.chaos.hosts``). Like
systemd's ``Restart=always``, it restarts a worker whose daemon exits, a
second later, on the same host; an exit it did not cause (a processor
exited on its own) is counted, and more than two are a crash loop.

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
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from copier.chaos.check import check, copier_events
from copier.chaos.hosts import Host, Hosts
from copier.chaos.producer import STAGING_MAX_RECORD_KIB, ChaosProducer
from copier.chaos.proxy import FaultProxy, FaultWindow, Injection
from copier.chaos.schedule import AUTO_SWITCHES, TARGET_RESHARDS, Action, Plan
from copier.config import load_config
from copier.kinesis import paged_shards
from copier.local.pipeline import LocalPipeline, Worker, child_pids, local_properties

__all__ = ["SeedResult", "run_seed"]

RESTART_DELAY_S = 1.0
RETRIES = 15  # an action that finds no worker with processors is tried again every 2 s, this many times
# A clock step waits longer for processors to live through it (the copier can be idle for 100 s: a killed KCL
# leader's lock expiring); then it steps a host whose processors start on the stepped clock.
STEP_RETRIES = 60
CRASH_LOOP = 3  # unexpected daemon exits in one seed that count as a crash loop
PUT_TIMEOUT_MS = 1000
SEED_COPIER = {  # copier.* keys every worker of a seed starts from (hosts.py adds each start's own settings)
    "unkeyedPolicy": "deadletter",
    "ordering": "partitionKey",  # the check fails a seed on disorder under it
    "putTimeoutMillis": str(PUT_TIMEOUT_MS),
    "maxBackoffMillis": "2000",
    "logLevel": "INFO",
}
# Small GetRecords batches: many puts and state writes, so that the proxy's fault windows meet traffic.
KCL_BATCHES = {"maxRecords": "200"}
KCL_2X = {"clientVersionConfig": "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"}
# How long an ambiguous target reshard waits for the proxy to make a target put ambiguous: the copier can be idle
# for 100 s (a killed KCL leader's lock expiring); the run's end stops the wait (FaultProxy.cancel_waits).
AMBIGUOUS_WAIT_S = 120.0
# How long after an ambiguous put the copier reads the target to verify it: a timed-out put waits out its timeout,
# then the put timeout again (copier.forward); a dropped answer comes at once, then the put timeout.
VERIFIED_AFTER_S = {"put_timeout": 2 * PUT_TIMEOUT_MS / 1000, "put_lost_response": PUT_TIMEOUT_MS / 1000}


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
    explained_duplicates: int = 0  # extra copies a possible_duplicates report excused (one per report and ID)
    extra_copies: int = 0  # copies beyond the first, explained or not
    changed: int = 0  # target copies whose key or bytes differ from what was produced
    possible_duplicate_reports: int = 0
    reported_ids: int = 0  # IDs the reports name, each report counted
    check_pages: int = 0  # GetRecords pages the check read (several per shard: the multi-page path)
    out_of_order: int = 0
    unordered: int = 0  # events not judged for order: a copy lay on a shard not holding its key (AUTO)
    scattered_staging: int = 0  # produced records on a staging shard not holding their key
    scattered_target: int = 0  # target records on a shard not holding their key
    poison: int = 0
    unkeyed_copies: int = 0  # copies beyond the first of poison records without an ID (unkeyedPolicy = forward)
    target_shards: int = 0  # target shards read by the check, closed ones included
    target_shards_closed: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    clock_skew_ms: int = 0  # copier.clockSkewMillis of every worker
    clocks: list[dict[str, Any]] = field(default_factory=list)  # per faked host: drawn, stepped, measured
    settings: list[dict[str, Any]] = field(default_factory=list)  # per worker start: its settings and host
    verified_across_settings: int = 0  # verified_pending lines whose batch was recorded under other settings
    target_reshards: list[dict[str, Any]] = field(default_factory=list)
    auto_switches: list[dict[str, Any]] = field(default_factory=list)  # stream, from and until (s), done
    ambiguous_puts: list[dict[str, Any]] = field(default_factory=list)  # when the proxy made a put ambiguous, where
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
        self.t0 = time.monotonic()  # the plan's clock; set again once every staging shard has a processor
        self.reshard_threads: list[threading.Thread] = []
        self.target_reshards: list[dict[str, Any]] = []  # appended by the reshard threads
        self.auto_switches: list[dict[str, Any]] = []  # appended by the AUTO switch threads
        self.closing = threading.Event()
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
                "deadLetterStreamName": dead_letter,  # under either policy (the check expects poison there)
                "clockSkewMillis": str(plan.clock_skew_ms),
                **SEED_COPIER,
            },
        )
        self.pipeline.create(plan.staging_shards, plan.target_shards)
        staging_arn = self.pipeline.kinesis.describe_stream_summary(StreamName=self.pipeline.staging)
        self.pipeline.kinesis.update_max_record_size(  # records the target cannot take: dead-lettered as oversize
            StreamARN=staging_arn["StreamDescriptionSummary"]["StreamARN"], MaxRecordSizeInKiB=STAGING_MAX_RECORD_KIB
        )
        self.pipeline.kinesis.create_stream(StreamName=dead_letter, ShardCount=1)
        self.pipeline.kinesis.get_waiter("stream_exists").wait(StreamName=dead_letter)
        self.producer = ChaosProducer(self.pipeline.kinesis, self.pipeline.staging, plan, run)
        self.hosts = Hosts(plan, self.pipeline)

    # -- workers ------------------------------------------------------------------------

    def start_worker(self, host: Host | None = None) -> Worker:
        """Start a worker on ``host`` (a restart) or on a new host, with the next start's properties."""
        name = f"w{next(self.rng_names)}"
        properties = self.hosts.properties(host or self.hosts.new_host(), name)
        worker = self.pipeline.start_worker(name, properties)
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
            self.start_worker(self.hosts.host_of[worker.name])

    def resume_due(self, now: float) -> None:
        for pid, when in list(self.stopped.items()):
            if now >= when:
                _signal(pid, signal.SIGCONT)
                del self.stopped[pid]

    def _pick(self, rng_index: int, processors: bool = True) -> Worker | None:
        """A live, running worker that has processors (a daemon just restarted has none yet), or with
        ``processors=False`` any live one."""
        candidates = [
            w
            for w in self.live
            if w.alive and w.proc.pid not in self.stopped and (not processors or child_pids(w.proc.pid))
        ]
        return candidates[rng_index % len(candidates)] if candidates else None

    def act(self, action: Action, index: int, last_try: bool = False) -> bool:
        """Carry out one action of the plan (``index`` picks the worker); False if it found nothing to act on.

        A clock step waits, like the other actions, for a worker with processors (a step they live through),
        but on its ``last_try`` steps any live worker's host: its processors start on the stepped clock."""
        kind = action.kind
        if kind in TARGET_RESHARDS or kind in AUTO_SWITCHES:  # in a thread of its own (it waits), counted there
            body = self._target_reshard if kind in TARGET_RESHARDS else self._auto_switch
            thread = threading.Thread(target=body, args=(action,), name=kind, daemon=True)
            self.reshard_threads.append(thread)
            thread.start()
            return True
        label: str | None = f"{kind}_past_lease" if action.params.get("past_lease") else kind
        if kind == "worker_join":
            self.start_worker()
        elif kind in ("split", "merge"):
            if not self._reshard(kind):
                return False
        elif kind == "clock_step":
            label = self._clock_step(action, index, last_try)
        else:
            worker = self._pick(index)
            if worker is None or not self._act_on(worker, action, index):
                return False
        if label is None:
            return False
        self.faults[label] += 1
        return True

    def _clock_step(self, action: Action, index: int, last_try: bool) -> str | None:
        """Step a host's clock (see :meth:`act`); the fault's name, or None if there was no host to step."""
        worker = self._pick(index) or (self._pick(index, processors=False) if last_try else None)
        if worker is None:
            return None
        running = len(child_pids(worker.proc.pid))
        return self.hosts.step(worker.name, int(action.params["step_ms"]), time.monotonic() - self.t0, running)

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
        children = child_pids(pid)
        if not children:
            return False
        child = children[index % len(children)]
        if kind == "pause_processor":
            self.stopped[child] = until
            return _signal(child, signal.SIGSTOP)
        self.expected_exit.add(pid)  # the daemon exits when one of its children does
        return _signal(child, signal.SIGKILL)

    def _reshard(self, kind: str) -> bool:
        """A staging split or merge, between two of the producer's puts."""
        done = {"ok": False}

        def change() -> None:
            done["ok"] = reshard_stream(self.pipeline.kinesis, self.pipeline.staging, kind)

        self.producer.reshard(change)
        return done["ok"]

    def _target_reshard(self, action: Action) -> None:
        """A target split or merge; an ambiguous one first makes the proxy turn the copier's next target put
        into its ``ambiguous_put`` fault (a window of one injection), and reshards the moment it has."""
        waited: Injection | None = None
        put = action.params.get("ambiguous_put")
        if put:
            now, target = time.monotonic(), self.pipeline.target
            self.proxy.add(FaultWindow(put, now, now, 1.0, stream=target))
            waited = self.proxy.wait_for((put,), target, now, AMBIGUOUS_WAIT_S)
        started = time.monotonic()
        done = not self.proxy.cancelled and reshard_stream(
            self.pipeline.kinesis, self.pipeline.target, action.kind.removeprefix("target_")
        )
        self.target_reshards.append(
            {
                "kind": action.kind,
                "planned_at_s": action.at_s,
                "at_s": round(started - self.t0, 1),
                "ambiguous_put": put,
                "waited_for": waited.kind if waited else None,
                "done": done,
                "started": started,
                "ended": time.monotonic(),
            }
        )

    def _auto_switch(self, action: Action) -> None:
        """The staging or target stream ignores partition keys for the action's seconds (RecordDistributionStrategy
        AUTO), then routes by them again; the staging stream is switched between two of the producer's puts."""
        staging = action.kind == "staging_auto"
        stream = self.pipeline.staging if staging else self.pipeline.target
        kinesis = self.pipeline.kinesis
        arn = kinesis.describe_stream_summary(StreamName=stream)["StreamDescriptionSummary"]["StreamARN"]

        def switch(strategy: str) -> None:
            def change() -> None:
                kinesis.update_stream_record_distribution_strategy(StreamARN=arn, RecordDistributionStrategy=strategy)

            self.producer.distribute(change, strategy == "AUTO") if staging else change()

        started = time.monotonic()
        switch("AUTO")
        self.closing.wait(float(action.params["seconds"]))
        switch("USER_PARTITION_KEY")
        ended = time.monotonic()
        self.auto_switches.append(
            {
                "stream": "staging" if staging else "target",
                "from_s": round(started - self.t0, 1),
                "until_s": round(ended - self.t0, 1),
            }
        )
        self.faults[action.kind] += 1

    def close(self) -> None:
        self.closing.set()
        self.proxy.cancel_waits()  # a target reshard still waiting for an ambiguous put is not done
        for thread in self.reshard_threads:
            thread.join(60)
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        self.pipeline.stop_workers([w for w in self.pipeline.workers if not w.log.closed])
        self.proxy.__exit__()
        self.hosts.cleanup()


def reshard_stream(kinesis: Any, stream: str, kind: str) -> bool:
    """Split the widest open shard of ``stream`` in the middle, or merge its two lowest (adjacent) open shards,
    and wait until the stream is active again; False if there is nothing to merge."""
    shards = [
        s for s in paged_shards(kinesis.list_shards, stream) if "EndingSequenceNumber" not in s["SequenceNumberRange"]
    ]
    shards.sort(key=lambda s: int(s["HashKeyRange"]["StartingHashKey"]))
    if kind == "split":
        widest = max(
            shards, key=lambda s: int(s["HashKeyRange"]["EndingHashKey"]) - int(s["HashKeyRange"]["StartingHashKey"])
        )
        low, high = int(widest["HashKeyRange"]["StartingHashKey"]), int(widest["HashKeyRange"]["EndingHashKey"])
        middle = str((low + high) // 2)
        kinesis.split_shard(StreamName=stream, ShardToSplit=widest["ShardId"], NewStartingHashKey=middle)
    elif len(shards) >= 2:
        kinesis.merge_shards(
            StreamName=stream, ShardToMerge=shards[0]["ShardId"], AdjacentShardToMerge=shards[1]["ShardId"]
        )
    else:
        return False
    kinesis.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
    return True


def _across_ambiguous_puts(reshards: list[dict[str, Any]], injections: list[Injection], target: str) -> None:
    """Mark each target reshard that came between an ambiguous target put and the read that verifies it
    (``across_ambiguous_put``: the kind, and how long before the reshard that put was sent)."""
    for reshard in reshards:
        across = [
            i
            for i in injections
            if i.stream == target
            and i.kind in VERIFIED_AFTER_S
            and i.at <= reshard["started"]
            and reshard["ended"] < i.at + VERIFIED_AFTER_S[i.kind]
        ]
        latest = max(across, key=lambda i: i.at) if across else None
        reshard["across_ambiguous_put"] = latest.kind if latest else None
        reshard["put_before_s"] = round(reshard["started"] - latest.at, 2) if latest else None


def worker_lease_ms() -> int:
    """The lease the workers of a seed run with, read from the properties the harness writes for them
    (``copier.leaseMillis``, else the KCL's ``failoverTimeMillis``): the schedule draws pauses around it."""
    with tempfile.TemporaryDirectory(prefix="copier-chaos-lease-") as tmp:
        path = local_properties(
            Path(tmp) / "lease.properties",
            "http://127.0.0.1:1",
            "lease",
            "staging",
            "target",
            "copier",
            kcl=KCL_BATCHES,
            deadLetterStreamName="dlq",
            **SEED_COPIER,
        )
        return load_config(path).lease_millis


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
    result.events, result.events_written, result.staging_records = len(out.keyed_ids), out.events, out.staging_records
    result.aggregates, result.largest_aggregate = out.aggregates, out.largest_aggregate
    result.producer_duplicates = out.duplicates
    result.poison = len(out.poison)
    _record_later_faults(harness, result)
    result.faults = dict(
        sorted({**harness.faults, **{f"proxy_{k}": v for k, v in harness.proxy.injected.items()}}.items())
    )
    for kind, count in Counter(p.kind for p in out.poison).items():  # written, not planned
        result.faults[f"poison_{kind}"] = count
    for kind, count in Counter(w.kind for w in harness.proxy.idle_windows()).items():
        result.faults[f"proxy_window_idle_{kind}"] = count  # drawn, but met no request before the run ended
    result.unexpected_exits, result.restarts = harness.unexpected, harness.restarts
    result.proxy_requests = dict(harness.proxy.requests)
    if harness.unexpected >= CRASH_LOOP:
        result.failures.append(f"crash loop: {harness.unexpected} daemon exits the harness did not cause")
    if harness.producer.error is not None:
        result.failures.append(f"producer failed: {harness.producer.error!r}")
    direct = replace(harness.pipeline.config, target_endpoint=endpoint)  # the check reads past the proxy
    logs = sorted(workdir.glob("worker-*.log"))
    verdict = check(direct, out, logs, unkeyed_forwarded=harness.hosts.unkeyed_forwarded())
    result.target_records, result.dead_letter_records = verdict.target_records, verdict.dead_letter_records
    result.unkeyed_copies = verdict.unkeyed_copies
    result.target_shards, result.target_shards_closed = verdict.target_shards, verdict.target_shards_closed
    verified = copier_events(logs, {"verified_pending"})
    result.verified_across_settings = sum(1 for e in verified if e.get("settings_changed"))
    result.lost, result.duplicated = verdict.lost, verdict.duplicated
    result.explained_duplicates, result.out_of_order = verdict.explained_duplicates, verdict.out_of_order
    result.extra_copies, result.changed = verdict.extra_copies, verdict.changed
    result.possible_duplicate_reports, result.reported_ids = verdict.possible_duplicate_reports, verdict.reported_ids
    result.check_pages = verdict.pages
    result.unordered, result.scattered_staging = verdict.unordered, verdict.scattered_staging
    result.scattered_target = verdict.scattered_target
    result.failures.extend(verdict.failures)
    result.ok = not result.failures
    result.total_s = round(time.monotonic() - started, 1)
    return result


def _record_later_faults(harness: _Harness, result: SeedResult) -> None:
    """Count what was injected of the clock, settings and target-reshard faults, and keep their details."""
    harness.faults.update(harness.hosts.faults())
    reshards = sorted(harness.target_reshards, key=lambda r: r["started"])
    _across_ambiguous_puts(reshards, list(harness.proxy.log), harness.pipeline.target)
    for reshard in reshards:
        harness.faults[reshard["kind"] if reshard["done"] else f"skipped_{reshard['kind']}"] += 1
        if reshard["done"] and reshard["across_ambiguous_put"]:
            harness.faults["target_reshard_across_ambiguous_put"] += 1
        del reshard["started"], reshard["ended"]
    result.target_reshards = reshards
    result.auto_switches = sorted(harness.auto_switches, key=lambda a: a["from_s"])
    streams = {harness.pipeline.target: "target", harness.pipeline.config.dead_letter_stream_name: "dead-letter"}
    result.ambiguous_puts = [
        {"at_s": round(i.at - harness.t0, 2), "kind": i.kind, "stream": streams.get(i.stream, i.stream)}
        for i in harness.proxy.log
        if i.kind in VERIFIED_AFTER_S
    ]
    result.clock_skew_ms = harness.plan.clock_skew_ms
    result.clocks = harness.hosts.clock_results()
    result.settings = harness.hosts.settings_results()


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
    t0 = harness.t0 = time.monotonic()
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
            retries = STEP_RETRIES if action.kind == "clock_step" else RETRIES
            if not harness.act(action, index, tries >= retries):  # nothing to act on yet (workers restarting): later
                if tries < retries:
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
