"""Host clocks off AWS time for the chaos suite: libfaketime in a worker's ``copier process`` children only.

Why this mechanism: the copier's leases and verification windows are
compared across hosts in wall-clock time, and it measures each host's clock
against the ``Date`` headers of AWS answers (``copier.core.clockcheck``). To test
that on real processes, the processes' own wall clock has to be off, not a
value the copier is told: libfaketime (Debian's ``faketime`` package) is
preloaded into the child and moves what ``clock_gettime(CLOCK_REALTIME)``
and friends return, so ``time.time()``, the leases, the digest batches'
start times and the clock measurement all see the same offset, and nothing
in the copier knows it runs under a test. The real alternatives are worse:
changing the machine's clock would move every worker and the backend
together (no offset between them), and patching ``time.time`` from Python
would miss ``datetime`` and any C code that reads the clock.

What is faked and what is not:

* only ``copier process``: the worker's ``executableName`` is a generated
  wrapper script (:func:`write_wrapper`) that sets the preload and then
  ``exec``s the processor. The JVM (the KCL's leases and its DynamoDB
  clock) and the local backend, which stands for AWS time, run on the real
  clock;
* the offset is read from the host's ``FAKETIME_TIMESTAMP_FILE`` at every
  call (``FAKETIME_NO_CACHE=1``, about 7 microseconds a call, measured), so
  that a step the harness writes (:func:`write_offset`) is seen at once by
  a running processor (with ``FAKETIME_CACHE_DURATION=1`` instead, a step
  took libfaketime 0.9.10 about 2 s to see, measured). ``FAKETIME`` is
  unset: it would take priority over the file;
* ``FAKETIME_DONT_FAKE_MONOTONIC=1``: timeouts and backoffs, measured on
  the monotonic clock, stay real, as on a host whose NTP stepped the
  wall clock;
* an offset is written in seconds with a decimal point (``+2.500``,
  ``-0.800``): libfaketime reads ``-800ms`` as 800 *minutes* (``m``),
  measured, so milliseconds are never written with a unit.

libfaketime 0.9.10 (Debian 12's) has one bug on this path: with
``FAKETIME_DONT_FAKE_MONOTONIC`` it shifts an absolute
``clock_nanosleep(CLOCK_MONOTONIC)`` by the wall-clock offset (issue #426,
fixed in 0.9.11), and Python 3.11's ``time.sleep`` sleeps that way, so it
fails with EINVAL. The wrapper puts :mod:`copier.chaos.faketime_site` on
``PYTHONPATH``; its ``sitecustomize`` probes ``time.sleep(0)`` and, only
where it fails so, replaces ``time.sleep`` by a sleep on relative
``select`` timeouts measured on the real monotonic clock.

libfaketime also creates a semaphore and a shared memory object named after
each process's pid in /dev/shm, and a SIGKILLed processor (the suite kills
many) leaves them behind. The wrapper notes each processor's pid, and
:func:`remove_stale_shm` removes what the dead ones left.
"""

from __future__ import annotations

import glob
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "LIBFAKETIME_ENV",
    "SITE_DIR",
    "faketime_offset",
    "find_libfaketime",
    "noted_pids",
    "remove_stale_shm",
    "running",
    "write_offset",
    "write_wrapper",
]

LIBFAKETIME_ENV = "COPIER_LIBFAKETIME"  # a libfaketime.so.1 to use instead of the one found
_SEARCHED = (
    "/usr/lib/*-linux-gnu/faketime/libfaketime.so.1",  # Debian and Ubuntu (the faketime package)
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",  # built from source
)
SITE_DIR = Path(__file__).resolve().with_name("faketime_site")


def find_libfaketime() -> Path:
    """The libfaketime library to preload: ``$COPIER_LIBFAKETIME``, or the first found where packages put it.

    Raises FileNotFoundError with what to do: a seed that draws clock faults cannot run without it.
    """
    given = os.environ.get(LIBFAKETIME_ENV)
    candidates = [given] if given else [path for pattern in _SEARCHED for path in sorted(glob.glob(pattern))]
    for candidate in candidates:
        if Path(candidate).is_file():
            return Path(candidate)
    raise FileNotFoundError(
        "libfaketime.so.1 not found (chaos seeds with clock faults preload it): install the Debian package "
        f"faketime (make install-test does), or set {LIBFAKETIME_ENV} to the library"
    )


def faketime_offset(offset_ms: int) -> str:
    """libfaketime's spelling of an offset from real time: signed seconds with three decimals ("+2.500")."""
    sign = "-" if offset_ms < 0 else "+"
    seconds, millis = divmod(abs(offset_ms), 1000)
    return f"{sign}{seconds}.{millis:03d}"


def write_offset(path: Path, offset_ms: int) -> None:
    """Set a host's clock offset: its processors read the file at every clock call, so this is a clock step.

    Written aside and renamed over the file, so that a processor never reads half a line.
    """
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(faketime_offset(offset_ms) + "\n")
    os.replace(temporary, path)


def write_wrapper(path: Path, command: Sequence[str], clock_file: Path, library: Path, pids: Path) -> Path:
    """A shell script that runs ``command`` (``copier process --properties F``) on the clock of ``clock_file``.

    It is what the worker's ``executableName`` names: the daemon spawns it for each shard, and it
    ``exec``s the processor, so the daemon's child is the processor itself (signals and exits as before).
    It appends the processor's pid to ``pids`` first (see :func:`remove_stale_shm`).
    """
    variables = {
        "LD_PRELOAD": str(library),
        "FAKETIME_TIMESTAMP_FILE": str(clock_file),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": str(SITE_DIR),
    }
    lines = [
        "#!/bin/sh",
        "# Written by copier.chaos.clocks: this host's wall clock for copier process, not for the daemon's JVM.",
        "unset FAKETIME",
        f"echo $$ >> {shlex.quote(str(pids))}",
        *(f"export {name}={shlex.quote(value)}" for name, value in variables.items()),
        "exec " + " ".join(shlex.quote(part) for part in command),
    ]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o755)
    return path


def noted_pids(pids: Path) -> set[int]:
    """The processor pids the wrappers noted in ``pids`` (none if the file is absent)."""
    return {int(line) for line in pids.read_text().split() if line.isdigit()} if pids.is_file() else set()


def running(pid: int) -> bool:
    """Whether ``pid`` is a process still running: a zombie is not (a processor SIGKILLed with its worker
    is one until init reaps it, which can be after the harness looks)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def remove_stale_shm(pids: Path, shm: Path = Path("/dev/shm")) -> int:
    """Remove the semaphores and shared memory libfaketime left for the processors in ``pids`` that are gone.

    Only those: another program's libfaketime objects are not this suite's to remove. Returns how many
    files were removed.
    """
    removed = 0
    for pid in sorted(noted_pids(pids)):
        if running(pid):
            continue  # still running (or the pid is taken again): not stale
        for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
            try:
                (shm / name).unlink()
                removed += 1
            except FileNotFoundError:
                pass
    return removed
