"""A host's DescribeStreamSummary answers and shard listings, one file each a stream, shared by the processors
of one daemon run.

The rules (who asks, when) are ``copier.core.summaryage`` and
``copier.core.shardmap``; this is their I/O. ``copier run`` makes a fresh
private directory for its run before its checks
(``$TMPDIR/copier-<uid>/summaries-<random>``: :meth:`SummaryShare.start_run`),
whose DescribeStreamSummary answers go there as the processors' first; the
daemon's supervisor (``copier.kcl.supervisor``, the same process after the
exec) adopts it, names it to the daemon's processors in the environment
(``SHARE_ENV``), and removes it when the daemon ends
(:meth:`SummaryShare.end_run`). Scoped to the run, not the host or a process
id, so that a new run never acts on a previous run's answer (a stream deleted
and created again under its name, a limit raised before a restart, a
container restarted with the same pids): it starts with none but its own
checks'. A run killed before it could clean up is removed by the next run
on the host (its ``owner`` file names the supervisor's pid). Inside, one
directory per application, endpoints and target account (``copier process``
reads its properties when it starts, so a file edited under a running daemon
could give its processors two targets of one name), and in it, for each
stream:

* ``<stream>.json``: the last :class:`~copier.core.summaryage.Answer`,
  replaced atomically (written beside, renamed): a reader sees the old
  answer or the new one, never part of one;
* ``<stream>.lock``: held (``flock``) by the processor asking for the stream
  now. Another with an answer goes on with it; one with none waits for the
  holder's answer a bounded time (``copier.adapters.summaries``); a processor
  that dies while asking lets go of it with its file descriptors;
* ``<stream>.map`` and ``<stream>.maplock``: the stream's open shards by hash
  key range (the target's, for the chunks' target shards) and the turn to
  list it, kept as the answer and its lock are;
* ``<stream>.shards``: the stream's shard IDs, parents and ranges (the
  staging stream's, for takeovers), written by whichever processor listed it
  last, no turn taken.

Nothing here may stop forwarding: a directory that cannot be made or
trusted (another user's, or open to others), no temporary directory at all, a
file that cannot be read or written, all leave a processor asking for
itself, as it did before the share. ``copier process`` run by anything but
``copier run`` (a test, a wrapper) has no share.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from copier.core.config import Config
from copier.core.shardmap import Listing, decode_entries, decode_listing, encode_entries, encode_listing
from copier.core.summaryage import Answer
from copier.core.summaryboard import answer_scope

__all__ = ["SHARE_ENV", "SummaryShare"]

SHARE_ENV = "COPIER_SUMMARY_SHARE"  # the run's share directory, for the daemon's processors
OWNER = "owner"  # the supervisor's pid, in each run's directory
UNOWNED_GRACE_S = 60.0  # a run directory still without an owner this long after it was made: its maker died


class SummaryShare:
    """The shared answers in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @staticmethod
    def start_run(adopt: str | None = None) -> Path | None:
        """A fresh private directory for one daemon run (this process: its supervisor), after removing those of
        runs whose supervisor has exited; None when there can be none (the processors then ask alone).
        ``adopt``: the directory ``copier run`` made for this run before it exec'd the supervisor (its checks'
        answers are there), taken when it is a run directory of this user's that this very process owns; any
        other (inherited from another run, or named by someone else) is not trusted, and a fresh one is made."""
        try:
            base = _base()
            base.mkdir(mode=0o700, exist_ok=True)
            if not _private(base):
                return None  # someone else's, or open to others: nothing made there is to be trusted
            if adopt and _owned_here(base, Path(adopt)):
                return Path(adopt)
            prune(base)
            directory = Path(tempfile.mkdtemp(prefix="summaries-", dir=base))  # mode 0700
            temporary = directory / f".{OWNER}"
            temporary.write_text(str(os.getpid()), encoding="ascii")
            os.replace(temporary, directory / OWNER)  # never seen empty: a supervisor killed mid-write leaves none
        except OSError:
            return None
        return directory

    @staticmethod
    def end_run(directory: Path | None) -> None:
        """Remove a run's directory (its daemon has ended), and the user's directory above it once no other
        run's is there (a host's temporary directory keeps nothing of copier between runs)."""
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(OSError):  # another run's directory is there, or it is being made
                directory.parent.rmdir()

    @staticmethod
    def sweep() -> None:
        """Remove the run directories of runs that ended without removing their own (a supervisor SIGKILLed,
        by a host's loss or a stop that did not end in time), and the user's directory once empty: what starts
        and stops daemons on one machine (``copier.local.pipeline``) leaves nothing of theirs behind."""
        base = _base()
        if base.is_dir() and _private(base):
            prune(base)
            with contextlib.suppress(OSError):  # a run still going keeps its directory, and so this one
                base.rmdir()

    @classmethod
    def for_host(cls, config: Config, env: Mapping[str, str] | None = None) -> SummaryShare | None:
        """The share of this daemon run's processors (``SHARE_ENV``, set by ``copier run``'s supervisor) for this
        application, its staging and target endpoints and the target's account; None outside ``copier run``
        or when the directory cannot be trusted or used (each processor then asks alone)."""
        run = (os.environ if env is None else env).get(SHARE_ENV)
        if not run:
            return None
        try:
            directory = Path(run) / answer_scope(config)
            if not _private(Path(run)):
                return None
            directory.mkdir(mode=0o700, exist_ok=True)
            if not _private(directory):
                return None
        except OSError:
            return None
        return cls(directory)

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
        self._replace(self._path(stream, ".json"), answer.encode())

    def read_listing(self, stream: str) -> Listing | None:
        """The host's last map of ``stream``'s open shards and when it was listed; None when there is none (or
        it cannot be read)."""
        try:
            return decode_listing(self._path(stream, ".map").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None

    def write_listing(self, stream: str, listing: Listing) -> None:
        """Replace the host's map of ``stream`` (atomically); a write that fails is forgotten (the next
        processor to find its map stale lists the stream again)."""
        self._replace(self._path(stream, ".map"), encode_listing(listing))

    def read_entries(self, stream: str) -> tuple[float, list[dict[str, Any]]] | None:
        """The host's last ListShards entries of ``stream`` (IDs, parents, ranges) and when they were listed;
        None when there are none (or they cannot be read)."""
        try:
            return decode_entries(self._path(stream, ".shards").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return None

    def write_entries(self, stream: str, listed_s: float, shards: list[dict[str, Any]]) -> None:
        """Replace the host's entries of ``stream`` (atomically); a write that fails is forgotten."""
        self._replace(self._path(stream, ".shards"), encode_entries(listed_s, shards))

    @staticmethod
    def _replace(path: Path, text: str) -> None:
        """``path`` holds ``text`` or what it held before, never part of it (written beside, renamed)."""
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            temporary.write_text(text, encoding="utf-8")
            os.replace(temporary, path)
        except OSError:
            temporary.unlink(missing_ok=True)

    @contextmanager
    def turn(self, stream: str, wait_s: float = 0.0, what: str = "summary") -> Iterator[bool]:
        """True while this process holds the right to ask for ``stream``'s ``what`` (``summary``:
        DescribeStreamSummary; ``listing``: ListShards); False when another holds it for more than ``wait_s``
        (or the lock cannot be had: then this process asks alone, True, as it would without the share). A
        processor that waited gets the turn after the holder let go: it reads the holder's answer before asking
        again."""
        try:
            fd = os.open(self._path(stream, _LOCKS[what]), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            yield True
            return
        try:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        yield False
                        return
                    time.sleep(TURN_POLL_S)
                except OSError:
                    yield True
                    return
            yield True
        finally:
            os.close(fd)  # lets go of the lock


TURN_POLL_S = 0.02
# Each answer's lock file: a stream name is [a-zA-Z0-9_.-]{1,128}, so a suffix cannot make one stream's file
# another's (``x.map`` holds the listing of ``x``; the stream ``x.map`` has ``x.map.json`` and ``x.map.lock``).
_LOCKS = {"summary": ".lock", "listing": ".maplock"}


def _base() -> Path:
    """The user's directory of run directories, in the temporary directory (``TMPDIR``)."""
    return Path(tempfile.gettempdir()) / f"copier-{os.getuid()}"


def prune(base: Path) -> list[Path]:
    """Remove the run directories under ``base`` whose supervisor has exited (a run killed before it could
    clean up, or between making it and naming itself), and say which. One with no owner for under
    ``UNOWNED_GRACE_S`` (being made now) or an owner still running is left; a pid reused by another process
    keeps its directory until that one exits too (a few bytes, never a wrong answer: no run reads another's
    directory)."""
    removed = []
    for directory in base.glob("summaries-*"):
        try:
            pid = int((directory / OWNER).read_text(encoding="ascii"))
        except (OSError, ValueError):  # no owner yet: being made now, or its maker died making it
            ended = _made_before(directory, time.time() - UNOWNED_GRACE_S)
        else:
            ended = pid > 0 and not _running(pid)
        if ended:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def _owned_here(base: Path, directory: Path) -> bool:
    """Whether ``directory`` is one of ``base``'s run directories, private, and owned by this process."""
    try:
        return (
            directory.parent == base
            and directory.name.startswith("summaries-")
            and _private(directory)
            and (directory / OWNER).read_text(encoding="ascii") == str(os.getpid())
        )
    except OSError:
        return False


def _made_before(directory: Path, when: float) -> bool:
    """Whether ``directory`` (a run's, still without an owner) was made before ``when``: its supervisor was
    killed between making it and naming itself, and nothing will ever name an owner there."""
    try:
        return directory.stat().st_mtime < when
    except OSError:
        return False


def _private(path: Path) -> bool:
    """A directory of this user's that nobody else may write or read (answers there decide what is done to
    records: another user's could make copier dead-letter what the target takes)."""
    status = path.stat()
    return path.is_dir() and status.st_uid == os.getuid() and not status.st_mode & 0o077


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: running
    return True
