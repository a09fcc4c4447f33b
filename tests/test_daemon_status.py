"""`copier run` builds the daemon's command line; `copier status` renders the state table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from copier.commands.statustable import render, rows
from copier.core.errors import ConfigError
from copier.core.health import KclLease, Thresholds, Waiting, judge
from copier.core.positions import Position
from copier.core.state import ShardState
from copier.kcl.daemon import daemon_command
from copier.kcl.jars import jars
from copier.kcl.launcher import DISPATCH_PROPERTY, EMPTY_TABLE_WAIT_PROPERTY, LAUNCHER_CLASS, LAUNCHER_JAR
from tests.support.fakes import config


def test_the_daemon_command_has_the_kcl_classpath_jvm_options_and_the_file(tmp_path: Path) -> None:
    """java, copier's own options, copier.jvmArgs then COPIER_JAVA_OPTS, the charset the daemon writes to its
    processors in, every KCL jar and copier's launcher, its main class and the properties file."""
    cfg = replace(config(), executable_name="copier process", jvm_args=("-Daws.cborEnabled=false",))
    command = daemon_command(cfg, str(tmp_path / "p.properties"), {"COPIER_JAVA_OPTS": "-Xmx512m -Dx=y"}, "java")
    assert command[:2] == ["java", "-Dcopier.daemonLogLevel=WARN"]
    assert command[2:8] == [
        "-Daws.cborEnabled=false",
        "-Xmx512m",
        "-Dx=y",
        "-Dfile.encoding=UTF-8",
        f"-D{DISPATCH_PROPERTY}=200",
        f"-D{EMPTY_TABLE_WAIT_PROPERTY}=3000",
    ]
    classpath = command[command.index("-cp") + 1].split(":")
    assert classpath == [*(str(p) for p in jars()), str(LAUNCHER_JAR)] and len(classpath) > 50
    assert command[command.index(LAUNCHER_CLASS) + 1 :][:2] == ["--properties-file", str(tmp_path / "p.properties")]
    assert Path(command[-1]).name == "logback.xml" and Path(command[-1]).is_file()


def test_the_sdks_ping_timing_is_not_a_warning_of_a_healthy_start() -> None:
    """The SDK's HTTP/2 keep-alive ping logs "Flushing PING frame took 113ms" at WARN on a loaded host: a healthy
    start must be quiet at warning level (issue 45, item 6), so the daemon's logback keeps only its errors."""
    import xml.etree.ElementTree as ET

    from copier.kcl import daemon

    logback = ET.parse(Path(daemon.__file__).with_name("logback.xml")).getroot()
    levels = {e.get("name"): e.get("level") for e in logback.iter("logger")}
    assert levels["software.amazon.awssdk.http.nio.netty.internal.http2.Http2PingHandler"] == "ERROR"


