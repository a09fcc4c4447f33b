"""``copier run``: the KCL MultiLangDaemon command line, built from the properties file.

The daemon is Java; its jars come with amazon-kclpy (``copier.kcl.jars``), and
it runs under copier's launcher (``copier.kcl.launcher``: the stock daemon with
a shorter shard-consumer dispatch interval) when copier was built with it. The
JVM gets the system properties of ``copier.jvmArgs`` and of the environment
variable ``COPIER_JAVA_OPTS``, a class-data archive of the KCL's classes
(``copier.kcl.classarchive``), and a logback configuration that sends the
daemon's own log to stderr at ``copier.daemonLogLevel`` (WARN by default). ``copier run`` then replaces itself with
a small parent of the JVM (``copier.kcl.supervisor``, a fresh interpreter that imports nothing heavy), which
forwards a supervisor's SIGTERM to the daemon (with ``shutdownGraceMillis`` set, processors get
``shutdown_requested`` and checkpoint before the JVM exits) and exits non-zero, with one line saying why,
whenever the daemon ends without being asked to (the daemon itself exits 0 when it gives up).

The daemon runs in an environment of its own (:func:`daemon_env`), which the processors it spawns inherit:
``COPIER_PROPERTIES`` names the properties file, so that ``executableName = copier process`` needs no
``--properties`` (a file that named its own path had to be edited in every copy, and was refused until it was),
and ``PATH`` finds this installation's ``copier`` first, so that the daemon starts the processors of the copier
that runs it, wherever it is installed and whatever else ``PATH`` holds.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from copier.adapters.journal import say
from copier.adapters.summaryshare import SHARE_ENV
from copier.core.config import Config
from copier.core.errors import ConfigError
from copier.kcl.classarchive import archive_dir, archive_options
from copier.kcl.jars import MULTILANG_JAR_PREFIX, jar_dir, jars
from copier.kcl.launcher import (
    DISPATCH_PROPERTY,
    EMPTY_TABLE_WAIT_PROPERTY,
    HAND_ON_PROPERTY,
    LAUNCHER_CLASS,
    LEADER_LOCK_PROPERTY,
    launcher_jar,
)
from copier.kcl.supervisor import STACK_TRACES

__all__ = [
    "MAIN_CLASS",
    "PROPERTIES_ENV",
    "daemon_classpath",
    "daemon_command",
    "daemon_env",
    "daemon_warnings",
    "processor_which",
    "run_daemon",
]

MAIN_CLASS = "software.amazon.kinesis.multilang.MultiLangDaemon"
LOGBACK = Path(__file__).resolve().parent / "logback.xml"
PROPERTIES_ENV = "COPIER_PROPERTIES"  # the file copier run was given, for `copier process` without --properties


def _daemon_path(env: Mapping[str, str]) -> str:
    """``PATH`` for the daemon: the directory of this installation's ``copier`` first, when it is there."""
    here = Path(sys.executable).parent
    path = env.get("PATH", os.defpath)
    return os.pathsep.join([str(here), path]) if (here / "copier").is_file() else path


def daemon_env(properties: str, env: Mapping[str, str]) -> dict[str, str]:
    """The environment the daemon runs in and its processors inherit (see the module docstring)."""
    return {**env, PROPERTIES_ENV: str(Path(properties).resolve()), "PATH": _daemon_path(env)}


def processor_which(env: Mapping[str, str]) -> Callable[[str], str | None]:
    """``which`` as the daemon will search for executableName's program (with :func:`daemon_env`'s PATH)."""
    path = _daemon_path(env)
    return lambda program: shutil.which(program, path=path)


def daemon_classpath() -> list[Path]:
    """The daemon JVM's classpath: the KCL jars, then copier's launcher when it was built."""
    launcher = launcher_jar()
    return [*jars(), *([launcher] if launcher else [])]


