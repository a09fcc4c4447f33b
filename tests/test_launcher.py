"""copier's launcher of the KCL MultiLangDaemon (copier.kcl.launcher): built from its Java sources, put on the
daemon's command line with the configured dispatch interval, and taken up by the real KCL scheduler."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest

from copier.core.config import load_config, parse_config
from copier.core.errors import ConfigError, CopierError
from copier.kcl import daemon as daemon_module
from copier.kcl import launcher
from copier.kcl.daemon import MAIN_CLASS, daemon_command, daemon_warnings
from copier.kcl.jars import jars
from copier.local.pipeline import LocalPipeline, Worker, local_properties
from copier.local.producer import produce
from tests.support.backend import free_port
from tests.support.fakes import config
from tests.test_config import BASE

CLASSES = (
    "software/amazon/kinesis/multilang/CopierMultiLangDaemon.class",
    "software/amazon/kinesis/multilang/config/CopierSchedulerBuilder.class",
    "software/amazon/kinesis/coordinator/CopierScheduler.class",
    "software/amazon/kinesis/leader/CopierLeaderDecider.class",
)


def _pipeline(endpoint: str, tmp_path: Path, name: str, **copier: str) -> LocalPipeline:
    """A local pipeline of its own (streams, application) with the daemon's INFO log and ``copier`` keys."""
    return LocalPipeline(
        endpoint,
        tmp_path,
        staging=f"staging-{name}",
        target=f"target-{name}",
        application=f"copier-{name}",
        copier={"daemonLogLevel": "INFO", **copier},
    )


def _worker_caught_up(pipeline: LocalPipeline, tmp_path: Path, name: str, run: str, seed: int) -> Worker:
    """30 new events, then worker ``name`` started; it returns once they are all forwarded."""
    produced = produce(pipeline.kinesis, pipeline.staging, 30, run=run, seed=seed)
    worker = pipeline.start_worker(name)
    assert pipeline.wait(lambda: pipeline.caught_up(produced.last), 240), f"not caught up; see {tmp_path}"
    return worker


def _dynamodb(endpoint: str) -> Any:
    return boto3.session.Session().client("dynamodb", region_name="us-east-1", endpoint_url=endpoint)


@pytest.mark.parametrize(
    ("key", "field", "default", "good", "bad"),
    [
        # below 50 the scheduler would spin for nothing, above 10 s every start crawls
        ("copier.shardConsumerDispatchPollIntervalMillis", "dispatch_millis", 200, 1000, ("10", "20000", "fast")),
        # 0 syncs at once; over 30000 would wait longer than the KCL itself
        ("copier.emptyLeaseTableWaitMillis", "empty_table_wait_millis", 3000, 0, ("-1", "30001", "soon")),
        # under 4 s a GC pause costs the leader its lock; over 2 minutes is longer than the KCL's own
        ("copier.leaderLockMillis", "leader_lock_millis", 10000, 120_000, ("3999", "120001", "short")),
    ],
)
def test_the_launchers_settings_have_defaults_and_refuse_values_out_of_range(
    key: str, field: str, default: int, good: int, bad: tuple[str, ...]
) -> None:
    """Each key the launcher applies: its default, a value in range taken, and each bad value refused by name."""
    assert getattr(parse_config(BASE), field) == default
    assert getattr(parse_config(BASE + f"{key} = {good}\n"), field) == good
    for value in bad:
        with pytest.raises(ConfigError) as info:
            parse_config(BASE + f"{key} = {value}\n")
        assert info.value.key == key


def test_the_build_compiles_every_class_into_the_same_jar_every_time(tmp_path: Path) -> None:
    """Fixed entry times: two builds of the same sources give the same bytes (the release bundle is locked)."""
    first = launcher.build(tmp_path / "a.jar")
    second = launcher.build(tmp_path / "b.jar")
    assert first.read_bytes() == second.read_bytes()
    assert set(CLASSES) <= set(zipfile.ZipFile(first).namelist())
    assert launcher.jar_digest(zipfile.ZipFile(first)) == launcher.sources_digest()
    assert not list(tmp_path.glob("*.tmp")), "written under a name of its own, then renamed"