def test_the_daemon_writes_to_its_processors_in_utf8_whatever_the_hosts_locale() -> None:
    """The daemon writes each record's partition key to its processor in the JVM's default charset: on Java 17
    under a C or unset locale that is ASCII, and every other character became "?" (measured: "é" and an emoji
    both), so two keys became one, and two events one under dedupKey = partitionKey. The JVM copier run starts
    writes UTF-8 whatever LANG says."""
    java = shutil.which("java")
    assert java, "Java 17 is on every machine make test runs on"
    cfg = replace(config(jvmClassArchive="none"), executable_name="copier process")
    command = daemon_command(cfg, "p.properties", {"COPIER_JAVA_OPTS": "-Dfile.encoding=ISO-8859-1"}, java)
    options = command[1 : command.index("-cp")]
    shown = subprocess.run(
        [java, *options, "-XshowSettings:properties", "-version"],
        env={"PATH": os.environ["PATH"], "LANG": "C"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert "file.encoding = UTF-8" in shown.stderr


def test_a_file_without_executable_name_is_rejected() -> None:
    """The daemon would start and spawn nothing: say so before starting it."""
    with pytest.raises(ConfigError) as info:
        daemon_command(config(), "p.properties", {}, "java")
    assert info.value.key == "executableName"


def test_status_lists_every_shard_with_owner_lag_and_counters() -> None:
    """A shard with state shows its owner, lease, position, counters and window; one without shows dashes."""
    now = 1_700_000_000_000
    state = ShardState(
        epoch=3,
        owner="host:1:abc",
        lease_until_ms=now + 2500,
        position=Position(42, 1),
        redo_last=Position(50),
        redo_digests=(1, 2),
        counters={"forwarded": 10, "duplicates": 2, "replays": 1},
        behind_ms=1500,
        updated_ms=now - 1000,
        window_ids=3_600_000,
        window_oldest_ms=now - 3_600_000,
        window_newest_ms=now,
    )
    shards = [
        {"ShardId": "shardId-0", "SequenceNumberRange": {"StartingSequenceNumber": "1"}},
        {"ShardId": "shardId-1", "SequenceNumberRange": {"StartingSequenceNumber": "1", "EndingSequenceNumber": "9"}},
    ]
    table = rows(shards, {"shardId-0": state}, now)
    assert [(r.shard, r.shard_state, r.owner, r.epoch) for r in table] == [
        ("shardId-0", "open", "host:1:abc", 3),
        ("shardId-1", "closed", "-", 0),
    ]
    first = table[0]
    assert (first.lease, first.position, first.behind, first.in_flight) == ("valid 2.5s", "42/1", "-", "redo 2")
    assert first.behind_at_commit_ms == 1500, "the daemon's figure at the last commit, in --json"
    assert first.window == "3600000 IDs since 2023-11-14T21:13:20Z (1h00m)"
    text = render(table)
    assert text.splitlines()[0].split()[:4] == ["shard", "state", "worker", "owner"]
    assert text.splitlines()[-1] == "2 shards; forwarded 10, duplicates dropped 2, replays dropped 1"


def test_status_shows_a_window_whose_arrivals_no_date_holds() -> None:
    """Arrivals are what the daemon passes on, a Java long: a window reaching the largest long printed as a
    date raised, and copier status failed for every shard. It shows the number."""
    state = ShardState(epoch=1, owner="o", window_ids=1, window_oldest_ms=2**63 - 1, window_newest_ms=2**63 - 1)
    (row,) = rows([{"ShardId": "shardId-0", "SequenceNumberRange": {}}], {"shardId-0": state}, 1_700_000_000_000)
    assert row.window == f"1 IDs since {2**63 - 1} ms (0m00s)"


def test_status_shows_a_batch_a_gone_owner_left_in_flight_and_a_cut_window() -> None:
    """A dead owner's unverified batch and a window the count cap keeps short are both visible."""
    now = 1_700_000_000_000
    gone = ShardState(
        epoch=2,
        owner="h:2:x",
        lease_until_ms=now - 1,
        window_ids=5,
        window_oldest_ms=now - 60_000,
        window_newest_ms=now,
        window_cut=True,
    )
    shards = [{"ShardId": "shardId-0", "SequenceNumberRange": {"StartingSequenceNumber": "1"}}]
    (row,) = rows(shards, {"shardId-0": gone}, now, unverified={"shardId-0"})
    assert row.in_flight == "unverified batch" and row.window.endswith("(1m00s, cut short)")
    assert '"window_cut": true' in render([row], as_json=True)


def test_status_shows_the_owners_measured_clock_bound_and_a_suspect_redo_set() -> None:
    """The owner's clock bound against AWS time is a column (unmeasured: a dash); a redo set whose verification
    could not see everything says its resends may be duplicates."""
    now = 1_700_000_000_000
    measured_owner = ShardState(
        epoch=1,
        owner="h:1:a",
        lease_until_ms=now + 1,
        clock_bound_ms=12,
        redo_last=Position(9),
        redo_digests=(1,),
        redo_suspect=True,
    )
    shards = [{"ShardId": f"shardId-{i}", "SequenceNumberRange": {"StartingSequenceNumber": "1"}} for i in (0, 1)]
    first, second = rows(shards, {"shardId-0": measured_owner, "shardId-1": ShardState(epoch=1)}, now)
    assert (first.clock, second.clock) == ("±12 ms", "-")
    assert first.in_flight == "redo 1 (possible duplicates)"
    assert render([first]).splitlines()[0].split()[-1] == "clock"


def test_behind_is_what_staging_holds_after_the_position_whoever_owns_the_shard() -> None:
    """Seen: `behind 0.0s (28.8s ago)` for a shard whose worker was gone while events waited, then `unknown: no
    owner` beside a live owner of an idle shard (its copier lease ran out, as an idle shard's does). The column
    is now read from staging: the oldest record not forwarded has waited 28.8 s; an idle shard of a live worker
    is 0 behind, with a live worker and no problem."""
    now = 1_700_000_000_000
    shards = [{"ShardId": "s-0", "SequenceNumberRange": {"StartingSequenceNumber": "1"}}]
    gone = ShardState(epoch=2, owner="host:9:dead", lease_until_ms=now - 20_000, behind_ms=0, updated_ms=now - 28_800)
    reports = {"w-dead": now - 600_000, "w-live": now - 1_000}
    limits = Thresholds(max_unowned_ms=10_000)
    stuck = judge(True, gone, KclLease("w-dead"), reports, Waiting(now - 28_800, 0), now, 61_000, limits)
    (row,) = rows(shards, {"s-0": gone}, now, health={"s-0": stuck})
    assert (row.behind, row.lag_ms, row.worker, row.lease) == (
        "28.8s",
        28_800,
        "w-dead dead (10m00s)",
        "expired 20.0s ago",
    )
    assert row.problems == (
        "no live owner for at least 20.0s: its KCL lease is held by w-dead, which last reported 10m00s ago (dead)",
    )
    idle = ShardState(epoch=2, owner="host:9:live", lease_until_ms=now - 3_600_000, updated_ms=now - 3_600_000)
    fine = judge(True, idle, KclLease("w-live"), reports, Waiting(), now, 61_000, limits)
    (row,) = rows(shards, {"s-0": idle}, now, health={"s-0": fine})
    assert (row.behind, row.worker, row.problems) == ("0", "w-live alive", ())


def test_status_shows_the_replication_checkpoint_of_each_shard() -> None:
    """Beside the committed position: when its record arrived in staging and how long after that its chunk had
    landed in the target (AWS time), in the table and in --json; a shard an earlier copier committed shows
    dashes (and nulls)."""
    now = 1_700_000_000_000
    state = ShardState(
        epoch=1,
        owner="h:1:a",
        lease_until_ms=now + 1000,
        position=Position(42, 0),
        position_arrival_ms=now - 2_345,
        position_age_ms=1_250,
    )
    shards = [{"ShardId": f"shardId-{i}", "SequenceNumberRange": {"StartingSequenceNumber": "1"}} for i in (0, 1)]
    first, earlier = rows(shards, {"shardId-0": state, "shardId-1": ShardState(epoch=1, position=Position(7))}, now)
    assert (first.position, first.arrived, first.age_at_landing) == ("42/0", "2023-11-14T22:13:17.655Z", "1.2s")
    assert (earlier.arrived, earlier.age_at_landing) == ("-", "-")
    header = render([first]).splitlines()[0]
    assert header.index("committed position") < header.index("arrived") < header.index("age at landing")
    as_json = [json.loads(line) for line in render([first, earlier], as_json=True).splitlines()]
    assert [(j["position"], j["position_arrival_ms"], j["position_age_ms"]) for j in as_json] == [
        ("42/0", now - 2_345, 1_250),
        ("7/0", None, None),
    ]


def test_status_shows_each_shard_against_the_applications_start() -> None:
    """An application started at a point in time: a shard not yet past its pre-start load says so (nothing is
    forwarded meanwhile), one past it how many records it left out as before the start, one that planned records
    before the start was set that it has no load; in --json too. Without a start: a dash."""
    now, start = 1_700_000_000_000, 1_699_990_000_000
    shards = [{"ShardId": f"shardId-{i}", "SequenceNumberRange": {"StartingSequenceNumber": "1"}} for i in range(5)]
    states = {
        "shardId-1": ShardState(epoch=1, owner="h:1:a", lease_until_ms=now + 1000),  # taken, still loading
        "shardId-2": ShardState(epoch=1, position=Position(9), prestart_ms=start, counters={"before_start": 7}),
        "shardId-3": ShardState(epoch=1, position=Position(9), counters={"before_start": 2}),
        "shardId-4": ShardState(epoch=1, position=Position(9), prestart_ms=start - 1000),
    }
    table = rows(shards, states, now, start_ms=start)
    assert [(r.start, r.before_start) for r in table] == [
        ("pre-start load", 0),
        ("pre-start load", 0),
        ("7 before start left out", 7),
        ("no pre-start load; 2 before start left out", 2),
        ("loaded for a start at 2023-11-14T19:26:39.000Z; 0 before start left out", 0),
    ]
    header = render(table).splitlines()[0]
    assert header.index("in flight") < header.index("start") < header.index("window")
    as_json = [json.loads(line) for line in render(table, as_json=True).splitlines()]
    assert [(j["start"], j["before_start"]) for j in as_json][1:3] == [
        ("pre-start load", 0),
        ("7 before start left out", 7),
    ]
    assert {r.start for r in rows(shards, states, now)} == {"-"}
