"""The chaos harness: one seed's pipeline, its workers, and the plan's actions carried out on them.

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

When the actions are due and how long the run waits is :mod:`copier.chaos.run`'s
(the driving loop); this module is what acts.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import boto3

from copier.adapters.kinesis import paged_shards
from copier.chaos.hosts import Host, Hosts
from copier.chaos.limits import ShardLimits
from copier.chaos.producer import STAGING_MAX_RECORD_KIB, ChaosProducer
from copier.chaos.proxy import FaultProxy, FaultWindow, Injection
from copier.chaos.schedule import AUTO_SWITCHES, TARGET_RESHARDS, Action, Plan
from copier.chaos.throttle import ShardThrottle
from copier.core.config import load_config
from copier.local.independent import Endpoints, create_lease_table
from copier.local.pipeline import LocalPipeline, Worker, local_properties

__all__ = ["PUT_TIMEOUT_MS", "Harness", "put_timeout_ms", "reshard_stream", "worker_lease_ms"]

RESTART_DELAY_S = 1.0
PUT_TIMEOUT_MS = 3000  # on moto (see BACKEND_TIMING)
# The protocol's bound on a put's life at the server: what a request put is readable within the put timeout
# after its deadline (docs/protocol.md, "Verifying a chunk in flight"). AWS answers a PutRecords in tens of
# milliseconds; moto here in a few, but its slowest answer in the 50 seeds on code 4328c4dc58913813 took
# 1,968 ms on the loaded 2-core machine, and one put came back after the 1 s timeout the harness then gave it;
# kinesis-mock takes seconds for a large one (measured: 2.0 s for 64 records of 8 KB, 4.7 s for 200), so a
# short timeout would have the copier verify before the request it timed out on lands: a harness that breaks
# the bound, not a copier that does. So moto's put timeout is 3 s and kinesis-mock's 8 s, each with a lease
# (failoverTimeMillis, renewed every third) that `copier check-config` accepts: at least the put timeout plus
# the larger of copier.clockSkewMillis (at most 1 s in a seed) and 1 s, plus 2 s (copier.core.configwarnings).
BACKEND_TIMING: dict[str, dict[str, int]] = {
    "moto": {"putTimeoutMillis": PUT_TIMEOUT_MS, "failoverTimeMillis": 6000},
    "independent": {"putTimeoutMillis": 8000, "failoverTimeMillis": 15000},
}


def put_timeout_ms(backend: str) -> int:
    """The put timeout a seed's workers run with on ``backend``."""
    return BACKEND_TIMING[backend]["putTimeoutMillis"]


SEED_COPIER = {  # copier.* keys every worker of a seed starts from (hosts.py adds each start's own settings)
    "unkeyedPolicy": "deadletter",
    "ordering": "partitionKey",  # the check fails a seed on disorder under it
    "maxBackoffMillis": "2000",
    "logLevel": "INFO",
}
# Small GetRecords batches: many puts and state writes, so that the proxy's fault windows meet traffic.
KCL_BATCHES = {"maxRecords": "200"}


def seed_copier(backend: str) -> dict[str, str]:
    """:data:`SEED_COPIER` with ``backend``'s put timeout."""
    return {**SEED_COPIER, "putTimeoutMillis": str(put_timeout_ms(backend))}


def seed_kcl(backend: str) -> dict[str, str]:
    """:data:`KCL_BATCHES` with ``backend``'s lease."""
    return {**KCL_BATCHES, "failoverTimeMillis": str(BACKEND_TIMING[backend]["failoverTimeMillis"])}


KCL_2X = {"clientVersionConfig": "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"}
# How long an ambiguous target reshard waits for the proxy to make a target put ambiguous: the copier can be idle
# for 100 s (a killed KCL leader's lock expiring); the run's end stops the wait (FaultProxy.cancel_waits).
AMBIGUOUS_WAIT_S = 120.0


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


