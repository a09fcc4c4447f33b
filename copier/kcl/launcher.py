"""copier's launcher of the KCL MultiLangDaemon: the stock daemon with three waits of the KCL made shorter.

The MultiLangDaemon's properties cannot set either:

- The KCL's scheduler moves each shard consumer one state per pass, and
  passes come every ``shardConsumerDispatchPollIntervalMillis`` (1 s in KCL
  3.1.3). A start and a graceful stop each wait out several passes per
  shard: at 1 s, most of a rolling deploy's pause. The system property
  ``copier.shardConsumerDispatchPollIntervalMillis`` (the properties key of
  the same name, 200 ms by default) sets it.
- On an empty lease table (a new application) every worker waits a random
  1 to 30 s for another to create the leases before it lists the shards
  itself: most of a new pipeline's time to its first event.
  ``copier.emptyLeaseTableWaitMillis`` (3000 ms by default) bounds that
  wait (``CopierScheduler.java``).
- In KCL 3.x one worker, the leader, assigns the leases, elected with a
  DynamoDB lock that KCL 3.1.3 holds for a fixed 2 minutes: when the
  leader's host dies, its shards wait that long for a new owner.
  ``copier.leaderLockMillis`` (10000 ms by default) sets the lock's lease
  (``CopierLeaderDecider.java``).

``copier/kcl/java`` holds a subclass of the daemon and of the scheduler
and a factory of the leader decider that apply them and change nothing else.

It is compiled where copier is built (``make install`` and the release
bundle, against the jars amazon-kclpy installed) into
``copier/kcl/copier-kcl-launcher.jar``, shipped in the wheel: hosts need a
Java runtime, not a compiler. Without the jar (copier installed some other
way) ``copier run`` runs the stock daemon and warns that every start and stop
is slower.

    python -m copier.kcl.launcher --build    # compile the jar (make install does)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from copier.core.errors import CopierError
from copier.kcl.jars import jars

__all__ = [
    "DISPATCH_PROPERTY",
    "EMPTY_TABLE_WAIT_PROPERTY",
    "LAUNCHER_CLASS",
    "LAUNCHER_JAR",
    "HAND_ON_PROPERTY",
    "LEADER_LOCK_PROPERTY",
    "LauncherBuildError",
    "build",
    "jar_digest",
    "launcher_jar",
    "sources_digest",
]

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "java"
LAUNCHER_JAR = HERE / "copier-kcl-launcher.jar"
LAUNCHER_CLASS = "software.amazon.kinesis.multilang.CopierMultiLangDaemon"
DISPATCH_PROPERTY = "copier.shardConsumerDispatchPollIntervalMillis"
EMPTY_TABLE_WAIT_PROPERTY = "copier.emptyLeaseTableWaitMillis"
LEADER_LOCK_PROPERTY = "copier.leaderLockMillis"
HAND_ON_PROPERTY = "copier.handOnLeases"  # true: the workerId is new each run, so a graceful stop hands its leases on
JAVA_RELEASE = "17"  # the oldest Java the hosts run (scripts/install.sh)
DIGEST_ENTRY = "META-INF/copier-launcher-sources"  # sources_digest() of what the jar was compiled from
_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same sources give the same jar


class LauncherBuildError(CopierError):
    """The launcher could not be compiled; the message says why (no javac, no KCL jars, a compile error)."""


def sources_digest(sources: Path | None = None) -> str:
    """What the jar must have been built from: every Java source under ``sources``, by path and content."""
    root = sources or SOURCES
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.java")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def jar_digest(jar: zipfile.ZipFile) -> str | None:
    """The sources digest a launcher jar was built from (None: not one of ours)."""
    try:
        return jar.read(DIGEST_ENTRY).decode().strip()
    except KeyError:
        return None


def launcher_jar() -> Path | None:
    """The compiled launcher, or None when copier was installed without it."""
    return LAUNCHER_JAR if LAUNCHER_JAR.is_file() else None


def build(out: Path = LAUNCHER_JAR, javac: str | None = None) -> Path:
    """Compile the sources in ``copier/kcl/java`` against the KCL jars into ``out``."""
    javac = javac or shutil.which("javac")
    if javac is None:
        raise LauncherBuildError("javac is not on PATH: building copier needs a JDK 17 or later (hosts need a JRE)")
    classpath = jars()
    if not classpath:
        raise LauncherBuildError("the KCL jars are missing: install amazon-kclpy first (python -m copier.kcl.jars)")
    sources = sorted(SOURCES.rglob("*.java"))
    with tempfile.TemporaryDirectory(prefix="copier-launcher-") as scratch:
        classes = Path(scratch)
        try:
            result = subprocess.run(
                [javac, "--release", JAVA_RELEASE, "-nowarn", "-encoding", "UTF-8", "-d", str(classes)]
                + ["-cp", os.pathsep.join(str(p) for p in classpath), *map(str, sources)],
                capture_output=True,
                text=True,
            )
        except OSError as e:
            raise LauncherBuildError(f"cannot run {javac}: {e}") from e
        if result.returncode != 0:
            raise LauncherBuildError(f"javac failed on {SOURCES}:\n{result.stderr.strip()}")
        pending = out.with_name(out.name + ".tmp")
        with zipfile.ZipFile(pending, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr(zipfile.ZipInfo("META-INF/MANIFEST.MF", _EPOCH), "Manifest-Version: 1.0\r\n\r\n")
            jar.writestr(zipfile.ZipInfo(DIGEST_ENTRY, _EPOCH), sources_digest() + "\n")
            for path in sorted(classes.rglob("*.class")):
                jar.writestr(zipfile.ZipInfo(path.relative_to(classes).as_posix(), _EPOCH), path.read_bytes())
        pending.replace(out)
    return out


def main(argv: list[str]) -> int:
    if argv != ["--build"]:
        sys.stderr.write("usage: python -m copier.kcl.launcher --build\n")
        return 2
    try:
        built = build()
    except LauncherBuildError as e:
        sys.stderr.write(f"copier: {e}\n")
        return 1
    sys.stderr.write(f"KCL launcher: {built}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
