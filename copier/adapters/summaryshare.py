"""A host's DescribeStreamSummary answers, one file a stream, shared by the processors of one daemon.

The rules (who asks, when) are ``copier.core.summaryage``; this is their
I/O. A directory under the host's temporary directory
(``$TMPDIR/copier-<uid>/summaries-<digest>``, made private to the user) for
the processors of one KCL daemon (their parent process: a host's ``copier
run``) and one application and endpoints. Scoped to the daemon, not the host,
so that a new run never acts on a previous run's answer (a stream deleted and
created again under its name, a test session's streams of the same names):
it starts with none. Its ``owner`` file names the daemon's process; a new
share removes the directories whose daemon is gone (a host restarted by
systemd for months leaves none behind). In it, for each stream:

* ``<stream>.json``: the last :class:`~copier.core.summaryage.Answer`,
  replaced atomically (written beside, renamed): a reader sees the old
  answer or the new one, never part of one;
* ``<stream>.lock``: held (``flock``, never waited for) by the processor
  asking for the stream now. Another finds it held and goes on with the
  answer it has; a processor that dies while asking lets go of it with its
  file descriptors.

Nothing here may stop forwarding: a directory that cannot be made or
trusted (another user's), a file that cannot be read or written, all
leave a processor asking for itself, as it did before the share.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from copier.core.config import Config
from copier.core.summaryage import Answer

__all__ = ["SummaryShare"]


class SummaryShare:
    """The shared answers in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def for_host(cls, config: Config) -> SummaryShare | None:
        """The share of the processors of this daemon (the parent process: the KCL daemon that started this
        ``copier process``; a wrapper that does not ``exec`` it gets a share of its own) for this application
        and its staging and target endpoints, run by this user; None when no private directory can be had
        (each processor then asks alone)."""
        where = "\n".join(
            str(part)
            for part in (
                os.getppid(),
                config.application_name,
                config.region,
                config.kinesis_endpoint,
                config.target_region,
                config.target_endpoint,
            )
        )
        digest = hashlib.sha256(where.encode()).hexdigest()[:16]
        base = Path(tempfile.gettempdir()) / f"copier-{os.getuid()}"
        directory = base / f"summaries-{digest}"
        try:
            for path in (base, directory):
                path.mkdir(mode=0o700, exist_ok=True)
                status = path.stat()
                if status.st_uid != os.getuid() or status.st_mode & 0o077:
                    return None  # someone else's, or open to others: its answers are not to be trusted
        except OSError:
            return None
        cls._own(directory, os.getppid())
        cls.prune(base)
        return cls(directory)

    OWNER = "owner"  # the daemon's pid, in each share directory

    @classmethod
    def _own(cls, directory: Path, pid: int) -> None:
        owner = directory / cls.OWNER
        if not owner.exists():
            temporary = directory / f".{cls.OWNER}.{os.getpid()}"
            try:
                temporary.write_text(str(pid), encoding="ascii")
                os.replace(temporary, owner)
            except OSError:
                temporary.unlink(missing_ok=True)

    @classmethod
    def prune(cls, base: Path) -> list[Path]:
        """Remove the share directories under ``base`` whose daemon has exited, and say which. A directory
        with no owner yet (being made now) or an owner still running is left; a pid reused by another process
        keeps its directory until that one exits too (a few bytes, never a wrong answer: the pid is in the
        directory's name digest, and a new daemon asks before it reads)."""
        removed = []
        for directory in base.glob("summaries-*"):
            try:
                pid = int((directory / cls.OWNER).read_text(encoding="ascii"))
            except (OSError, ValueError):
                continue
            if pid > 0 and not _running(pid):
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory)
        return removed

    def _path(self, stream: str, suffix: str) -> Path:
        return self.directory / (stream + suffix)  # a stream name is [a-zA-Z0-9_.-]{1,128}: a file name

    def read(self, stream: str) -> Answer | None:
        """The host's last answer for ``stream``; None when there is none (or it cannot be read)."""
        try:
            return Answer.decode(self._path(stream, ".json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None

    def write(self, stream: str, answer: Answer) -> None:
        """Replace the host's answer for ``stream`` (atomically); a write that fails is forgotten (the next
        processor to find the answer stale asks again)."""
        path = self._path(stream, ".json")
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            temporary.write_text(answer.encode(), encoding="utf-8")
            os.replace(temporary, path)
        except OSError:
            temporary.unlink(missing_ok=True)

    @contextmanager
    def turn(self, stream: str) -> Iterator[bool]:
        """True while this process holds the right to ask for ``stream``; False when another holds it (or the
        lock cannot be had: then this process asks alone, True, as it would without the share)."""
        try:
            fd = os.open(self._path(stream, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            except OSError:
                yield True
                return
            yield True
        finally:
            os.close(fd)  # lets go of the lock


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: running
    return True