class Harness:
    """One seed's pipeline on the backend, behind the fault proxy, with its producer and hosts; it starts,
    supervises, signals and stops the workers and carries out one action of the plan at a time (:meth:`act`).
    :meth:`close` ends everything it started."""

    def __init__(self, plan: Plan, backend: Endpoints, workdir: Path) -> None:
        """``backend``: the local backend's endpoints (moto: one URL for both services); on the independent one
        the KCL's lease table is made first, with its index (dynalite cannot add it later)."""
        self.plan = plan
        self.backend = backend
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
        self.proxy = FaultProxy(
            backend.kinesis,
            plan.seed,
            hang_s=put_timeout_ms(backend.impl) / 1000 + 0.5,
            dynamodb_upstream=backend.dynamodb,
        )
        self.proxy.__enter__()
        dead_letter = f"{run}-dlq"
        self.pipeline = LocalPipeline(
            backend.kinesis,
            workdir,
            staging=f"{run}-staging",
            target=f"{run}-target",
            application=run,
            kcl={**seed_kcl(backend.impl), **(KCL_2X if plan.kcl_mode == "2.x" else {})},
            copier={
                "targetEndpoint": self.proxy.endpoint,
                "stateTableEndpoint": self.proxy.endpoint,
                "deadLetterStreamName": dead_letter,  # under either policy (the check expects poison there)
                "clockSkewMillis": str(plan.clock_skew_ms),
                **seed_copier(backend.impl),
            },
            dynamodb_endpoint=backend.dynamodb,
        )
        self.pipeline.create(plan.staging_shards, plan.target_shards)
        if backend.impl == "independent":
            create_lease_table(backend.dynamodb, run)
        if "oversize" in plan.poison:  # records the target cannot take: dead-lettered as oversize
            staging_arn = self.pipeline.kinesis.describe_stream_summary(StreamName=self.pipeline.staging)
            self.pipeline.kinesis.update_max_record_size(
                StreamARN=staging_arn["StreamDescriptionSummary"]["StreamARN"],
                MaxRecordSizeInKiB=STAGING_MAX_RECORD_KIB,
            )
        self.pipeline.kinesis.create_stream(StreamName=dead_letter, ShardCount=1)
        self.pipeline.kinesis.get_waiter("stream_exists").wait(StreamName=dead_letter)
        self.producer = ChaosProducer(self._producer_client(), self.pipeline.staging, plan, run)
        self.hosts = Hosts(plan, self.pipeline)

    def _producer_client(self) -> Any:
        """The producer's Kinesis client: the backend's, or under the shard limits the proxy's, which then
        enforces them on the copier's target calls and on the producer's staging writes alike."""
        if not self.plan.shard_limits:
            return self.pipeline.kinesis
        kinesis = self.pipeline.kinesis
        self.proxy.throttle = ShardThrottle(
            ShardLimits(time.monotonic), lambda stream: paged_shards(kinesis.list_shards, stream)
        )
        return boto3.session.Session().client("kinesis", region_name="us-east-1", endpoint_url=self.proxy.endpoint)

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
            w for w in self.live if w.alive and w.jvm_pid not in self.stopped and (not processors or w.processor_pids())
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
        running = len(worker.processor_pids())
        return self.hosts.step(worker.name, int(action.params["step_ms"]), time.monotonic() - self.t0, running)

    def _act_on(self, worker: Worker, action: Action, index: int) -> bool:
        kind, pid = action.kind, worker.proc.pid  # copier run: its exit is the worker's
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
                jvm = worker.jvm_pid
                if jvm is None:
                    return False
                self.stopped[jvm] = until
                return _signal(jvm, signal.SIGSTOP)
            self.expected_exit.add(pid)
            worker.kill_daemon() if kind == "kill_daemon" else worker.kill_host()
            return True
        children = worker.processor_pids()
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


def worker_lease_ms(backend: str = "moto") -> int:
    """The lease the workers of a seed run with on ``backend``, read from the properties the harness writes for
    them (``copier.leaseMillis``, else the KCL's ``failoverTimeMillis``): the schedule draws pauses around it."""
    with tempfile.TemporaryDirectory(prefix="copier-chaos-lease-") as tmp:
        path = local_properties(
            Path(tmp) / "lease.properties",
            "http://127.0.0.1:1",
            "lease",
            "staging",
            "target",
            "copier",
            kcl=seed_kcl(backend),
            deadLetterStreamName="dlq",
            **seed_copier(backend),
        )
        return load_config(path).lease_millis
