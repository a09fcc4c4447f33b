"""The daemon JVM's class-data archive: a restarted host's JVM maps the KCL's classes instead of loading them.

The MultiLangDaemon loads the classes of the KCL, the AWS SDK and Netty
before it takes a lease; on 2 cores that is over a second of every start.
JDK 17's dynamic CDS archive holds them ready to map: the first ``copier
run`` on a host has the JVM write one when it exits
(``-XX:ArchiveClassesAtExit``), and every later run maps it
(``-XX:SharedArchiveFile``). Measured on the local backend with 8 shards and
a stable workerId, alternating runs with and without it: KCL initialization
3.4-3.5 s -> 2.2-2.6 s, a restart to every shard's first event 10.0-10.1 s
-> 8.2-9.0 s (docs/benchmarks.md, section 6, has the bench's figures).

Safe by construction: the JVM checks an archive against its own build and
the classpath and ignores one that does not match (``-Xshare:auto``, the
default); the archive is named after the java binary and every jar (path,
size, mtime), so an upgrade writes a new one; it is written under a name of
its own and renamed into place by the supervisor only after a JVM that was
asked to stop exited (a killed JVM may leave half a file, and one that ended
on its own, say unable to reach AWS, may have loaded few of the classes: both
are removed, and the next start writes one again). Its CDS
log (a few hundred warnings about classes it cannot archive) is off.
``copier.jvmClassArchive``: ``auto`` (systemd's ``$CACHE_DIRECTORY``, else
``$XDG_CACHE_HOME/copier`` or ``~/.cache/copier``), a directory, or ``none``.

Bounded: an archive holds the KCL's classes (tens of megabytes), and every
installation (each checkout with its own virtualenv, each upgrade) has its
own, since the JVM maps an archive only for the classpath it was written
with. A start that maps one marks it used; a start that writes a new one
first removes all but the :data:`KEEP` most recently used others, so one
cache directory holds at most ``KEEP + 1`` (a removed archive still mapped
by a running JVM stays readable to it; its installation's next start writes
one again).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["KEEP", "PENDING_SUFFIX", "archive_dir", "archive_options", "archive_path", "publish"]

PENDING_SUFFIX = ".pending"
KEEP = 2  # archives of other installations kept beside a new one, the most recently used
QUIET = "-Xlog:cds*=off"  # the dump lists every class it skips, at warning, on the JVM's stdout


def archive_dir(setting: str, env: Mapping[str, str]) -> Path | None:
    """Where archives live for ``copier.jvmClassArchive`` = ``setting`` (None: no archive)."""
    if setting == "none":
        return None
    if setting != "auto":
        return Path(setting)
    if env.get("CACHE_DIRECTORY"):  # systemd's CacheDirectory= (the first, if it names several)
        return Path(env["CACHE_DIRECTORY"].split(":")[0])
    base = env.get("XDG_CACHE_HOME") or (str(Path(env["HOME"]) / ".cache") if env.get("HOME") else "")
    return Path(base) / "copier" if base else None


def archive_path(java: str, classpath: Sequence[Path], directory: Path) -> Path:
    """The archive for this java binary and these jars (it may not exist yet)."""
    digest = hashlib.sha256()
    for path in (Path(java).resolve(), *classpath):
        try:
            status = path.stat()
        except OSError:
            status = None
        digest.update(f"{path}\0{status and status.st_size}\0{status and status.st_mtime_ns}\n".encode())
    return directory / f"kcl-{digest.hexdigest()[:16]}.jsa"


def archive_options(java: str, classpath: Sequence[Path], directory: Path | None, pid: int) -> list[str]:
    """The JVM options that map the archive, or that write it at exit when there is none yet ([] if the
    directory cannot be written: the JVM then starts as it would without)."""
    if directory is None:
        return []
    archive = archive_path(java, classpath, directory)
    if archive.is_file():
        try:
            os.utime(archive)  # used now: the last a new archive's start would remove (_remove_stale)
        except OSError:  # not ours to touch (a cache shared read-only): mapped all the same
            pass
        return [f"-XX:SharedArchiveFile={archive}", QUIET]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return []
    if not os.access(directory, os.W_OK | os.X_OK):
        return []
    _remove_orphans(directory)
    _remove_stale(directory)
    return [f"-XX:ArchiveClassesAtExit={archive}.{pid}{PENDING_SUFFIX}", QUIET]


def _remove_stale(directory: Path) -> None:
    """All but the :data:`KEEP` most recently used archives (a new one is about to be written beside them)."""
    found = []
    for path in directory.glob("kcl-*.jsa"):
        try:
            found.append((path.stat().st_mtime_ns, path))
        except OSError:  # removed meanwhile
            continue
    for _, path in sorted(found, reverse=True)[KEEP:]:
        try:
            path.unlink()
        except OSError:  # removed meanwhile, or not ours to remove
            continue


def _remove_orphans(directory: Path) -> None:
    """Pending archives of supervisors that are gone (a host killed while its JVM wrote one)."""
    for pending in directory.glob(f"kcl-*.jsa.*{PENDING_SUFFIX}"):
        try:
            os.kill(int(pending.name.rsplit(".", 2)[1]), 0)
        except ValueError:
            continue  # not one of ours
        except ProcessLookupError:
            pending.unlink(missing_ok=True)
        except OSError:  # alive under another user, or the file went meanwhile
            continue


def publish(command: Sequence[str], keep: bool) -> None:
    """After the JVM of ``command`` ended: move the archive it wrote into place (``keep``), or remove it."""
    for option in command:
        if option.startswith("-XX:ArchiveClassesAtExit=") and option.endswith(PENDING_SUFFIX):
            pending = Path(option.split("=", 1)[1])
            final = pending.with_name(pending.name.rsplit(".", 2)[0])
            try:
                if keep and pending.is_file() and pending.stat().st_size:
                    os.replace(pending, final)
                else:
                    pending.unlink(missing_ok=True)
            except OSError:  # a cache that cannot be written: the next start writes it again
                pass