def test_the_jar_in_the_tree_was_built_from_the_sources_in_the_tree() -> None:
    """make install recompiles it when a source changes; a stale jar (a source edited, added or removed since)
    would run code no test saw."""
    jar = launcher.launcher_jar()
    assert jar is not None, "make install compiles it"
    with zipfile.ZipFile(jar) as z:
        assert launcher.jar_digest(z) == launcher.sources_digest()
        assert set(CLASSES) <= set(z.namelist())


def test_the_build_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No javac (a host with a JRE only), and a compile error, each get a message, in copier's error tree."""
    with monkeypatch.context() as m:
        m.setattr(launcher.shutil, "which", lambda name: None)
        with pytest.raises(launcher.LauncherBuildError, match="javac is not on PATH: building copier needs a JDK"):
            launcher.build(tmp_path / "x.jar")
    with pytest.raises(launcher.LauncherBuildError, match="cannot run /nonexistent/javac"):
        launcher.build(tmp_path / "x.jar", javac="/nonexistent/javac")
    broken = tmp_path / "java"
    (broken / "p").mkdir(parents=True)
    (broken / "p" / "Broken.java").write_text("package p; public class Broken { int x = ; }\n")
    monkeypatch.setattr(launcher, "SOURCES", broken)
    with pytest.raises(CopierError, match=r"(?s)javac failed on .*Broken\.java:1: error"):
        launcher.build(tmp_path / "y.jar")
    assert not (tmp_path / "y.jar").exists()


def test_the_daemon_runs_under_the_launcher_with_the_configured_interval(tmp_path: Path) -> None:
    """The launcher's jar after the KCL's on the classpath, its class as the main class, the interval passed."""
    assert launcher.launcher_jar() is not None, "make install compiles it"
    cfg = replace(
        config(),
        executable_name="copier process",
        dispatch_millis=350,
        empty_table_wait_millis=0,
        leader_lock_millis=9000,
    )
    command = daemon_command(cfg, str(tmp_path / "p.properties"), {}, "java")
    classpath = command[command.index("-cp") + 1].split(os.pathsep)
    assert classpath == [*map(str, jars()), str(launcher.LAUNCHER_JAR)]
    assert command[command.index("-cp") + 2] == launcher.LAUNCHER_CLASS
    assert f"-D{launcher.DISPATCH_PROPERTY}=350" in command[: command.index("-cp")]
    assert f"-D{launcher.EMPTY_TABLE_WAIT_PROPERTY}=0" in command[: command.index("-cp")]
    assert f"-D{launcher.LEADER_LOCK_PROPERTY}=9000" in command[: command.index("-cp")]
    assert not any("launcher" in w for w in daemon_warnings(cfg))


def test_without_the_jar_the_stock_daemon_runs_and_copier_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """copier installed without make install or the bundle still runs, on the KCL's own 1 s, and says so."""
    monkeypatch.setattr(daemon_module, "launcher_jar", lambda: None)
    cfg = replace(config(), executable_name="copier process")
    command = daemon_command(cfg, str(tmp_path / "p.properties"), {}, "java")
    assert command[command.index("-cp") + 2] == MAIN_CLASS
    properties = (launcher.DISPATCH_PROPERTY, launcher.EMPTY_TABLE_WAIT_PROPERTY, launcher.LEADER_LOCK_PROPERTY)
    assert not any(name in part for name in properties for part in command)
    assert str(launcher.LAUNCHER_JAR) not in command[command.index("-cp") + 1]
    (warning,) = [w for w in daemon_warnings(cfg) if "launcher" in w]
    assert "once a second" in warning and "make install" in warning