def daemon_command(config: Config, properties: str, env: Mapping[str, str], java: str = "java") -> list[str]:
    """The java command line that runs the daemon on ``properties``; checks what would fail later."""
    if not config.executable_name:
        raise ConfigError(config.path, "executableName", "required key is missing (the processor the daemon spawns)")
    classpath = daemon_classpath()
    if not any(p.name.startswith(MULTILANG_JAR_PREFIX) for p in classpath):
        raise ConfigError(config.path, "-", f"the KCL jars are missing from {jar_dir()}: run `make install`")
    launcher = launcher_jar() is not None
    archive = archive_options(java, classpath, archive_dir(config.jvm_class_archive, env), os.getpid())
    options = [
        f"-Dcopier.daemonLogLevel={config.daemon_log_level}",  # logback.xml's root level
        *archive,  # the KCL's classes mapped, not loaded (copier.kcl.classarchive)
        *config.jvm_args,
        *shlex.split(env.get("COPIER_JAVA_OPTS", "")),
        # The daemon writes each record's partition key to its processors in the JVM's default charset:
        # ASCII on Java 17 under a C or unset locale, every other character a "?" (measured), so two keys
        # became one. UTF-8 whatever the host's locale (what copier process reads); after the operator's
        # options, so none of them can take it back (the JVM keeps the last -D of a name).
        "-Dfile.encoding=UTF-8",
        # last, so that the validated keys are what the launcher reads (the JVM keeps the last -D of a name)
        *(
            [
                f"-D{DISPATCH_PROPERTY}={config.dispatch_millis}",
                f"-D{EMPTY_TABLE_WAIT_PROPERTY}={config.empty_table_wait_millis}",
                f"-D{LEADER_LOCK_PROPERTY}={config.leader_lock_millis}",
                # no workerId: the next run is another worker, so the leases go to the live ones at once
                f"-D{HAND_ON_PROPERTY}={'false' if config.worker_id else 'true'}",
            ]
            if launcher
            else []
        ),
    ]
    return [
        java,
        *options,
        "-cp",
        os.pathsep.join(str(p) for p in classpath),
        LAUNCHER_CLASS if launcher else MAIN_CLASS,
        "--properties-file",
        str(Path(properties).resolve()),
        "--log-configuration",
        str(LOGBACK),
    ]


def daemon_warnings(config: Config) -> list[str]:
    """Daemon settings that work but that production should not run with, each with what to set instead."""
    warnings = []
    if config.shutdown_grace_millis <= 0:
        warnings.append(
            f"{config.path}: shutdownGraceMillis is 0, so SIGTERM gives processors no shutdown_requested "
            "and no final checkpoint; set it (and keep systemd's TimeoutStopSec above it)"
        )
    if config.graceful_handoff:
        warnings.append(
            f"{config.path}: isGracefulLeaseHandoffEnabled is true (the KCL 3.x default): KCL 3.1.3 can leave "
            "a lease stuck in a handoff that never completes, and its shard is then never processed "
            "(docs/protocol.md, 'Lease moves'); set isGracefulLeaseHandoffEnabled = false"
        )
    if launcher_jar() is None:
        warnings.append(
            "copier was installed without its KCL launcher (copier/kcl/copier-kcl-launcher.jar, built by "
            "`make install` and in the release bundle): the stock daemon advances shard consumers once a second, "
            "a new application's workers wait up to 30 s on the empty lease table, and a dead leader's shards wait "
            "2 minutes for a new owner, so starts and stops pause shards longer and "
            f"{config.path}'s copier.shardConsumerDispatchPollIntervalMillis, copier.emptyLeaseTableWaitMillis "
            "and copier.leaderLockMillis are not applied"
        )
    return warnings


def run_daemon(config: Config, properties: str, share: Path | None = None) -> int:
    """Exec the supervisor of the daemon (never returns on success), with the run's DescribeStreamSummary
    ``share`` (``copier.adapters.summaryshare``) for it to adopt; None: it makes one."""
    java = shutil.which("java")
    if java is None:
        say("java is not on PATH: the KCL MultiLangDaemon needs Java 17 or later", "error")
        return 3
    for warning in daemon_warnings(config):
        say(f"warning: {warning}", "warning")
    command = daemon_command(config, properties, os.environ, java)
    sys.stderr.flush()
    python = sys.executable
    traces = [STACK_TRACES] if config.daemon_log_level in ("INFO", "DEBUG") else []  # the daemon's detail asked for
    env = {k: v for k, v in daemon_env(properties, os.environ).items() if k != SHARE_ENV}
    if share is not None:
        env[SHARE_ENV] = str(share)
    os.execve(python, [python, "-m", "copier.kcl.supervisor", *traces, *command], env)
    return 0  # pragma: no cover - exec does not return
