"""A whole copier pipeline on a local backend: streams, table, workers, progress.

Used by ``copier demo`` and by the end-to-end test: the same steps an
operator takes (``copier init``, ``copier run`` per host), on one machine.
Workers are real ``copier run`` processes (the KCL MultiLangDaemon in Java,
spawning ``copier process`` children); nothing here is faked.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

import boto3

from copier.adapters.dynamo import DynamoStateStore
from copier.adapters.summaryshare import SummaryShare
from copier.core.config import Config, load_config
from copier.core.positions import Position
from copier.core.state import ShardState, shard_key

__all__ = ["LocalPipeline", "Worker", "child_pids", "local_properties", "shard_owner"]

# KCL settings that make a local run start in seconds instead of minutes
# (measured: the defaults take about two minutes to the first record).
FAST_KCL = {
    "failoverTimeMillis": "3000",
    "leaseAssignmentIntervalMillis": "1000",
    "workerMetricsReporterFreqInMillis": "1000",
    "shardSyncIntervalMillis": "1000",
    "parentShardPollIntervalMillis": "500",
    "idleTimeBetweenReadsInMillis": "200",
    "schedulerInitializationBackoffTimeMillis": "500",
    "taskBackoffTimeMillis": "200",
    "listShardsBackoffTimeInMillis": "200",
    "shutdownGraceMillis": "5000",
    "callProcessRecordsEvenForEmptyRecordList": "true",
    "isGracefulLeaseHandoffEnabled": "false",  # KCL 3.1.3 can leave a lease stuck in a handoff
}

# The copier keys of a local run, unless the caller gives others.
LOCAL_COPIER = {
    "dedupKey": "json:eventId",
    "jvmArgs": "-Daws.cborEnabled=false",
    "checkpointIntervalMillis": "2000",
    "putTimeoutMillis": "1000",
    "clockSkewMillis": "200",
}


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a daemon's ``copier process`` children), from /proc."""
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