@pytest.mark.protocol
@pytest.mark.timeout(180)
@pytest.mark.parametrize("millis", [120, 650])
def test_the_real_kcl_scheduler_takes_the_interval(millis: int, tmp_path: Path) -> None:
    """The daemon JVM as copier run starts it (its command line, under the supervisor), on a backend that is not
    there: the scheduler the launcher built reports the configured interval (the KCL's own getter), and the
    daemon still stops on SIGTERM with the stock shutdown hook."""
    props = local_properties(tmp_path / "c.properties", f"http://127.0.0.1:{free_port()}", "l", "s", "t", "copier")
    props.write_text(
        props.read_text()
        + "copier.daemonLogLevel = INFO\ncopier.jvmClassArchive = none\n"
        + f"copier.shardConsumerDispatchPollIntervalMillis = {millis}\n"
    )
    java = shutil.which("java")
    assert java, "Java 17 is on every machine make test runs on"
    command = daemon_command(load_config(props), str(props), {}, java)
    proc = subprocess.Popen(
        [sys.executable, "-m", "copier.kcl.supervisor", *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    wanted = f"copier: the KCL scheduler advances shard consumers every {millis} ms"
    # The runner thread starts only after the shutdown hook is registered: its first line says the hook is
    # there (a fixed sleep after the scheduler's line raced a slow machine).
    running = "[multi-lang-daemon-"
    seen: list[str] = []
    deadline = time.monotonic() + 90
    try:
        for line in proc.stderr:
            seen.append(line)
            if running in line or time.monotonic() > deadline:
                break
        assert any(wanted in line for line in seen), "".join(seen[-40:])
        assert running in seen[-1], "".join(seen[-40:])
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest[-2000:]
    assert "Process terminated, will initiate shutdown." in rest, "the stock shutdown hook ran"


@pytest.mark.protocol
@pytest.mark.timeout(300)
def test_a_new_application_syncs_its_shards_without_the_kcls_wait(endpoint: str, tmp_path: Path) -> None:
    """copier.emptyLeaseTableWaitMillis = 0 on a new application (no lease table): the real scheduler finds the
    table empty, creates the leases itself at once (the KCL's own code would first wait 1 to 30 s, "Lease table is
    still empty. Checking again in 3000 ms"), and every shard's events are forwarded."""
    pipeline = _pipeline(endpoint, tmp_path, "bootstrap", emptyLeaseTableWaitMillis="0")
    try:
        pipeline.create(staging_shards=2, target_shards=1)
        produced = produce(pipeline.kinesis, pipeline.staging, 40, run="bootstrap", seed=3)
        worker = pipeline.start_worker("a")
        assert pipeline.wait(lambda: pipeline.caught_up(produced.last), 180), f"not caught up; see {tmp_path}"
        log = worker.log_path.read_text()
    finally:
        pipeline.stop_all()
    assert "copier: on an empty lease table this worker waits at most 0 ms before it creates the leases" in log
    assert "copier: the lease table is empty; waiting 0 ms for another worker to create the leases" in log
    assert "is initiating the lease sync" in log, "this worker created the leases"
    assert "Lease table is still empty. Checking again" not in log, "the KCL's own wait did not run"


@pytest.mark.protocol
@pytest.mark.timeout(400)
def test_a_dead_leaders_shards_get_a_new_owner_long_before_the_kcls_two_minutes(endpoint: str, tmp_path: Path) -> None:
    """copier.leaderLockMillis = 6000: the leader's lock in the coordinator state table carries that lease (the
    KCL's own is 120000), and when the leader's host dies holding every lease, a worker under a new workerId
    becomes leader, is assigned the leases and forwards the shards' new events well within the 2 minutes the
    KCL's lock alone would keep the leases unassigned."""
    pipeline = _pipeline(endpoint, tmp_path, "leader", leaderLockMillis="6000")
    try:
        pipeline.create(staging_shards=2, target_shards=1)
        dead = _worker_caught_up(pipeline, tmp_path, "a", "leader-a", 4)
        lock = _dynamodb(endpoint).get_item(
            TableName="copier-leader-CoordinatorState", Key={"key": {"S": "Leader"}}, ConsistentRead=True
        )["Item"]
        assert lock["leaseDuration"]["S"] == "6000", lock
        dead.kill_host()  # it held the lock and every lease
        started = time.monotonic()
        heir = _worker_caught_up(pipeline, tmp_path, "b", "leader-b", 5)
        took = time.monotonic() - started
        log = heir.log_path.read_text()
    finally:
        pipeline.stop_all()
    assert "copier: the leader lock lasts 6000 ms" in log
    assert "is new leader" in log, "the new worker took the lock"
    assert took < 90, f"{took:.1f} s until the new worker forwarded: the KCL's 2-minute lock would explain that"


@pytest.mark.protocol
@pytest.mark.timeout(300)
def _owners(endpoint: str, table: str) -> list[str | None]:
    """The owner of each lease in ``table`` (None: no owner)."""
    items = _dynamodb(endpoint).scan(TableName=table, ConsistentRead=True)["Items"]
    return [item["leaseOwner"]["S"] if "leaseOwner" in item else None for item in items]


def _metrics_rows(endpoint: str, application: str) -> list[str]:
    """The workerIds with a row in the application's KCL 3.x WorkerMetricStats table."""
    items = _dynamodb(endpoint).scan(TableName=f"{application}-WorkerMetricStats", ConsistentRead=True)["Items"]
    return [item["wid"]["S"] for item in items]


def test_a_graceful_stop_hands_on_the_leases_of_a_run_only_workerid_and_keeps_those_of_a_hosts_own(
    endpoint: str, tmp_path: Path
) -> None:
    """SIGTERM of a worker with a workerId of its own (a host restarted in place renews its leases at once): its
    leases stay under its name. SIGTERM of a worker whose workerId is new each run (the KCL's default; no later run
    renews them): once every shard consumer has shut down, its WorkerMetricStats row is gone and none of its leases
    names it, so the leader assigns them to a live worker at its next pass instead of after failoverTimeMillis (the
    KCL alone leaves them under the stopped worker's name); the live worker then forwards every shard's new
    events."""
    pipeline = _pipeline(endpoint, tmp_path, "handoff")
    table = "copier-handoff"
    own = tmp_path / "own-id.properties"
    # the same settings with a workerId of its own (its processors read this file, as executableName says)
    text = pipeline.properties.read_text().replace(str(pipeline.properties), str(own))
    own.write_text(text + "workerId = host-own\n")
    try:
        pipeline.create(staging_shards=3, target_shards=1)
        produced = produce(pipeline.kinesis, pipeline.staging, 30, run="handoff-own", seed=6)
        keeper = pipeline.start_worker("keeper", own)
        assert pipeline.wait(lambda: not keeper.alive or pipeline.caught_up(produced.last), 240), tmp_path
        assert keeper.alive, keeper.log_path.read_text()[-2000:]
        assert keeper.stop(60) == 0
        kept = _owners(endpoint, table)
        keeper_log = keeper.log_path.read_text()

        leaving = _worker_caught_up(pipeline, tmp_path, "leaving", "handoff-leaving", 7)
        leaver = {owner for owner in _owners(endpoint, table) if owner}
        before = set(_metrics_rows(endpoint, "copier-handoff"))
        staying = pipeline.start_worker("staying")
        assert pipeline.wait(lambda: set(_metrics_rows(endpoint, "copier-handoff")) - before, 120), "no second worker"
        assert leaving.stop(60) == 0
        handed = _owners(endpoint, table)
        rows = _metrics_rows(endpoint, "copier-handoff")
        leaving_log = leaving.log_path.read_text()
        produced = produce(pipeline.kinesis, pipeline.staging, 30, run="handoff-after", seed=8)
        assert pipeline.wait(lambda: pipeline.caught_up(produced.last), 240), f"not caught up; see {tmp_path}"
        assert staying.proc.poll() is None
    finally:
        pipeline.stop_all()
    assert kept == ["host-own"] * 3, kept
    assert "copier: a graceful stop keeps this worker's leases for its restart under the same workerId" in keeper_log
    assert "at its graceful stop handed on" not in keeper_log
    assert len(leaver) == 1 and "host-own" not in leaver, leaver
    assert "copier: a graceful stop hands this worker's leases on (its workerId is new each run)" in leaving_log
    assert not leaver & set(handed), f"a lease still names the stopped worker: {handed}"
    assert not leaver & set(rows), f"the stopped worker's metrics row is still there: {rows}"
    # every lease the table still named it the owner of (the leader may have moved one already)
    handoff = r"copier: (\d) of the \1 leases this worker owned at its graceful stop handed on"
    assert re.search(handoff, leaving_log), leaving_log[-3000:]
