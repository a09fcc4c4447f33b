"""The daemon JVM's class-data archive: written by a first run, mapped by the next, never half a file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from copier.core.config import parse_config
from copier.core.errors import ConfigError
from copier.kcl.classarchive import KEEP, PENDING_SUFFIX, archive_dir, archive_options, archive_path, publish
from copier.kcl.daemon import LOGBACK, daemon_classpath
from copier.kcl.jars import jars
from copier.kcl.launcher import LAUNCHER_CLASS
from copier.local.pipeline import local_properties
from tests.support.backend import free_port
from tests.test_config import BASE

JAVA = "/usr/bin/java"  # a path: only its name and status go into the archive's name


def test_the_archive_lives_in_systemds_cache_directory_else_the_users_cache() -> None:
    """auto: $CACHE_DIRECTORY (systemd's CacheDirectory=), then $XDG_CACHE_HOME, then ~/.cache; none: no archive."""
    assert archive_dir("auto", {"CACHE_DIRECTORY": "/var/cache/copier:/x", "HOME": "/h"}) == Path("/var/cache/copier")
    assert archive_dir("auto", {"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/copier")
    assert archive_dir("auto", {"HOME": "/h"}) == Path("/h/.cache/copier")
    assert archive_dir("auto", {}) is None
    assert archive_dir("none", {"HOME": "/h"}) is None
    assert archive_dir("/srv/jsa", {"HOME": "/h"}) == Path("/srv/jsa")


def test_the_setting_is_auto_none_or_an_absolute_directory() -> None:
    base = BASE
    assert parse_config(base).jvm_class_archive == "auto"
    assert parse_config(base + "copier.jvmClassArchive = /var/lib/x\n").jvm_class_archive == "/var/lib/x"
    with pytest.raises(ConfigError) as info:
        parse_config(base + "copier.jvmClassArchive = relative/dir\n")
    assert info.value.key == "copier.jvmClassArchive"


def test_a_first_run_writes_the_archive_under_a_name_of_its_own_and_later_runs_map_it(tmp_path: Path) -> None:
    """No archive: the JVM writes one at exit (pending, per process); once in place, it is mapped."""
    classpath = jars()
    first = archive_options(JAVA, classpath, tmp_path / "cache", 4242)
    assert first[0].startswith("-XX:ArchiveClassesAtExit=") and first[0].endswith(f".4242{PENDING_SUFFIX}")
    assert (tmp_path / "cache").is_dir()
    final = Path(first[0].split("=", 1)[1][: -len(f".4242{PENDING_SUFFIX}")])
    final.write_bytes(b"x")
    assert archive_options(JAVA, classpath, tmp_path / "cache", 4243)[0] == f"-XX:SharedArchiveFile={final}"


def test_a_pending_archive_of_a_supervisor_that_is_gone_is_removed(tmp_path: Path) -> None:
    """A host killed while its JVM wrote the archive leaves a partial file: the next first run removes it,
    and leaves a live supervisor's alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f"kcl-0123.jsa.{gone.pid}{PENDING_SUFFIX}"
    live = tmp_path / f"kcl-0123.jsa.{os.getpid()}{PENDING_SUFFIX}"
    orphan.write_bytes(b"half")
    live.write_bytes(b"being written")
    archive_options(JAVA, [tmp_path / "a.jar"], tmp_path, 1)
    assert not orphan.exists() and live.exists()


def test_another_jar_or_java_gets_another_archive(tmp_path: Path) -> None:
    """The name covers the java binary and every jar (path, size, mtime): an upgrade never maps a stale archive."""
    jar = tmp_path / "a.jar"
    jar.write_bytes(b"1")
    before = archive_options(JAVA, [jar], tmp_path, 1)[0]
    jar.write_bytes(b"22")
    assert archive_options(JAVA, [jar], tmp_path, 1)[0] != before


def test_a_cache_that_cannot_be_written_means_no_archive(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert archive_options(JAVA, jars(), blocker / "cache", 1) == []
    assert archive_options(JAVA, jars(), None, 1) == []


def test_only_the_archive_of_a_jvm_stopped_on_request_is_put_in_place(tmp_path: Path) -> None:
    """A killed JVM's file may be half written, and one that ended on its own may hold few classes."""
    pending = tmp_path / f"kcl-1.jsa.7{PENDING_SUFFIX}"
    command = ["java", f"-XX:ArchiveClassesAtExit={pending}", "Main"]
    pending.write_bytes(b"half")
    publish(command, keep=False)
    assert not pending.exists() and not (tmp_path / "kcl-1.jsa").exists()
    pending.write_bytes(b"whole")
    publish(command, keep=True)
    assert not pending.exists() and (tmp_path / "kcl-1.jsa").read_bytes() == b"whole"


def test_a_cache_keeps_the_archives_of_a_few_installations_not_one_for_every_checkout(tmp_path: Path) -> None:
    """Each installation (its own jars) has its own archive: a new one's first start removes all but the KEEP
    most recently used others, and an archive mapped by a start counts as used then (issue 45: every checkout
    left one in ~/.cache/copier, for ever)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    archives = []
    for n in range(KEEP + 2):  # installations, each with its archive, the first one used longest ago
        jar = tmp_path / f"install-{n}.jar"
        jar.write_bytes(b"x" * (n + 1))
        final = archive_path(JAVA, [jar], cache)
        final.write_bytes(b"archive")
        os.utime(final, ns=(n * 10**9, n * 10**9))
        archives.append((jar, final))
    oldest_jar, oldest = archives[0]
    assert archive_options(JAVA, [oldest_jar], cache, 1)[0] == f"-XX:SharedArchiveFile={oldest}"  # mapped: used now

    newcomer = tmp_path / "install-new.jar"
    newcomer.write_bytes(b"new")
    assert archive_options(JAVA, [newcomer], cache, 1)[0].startswith("-XX:ArchiveClassesAtExit=")
    kept = sorted(p.name for p in cache.glob("kcl-*.jsa"))
    assert len(kept) == KEEP, kept
    assert oldest.exists(), "the archive a start just mapped is kept"
    assert not archives[1][1].exists(), "the least recently used goes"


@pytest.mark.protocol
@pytest.mark.timeout(300)
def test_the_supervised_jvm_writes_an_archive_that_the_next_jvm_maps(tmp_path: Path) -> None:
    """The real daemon under ``copier.kcl.supervisor``, stopped with SIGTERM while it tries to reach a backend
    that is not there: the supervisor publishes what the JVM wrote at exit, and a JVM that must map that
    archive (-Xshare:on fails the start if it cannot) starts. A daemon that ends on its own leaves none."""
    classpath = daemon_classpath()  # the KCL's jars and copier's launcher, as copier run starts the daemon
    java = shutil.which("java")
    assert java, "Java 17 is on every machine make test runs on"
    cp = ["-cp", os.pathsep.join(str(p) for p in classpath), LAUNCHER_CLASS]
    props = local_properties(tmp_path / "c.properties", f"http://127.0.0.1:{free_port()}", "jsa", "s", "t", "copier")
    cache = tmp_path / "cache"
    supervisor = [sys.executable, "-m", "copier.kcl.supervisor"]

    alone = subprocess.run([*supervisor, java, *archive_options(java, classpath, cache, 1), *cp], capture_output=True)
    assert alone.returncode != 0 and not list(cache.iterdir()), "ended on its own (no properties file): nothing kept"

    options = archive_options(java, classpath, cache, 2)
    logs = ["--log-configuration", str(LOGBACK)]  # the daemon's log on stderr (WARN), as copier run has it
    daemon = [java, "-Dcopier.daemonLogLevel=WARN", *options, *cp, "--properties-file", str(props), *logs]
    proc = subprocess.Popen([*supervisor, *daemon], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # Until the daemon has loaded its classes and failed to reach the backend once (its scheduler's first
    # attempt), however long that takes: a fixed 8 s raced a loaded machine (9 s there, measured).
    assert proc.stderr is not None
    seen = b""
    deadline = time.monotonic() + 120
    for line in proc.stderr:
        seen += line
        if b"Caught exception when initializing LeaseCoordinator" in line or time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    err = seen + rest
    assert b"Caught exception when initializing LeaseCoordinator" in seen, err.decode()[-2000:]
    assert proc.returncode == 0, err.decode()[-2000:]
    archives = list(cache.glob("kcl-*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 10_000_000, list(cache.iterdir())
    assert not list(cache.glob(f"*{PENDING_SUFFIX}"))
    mapped = archive_options(java, classpath, cache, 3)
    assert mapped[0] == f"-XX:SharedArchiveFile={archives[0]}"
    run = subprocess.run([java, "-Xshare:on", *mapped, *cp], capture_output=True, text=True, timeout=120)
    assert "Properties file missing" in run.stderr, run.stdout + run.stderr
    assert "shared archive" not in (run.stdout + run.stderr).lower()