def local_properties(
    path: Path,
    endpoint: str,
    application: str,
    staging: str,
    target: str,
    copier_bin: str,
    kcl: dict[str, str] | None = None,
    dynamodb_endpoint: str | None = None,
    **copier: str,
) -> Path:
    """Write a properties file for a local run: local endpoints, polling (unless ``kcl`` gives another
    ``retrievalMode``), no CloudWatch, fast KCL timings.
    ``dynamodb_endpoint``: DynamoDB's when it is not ``endpoint`` (the independent backend: two servers).

    ``kcl``: further daemon keys (``executableName`` among them, to run another processor);
    ``copier``: further ``copier.*`` keys (without the prefix), replacing those of :data:`LOCAL_COPIER`.
    """
    daemon = {**FAST_KCL, **(kcl or {})}
    executable = daemon.pop("executableName", f"{copier_bin} process --properties {path}")
    retrieval = daemon.pop("retrievalMode", "POLLING")  # FANOUT only where the backend serves SubscribeToShard
    # an application started at a point in time gives initialPositionInStreamExtended alone (copier.core.startpoint)
    position = {} if "initialPositionInStreamExtended" in daemon else {"initialPositionInStream": "TRIM_HORIZON"}
    keys = {**LOCAL_COPIER, **copier}  # an override replaces the default: one line a key
    lines = [
        f"executableName = {executable}",
        f"applicationName = {application}",
        f"streamName = {staging}",
        "regionName = us-east-1",
        f"kinesisEndpoint = {endpoint}",
        f"dynamoDBEndpoint = {dynamodb_endpoint or endpoint}",
        *(f"{k} = {v}" for k, v in position.items()),
        "AwsCredentialsProvider = DefaultCredentialsProvider",
        f"retrievalMode = {retrieval}",
        "metricsLevel = NONE",
        "disableWorkerMetrics = true",
        *(f"{k} = {v}" for k, v in daemon.items()),
        f"copier.targetStreamName = {target}",
        *(f"copier.{k} = {v}" for k, v in keys.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def shard_owner(state: ShardState, by_jvm: Mapping[int, str], parent_of: Callable[[int], int | None]) -> str | None:
    """The name of the worker whose processor holds the shard (``by_jvm``: each live worker's daemon JVM), or
    None while it is between owners: nobody took it yet, its lease is released or a successor announced
    (the KCL is moving it: one processor lets go, the next takes over), or its processor or that processor's
    worker is gone. Counted this way, the shards each worker holds and those between owners add up to all of
    them at every moment, also while the KCL moves leases about.

    A state item's owner is ``host:pid:nonce`` of a ``copier process``
    child; its parent is the worker's JVM, the child of ``copier run``.
    """
    if state.owner is None or state.lease_until_ms == 0 or state.successor is not None:
        return None
    parent = parent_of(int(state.owner.split(":")[1]))
    return by_jvm.get(parent) if parent is not None else None


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@dataclass
class Worker:
    """One ``copier run`` (a daemon host), its process group and its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def jvm_pid(self) -> int | None:
        """The daemon's JVM, the one child of ``copier run`` (None before it started and after it ended)."""
        children = child_pids(self.proc.pid)
        return children[0] if children else None

    def processor_pids(self) -> list[int]:
        """The ``copier process`` children of the daemon's JVM."""
        jvm = self.jvm_pid
        return child_pids(jvm) if jvm is not None else []

    def kill_daemon(self) -> None:
        """SIGKILL the JVM only: its processors lose their daemon mid-batch and become zombies; ``copier run``
        reports the kill and exits."""
        jvm = self.jvm_pid
        if self.alive and jvm is not None:
            try:
                os.kill(jvm, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif self.alive:  # the JVM has not started yet: the host's process is all there is to kill
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def kill_host(self) -> None:
        """SIGKILL the daemon and every processor it spawned, as when a host dies."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM: the daemon asks its processors to checkpoint and release, then exits."""
        if self.alive:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, grace_s: float = 15) -> int:
        """SIGTERM (graceful: processors checkpoint), then SIGKILL the group if it lingers."""
        if self.alive:
            self.terminate()
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_host()
        self.log.close()
        return self.proc.returncode


@dataclass
class LocalPipeline:
    """Streams, state table and workers of one local run."""

    endpoint: str
    workdir: Path
    staging: str = "staging"
    target: str = "target"
    application: str = "copier-demo"
    kcl: dict[str, str] = field(default_factory=dict)
    copier: dict[str, str] = field(default_factory=dict)
    workers: list[Worker] = field(default_factory=list)
    producers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    dynamodb_endpoint: str | None = None  # when not ``endpoint`` (the independent backend)
    # staging_records(): where each shard's count stopped ("" or absent: not read yet; None: closed, read to its
    # end) and the records counted so far
    _read_to: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)
    _counted: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.copier_bin = str(Path(sys.executable).with_name("copier"))
        self.properties = local_properties(
            self.workdir / "copier.properties",
            self.endpoint,
            self.application,
            self.staging,
            self.target,
            self.copier_bin,
            self.kcl,
            self.dynamodb_endpoint,
            **self.copier,
        )
        self.config: Config = load_config(self.properties)
        self.kinesis: Any = boto3.session.Session().client(
            "kinesis", region_name="us-east-1", endpoint_url=self.endpoint
        )
        # The pipeline reads the state table straight from the backend, whatever endpoint the copier uses.
        self.store = DynamoStateStore(replace(self.config, state_endpoint=self.dynamodb_endpoint or self.endpoint))

    def create(self, staging_shards: int, target_shards: int) -> None:
        """Create both streams and the state table (as ``copier init`` does)."""
        for name, shards in ((self.staging, staging_shards), (self.target, target_shards)):
            self.kinesis.create_stream(StreamName=name, ShardCount=shards)
            self.kinesis.get_waiter("stream_exists").wait(
                StreamName=name, WaiterConfig={"Delay": 0.2, "MaxAttempts": 100}
            )
        self.store.create_table()

    def start_worker(self, name: str, properties: Path | None = None, journal: bool = False) -> Worker:
        """``copier run`` with the pipeline's properties, or with ``properties`` (a worker started with another
        configuration, as in a rolling deploy); ``journal``: its log file stands for the systemd journal
        (``JOURNAL_STREAM`` names it), so its lines carry their syslog priority."""
        log_path = self.workdir / f"worker-{name}.log"
        log = log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        if journal:
            status = os.fstat(log.fileno())
            env["JOURNAL_STREAM"] = f"{status.st_dev}:{status.st_ino}"
        proc = subprocess.Popen(
            [self.copier_bin, "run", "--properties", str(properties or self.properties)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
        worker = Worker(name, proc, log_path, log)
        self.workers.append(worker)
        return worker

    @property
    def spark_scratch(self) -> Path:
        """Where the producers' Spark keeps its temporary files (removed by :meth:`stop_all`)."""
        return self.workdir / "spark-tmp"

    def start_producer(self, input_dir: Path, checkpoint: Path, *options: str) -> subprocess.Popen[bytes]:
        """``copier produce --once`` on ``input_dir`` (a Spark job, local mode), logging to the workdir.

        Spark's scratch files go to :attr:`spark_scratch`, not /tmp: a job SIGKILLed (as the demo does) never
        removes its own (``spark-*``, ``blockmgr-*``, ``artifacts-*``, ``liblz4-java-*.so``), and each demo
        left them behind in /tmp.
        """
        log = (self.workdir / "producer.log").open("ab")
        scratch = self.spark_scratch
        scratch.mkdir(exist_ok=True)
        env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(scratch),  # block manager and spark-* directories
            "TMPDIR": str(scratch),  # the Python side's temporary files
            # the driver JVM's own (lz4's native library, artifact directories): after any options of the caller's
            "SPARK_SUBMIT_OPTS": f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} -Djava.io.tmpdir={scratch}".strip(),
        }
        command = [self.copier_bin, "produce", "--properties", str(self.properties), "--input", str(input_dir)]
        command += ["--checkpoint", str(checkpoint), "--once", *options]
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        log.close()
        self.producers.append(proc)
        return proc

    def kill_producer(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a producer job and its Spark JVM (its process group)."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def verify(self, manifest_ids: list[str], *options: str) -> subprocess.CompletedProcess[str]:
        """``copier verify`` against a manifest of the produced IDs (written to the workdir), with ``options``
        (``--json``)."""
        manifest = self.workdir / "manifest.txt"
        manifest.write_text("\n".join(manifest_ids) + "\n")
        return subprocess.run(
            [self.copier_bin, "verify", "--properties", str(self.properties), "--manifest", str(manifest), *options],
            capture_output=True,
            text=True,
            timeout=600,
        )

    def _staging_pages(self) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """Every page of records of every staging shard, from the start."""
        for shard in self.kinesis.list_shards(StreamName=self.staging)["Shards"]:
            iterator = self.kinesis.get_shard_iterator(
                StreamName=self.staging, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            while iterator:
                page = self.kinesis.get_records(ShardIterator=iterator, Limit=10000)
                if not page["Records"]:
                    break
                yield shard["ShardId"], page["Records"]
                iterator = page.get("NextShardIterator")

    def staging_written(self) -> bool:
        """Does the staging stream hold any record yet? (one cheap read per shard)"""
        for shard in self.kinesis.list_shards(StreamName=self.staging)["Shards"]:
            iterator = self.kinesis.get_shard_iterator(
                StreamName=self.staging, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )["ShardIterator"]
            if self.kinesis.get_records(ShardIterator=iterator, Limit=1)["Records"]:
                return True
        return False

    def staging_tips(self) -> dict[str, Position]:
        """The last position of every staging shard that holds records (reads the whole stream)."""
        return {shard: Position.parse(records[-1]["SequenceNumber"]) for shard, records in self._staging_pages()}

    def staging_records(self) -> int:
        """How many records the staging stream holds, read on from where the last call stopped in each shard
        (the demo asks every 2 s while the producer writes: reading the whole stream each time would load the
        backend the workers share)."""
        for shard in self.kinesis.list_shards(StreamName=self.staging)["Shards"]:
            shard_id = shard["ShardId"]
            iterator = self._read_to.get(shard_id, "")
            if iterator is None:
                continue  # a closed shard read to its end
            if not iterator:
                iterator = self.kinesis.get_shard_iterator(
                    StreamName=self.staging, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )["ShardIterator"]
            while iterator:
                page = self.kinesis.get_records(ShardIterator=iterator, Limit=10000)
                self._counted += len(page["Records"])
                iterator = page.get("NextShardIterator")  # None at a closed shard's end
                if not page["Records"]:
                    break  # the shard's tip: the next call goes on from here
            self._read_to[shard_id] = iterator
        return self._counted

    def stop_all(self) -> None:
        """Stop every producer and worker this pipeline started (workers all at once), and remove the Spark
        scratch files the producers left and the run directories of workers that were SIGKILLed (killed, or
        stopped on a loaded machine later than the grace allows: nothing removed theirs)."""
        for proc in self.producers:
            self.kill_producer(proc)
        shutil.rmtree(self.spark_scratch, ignore_errors=True)
        self.stop_workers([w for w in self.workers if not w.log.closed])
        SummaryShare.sweep()

    def stop_workers(self, workers: list[Worker]) -> list[int]:
        """SIGTERM the workers together (one by one, the survivors would take the leases over), then wait."""
        for worker in workers:
            worker.terminate()
        return [worker.stop() for worker in workers]

    def owners(self, states: dict[str, ShardState] | None = None) -> dict[str, str | None]:
        """Each open staging shard's owner, as the name of the live worker whose processor holds it (None:
        between owners, see :func:`shard_owner`); ``states``: the shards' states if just read."""
        by_jvm = {pid: w.name for w in self.workers if w.alive and (pid := w.jvm_pid) is not None}
        states = self.shard_states() if states is None else states
        return {
            shard_id: shard_owner(state, by_jvm, _parent_pid) for shard_id, state in states.items() if not state.closed
        }

    def shards_owned(self) -> dict[str, int]:
        """How many open shards each live worker's processors own, by worker name."""
        owned = dict.fromkeys((w.name for w in self.workers if w.alive), 0)
        for name in self.owners().values():
            if name is not None:
                owned[name] += 1
        return owned

    def busiest_worker(self) -> Worker:
        """The live worker whose processors own the most shards (so that killing it moves leases)."""
        owned = self.shards_owned()
        name = max(owned, key=lambda n: owned[n])
        return next(w for w in self.workers if w.name == name and w.alive)

    def shard_states(self) -> dict[str, ShardState]:
        """Every staging shard's state item, by shard ID (as ``copier status`` reads them)."""
        shards = [s["ShardId"] for s in self.kinesis.list_shards(StreamName=self.staging)["Shards"]]
        keys = {shard_key(self.staging, shard_id): shard_id for shard_id in shards}
        return {keys[key]: state for key, state in self.store.get_many(keys).items()}

    def counters(self, states: dict[str, ShardState] | None = None) -> dict[str, int]:
        """The state items' counters summed over the staging shards; ``states``: the shards' states if just read."""
        total: dict[str, int] = {}
        for state in (self.shard_states() if states is None else states).values():
            for name, value in state.counters.items():
                total[name] = total.get(name, 0) + value
        return total

    def caught_up(self, last: dict[str, Position]) -> bool:
        """Has every staging shard committed its last produced record?"""
        states = self.shard_states()
        for shard_id, position in last.items():
            state = states.get(shard_id)
            if state is None or state.position is None or state.position < position:
                return False
        return True

    def split(self, shard_id: str) -> list[str]:
        """Split a staging shard in the middle of its hash range; return the children."""
        shards = {s["ShardId"]: s for s in self.kinesis.list_shards(StreamName=self.staging)["Shards"]}
        hashes = shards[shard_id]["HashKeyRange"]
        middle = (int(hashes["StartingHashKey"]) + int(hashes["EndingHashKey"])) // 2
        self.kinesis.split_shard(StreamName=self.staging, ShardToSplit=shard_id, NewStartingHashKey=str(middle))
        self.kinesis.get_waiter("stream_exists").wait(StreamName=self.staging, WaiterConfig={"Delay": 0.2})
        after = self.kinesis.list_shards(StreamName=self.staging)["Shards"]
        return [s["ShardId"] for s in after if shard_id in (s.get("ParentShardId"), s.get("AdjacentParentShardId"))]

    def wait(self, condition: Any, timeout_s: float, report: Any = None, every_s: float = 2.0) -> bool:
        """Poll ``condition`` until true or timeout; call ``report`` every ``every_s``."""
        deadline = time.monotonic() + timeout_s
        next_report = 0.0
        while time.monotonic() < deadline:
            if condition():
                return True
            if report is not None and time.monotonic() >= next_report:
                report()
                next_report = time.monotonic() + every_s
            time.sleep(0.5)
        return bool(condition())
