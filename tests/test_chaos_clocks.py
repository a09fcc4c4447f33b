"""The chaos suite's host clocks (copier.chaos.clocks): a process under the generated wrapper really runs off time.

These run a Python child under the same wrapper a chaos worker's processors
run under, with libfaketime (``make install-test`` installs Debian's faketime).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from copier.chaos.clocks import faketime_offset, find_libfaketime, remove_stale_shm, write_offset, write_wrapper

# The child prints its wall clock, the monotonic clock at the same moment (libfaketime leaves it alone: it is the
# machine's, the same in every process) and how long a 0.2 s sleep took on it, every 0.25 s.
CHILD = """
import json, sys, time
for _ in range(int(sys.argv[1])):
    started = time.monotonic()
    time.sleep(0.2)
    print(json.dumps({"wall": time.time(), "mono": time.monotonic(), "slept": time.monotonic() - started}), flush=True)
    time.sleep(0.05)
"""


def _wrapped(tmp_path: Path, offset_ms: int, lines: int) -> tuple[Path, subprocess.Popen[str]]:
    clock = tmp_path / "host.faketime"
    write_offset(clock, offset_ms)
    command = [sys.executable, "-c", CHILD, str(lines)]
    script = write_wrapper(tmp_path / "wrapper.sh", command, clock, find_libfaketime(), tmp_path / "pids")
    child = subprocess.Popen([str(script)], stdout=subprocess.PIPE, text=True)
    return clock, child


def _offset_s(line: str) -> tuple[float, float]:
    """(the child's wall clock minus ours at the same moment, in seconds; the monotonic length of its 0.2 s sleep).

    Ours at the moment the child read its own: our wall clock where the monotonic clock read what the child's
    did, not when the line reached us (a loaded machine delivers it late: its delay would count as offset)."""
    sample = json.loads(line)
    ours = sample["mono"] + (time.time() - time.monotonic())
    return sample["wall"] - ours, sample["slept"]


@pytest.mark.parametrize(
    "offset_ms,text", [(2500, "+2.500"), (-800, "-0.800"), (0, "+0.000"), (-12005, "-12.005"), (7, "+0.007")]
)
def test_offsets_are_written_in_seconds_never_with_a_unit(offset_ms: int, text: str) -> None:
    """libfaketime reads "-800ms" as 800 minutes: offsets are signed seconds with a decimal point."""
    assert faketime_offset(offset_ms) == text


@pytest.mark.parametrize("offset_ms", [2500, -800])
def test_a_child_under_the_wrapper_sees_the_offset_and_sleeps_on_real_time(tmp_path: Path, offset_ms: int) -> None:
    """time.time() in the child is off by the offset; its time.sleep works and lasts real time (monotonic)."""
    _, child = _wrapped(tmp_path, offset_ms, 3)
    assert child.stdout is not None
    samples = [_offset_s(line) for line in child.stdout]  # each read as it comes: its offset is measured now
    assert child.wait(timeout=30) == 0 and len(samples) == 3
    for offset, slept in samples:
        assert abs(offset - offset_ms / 1000) < 0.1, (offset, offset_ms)
        # Its length, not shifted by the offset (libfaketime #426 would make it 2.7 s or return it at once); a
        # loaded machine may wake it late, never early.
        assert 0.19 < slept < 2.0, "a sleep lasts its length on the real monotonic clock"


def test_a_step_written_to_the_clock_file_is_seen_by_the_running_child(tmp_path: Path) -> None:
    """A clock step is a rewrite of the host's file: the running child's next clock read follows it."""
    clock, child = _wrapped(tmp_path, -3000, 12)
    assert child.stdout is not None
    offsets = []
    for n, line in enumerate(child.stdout):
        offsets.append(_offset_s(line)[0])
        if n == 3:
            write_offset(clock, 4000)
    child.wait(timeout=30)
    assert abs(offsets[0] + 3.0) < 0.1 and abs(offsets[-1] - 4.0) < 0.1, offsets
    assert all(abs(o + 3.0) < 0.1 or abs(o - 4.0) < 0.1 for o in offsets), offsets


def test_the_wrapper_execs_the_command_with_the_preload_and_without_faketime(tmp_path: Path) -> None:
    """The script sets the preload for what it execs only, and unsets FAKETIME (it would override the file)."""
    clock = tmp_path / "c"
    library = Path("/lib/x.so.1")
    script = write_wrapper(tmp_path / "w.sh", ["/bin/true", "a b"], clock, library, tmp_path / "p").read_text()
    assert script.startswith("#!/bin/sh\n") and "unset FAKETIME\n" in script
    assert "export LD_PRELOAD=/lib/x.so.1\n" in script and "export FAKETIME_DONT_FAKE_MONOTONIC=1\n" in script
    assert script.rstrip().endswith("exec /bin/true 'a b'")


def test_what_libfaketime_leaves_for_a_killed_processor_is_removed_and_only_that(tmp_path: Path) -> None:
    """A SIGKILLed child leaves its pid's semaphore and shared memory in /dev/shm: removed once it is gone,
    a zombie not yet reaped included."""
    clock, child = _wrapped(tmp_path, 1000, 40)
    assert child.stdout is not None
    child.stdout.readline()  # it runs, under libfaketime
    pids = tmp_path / "pids"
    assert pids.read_text().split() == [str(child.pid)], "the wrapper execs: the processor keeps its pid"
    shm = Path("/dev/shm")
    left = {f"faketime_shm_{child.pid}", f"sem.faketime_sem_{child.pid}"}
    assert remove_stale_shm(pids) == 0, "nothing is removed while the processor runs"
    child.kill()
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 10
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
        time.sleep(0.01)  # dead, not reaped: a zombie
    assert left <= {p.name for p in shm.iterdir()}, "a SIGKILL leaves them"
    assert remove_stale_shm(pids) == 2 and not left & {p.name for p in shm.iterdir()}
    child.wait()
