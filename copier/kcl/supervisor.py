"""``copier run``'s parent of the KCL daemon JVM: an exit status a supervisor can trust, log lines at their level.

Why a parent at all, rather than exec'ing the JVM: the MultiLangDaemon
exits 0 when it gives up ("Unable to initialize after 20 attempts. Shutting
down.", a backend it cannot reach), exactly as after a requested stop, so
systemd, a script or an operator reads a daemon that never started as a
clean stop. This process starts the JVM, forwards the signals that ask it to
stop, and decides the status:

* a stop that was asked for (SIGTERM, SIGINT, SIGHUP) and a daemon that then
  exits 0 or by that signal: 0;
* the daemon ends on its own: never 0. Status 1 when it exited 0 (it gave
  up), its own status otherwise, 128 + N when signal N killed it; one line
  ``copier: the KCL daemon ...`` says which, with the last error it logged.

It also relays the daemon's stderr (the daemon's own log and every
processor's JSON lines, which the daemon echoes raw) line by line, and when
stderr is the systemd journal it prefixes each line with its syslog
priority (``<3>`` error, ``<4>`` warning, ``<6>`` info, ``<7>`` debug), which
journald strips and files, so ``journalctl -u copier -p warning`` shows what
needs attention and nothing else. A line that is not a log record (a Java
exception's ``Caused by: ...``) keeps the priority of the record it belongs to.

What it leaves out, unless ``copier.daemonLogLevel`` is INFO or DEBUG
(``--stack-traces``): the stack frames of the daemon's Java exceptions and
the rest of each exception's text after its first line. A daemon that could
not reach its backend wrote 1,141 frame lines and the AWS SDK's advice to
"increase max connections" (18 times) in 114 s (issue 45); each record keeps
its line, its exception and every ``Caused by``, which say what happened.
And one KCL warning is filed (and written) at info while the daemon starts
(until a processor speaks, at most :data:`STARTUP_S`): the lease assignment's "Not
able to assign all expiredOrUnAssignedLeases", which KCL 3.1.3's leader logs
whenever a lease is left unassigned. At a start that is because no worker
has reported its metrics yet (``LeaseAssignmentManager``: a worker without a
``WorkerMetricStats`` entry cannot take leases; the first report comes two
capture intervals after the worker starts): the next round assigns them.
Later the same warning means every worker is at its lease or throughput
limit, or their metrics are stale: then it is a warning, as the KCL says.
The other is the KCL's "Did not find an operating range metadata provider"
(``WorkerMetricsSelector``, said once as the worker starts): off EC2, ECS and
EKS there is no CPU metric, and the leader balances leases without one.

Why a lease moved, at info: copier's logback configuration lets two KCL
loggers through at INFO, and of their records only those that say a lease
moved are relayed (:data:`LEASE_MOVES`; the rest of their INFO is a report
every assignment round): the leader's "Leases taken from worker W are : [...]"
(a rebalance) and "Assigning lease : S to worker : W", and the losing
worker's "Worker W lost lease with key S" (the lease went to another owner)
and "... because it is expired" (this worker's renewals came too late).

It imports nothing heavy: it lives as long as the daemon, one per host.
If it is killed, the JVM gets SIGKILL too (``PR_SET_PDEATHSIG``), as on a
host crash: no daemon runs on without a parent that reports its end.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import BinaryIO

from copier.adapters.journal import DEBUG, ERROR, INFO, WARNING, journal_wanted
from copier.adapters.summaryshare import SHARE_ENV, SummaryShare
from copier.kcl.classarchive import publish

__all__ = [
    "LEASE_MOVES",
    "STACK_TRACES",
    "STARTUP_S",
    "DaemonEnd",
    "Relay",
    "end_of",
    "main",
    "priority_of",
    "supervise",
]

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# Debugging signals the JVM acts on without stopping (SIGQUIT: a thread dump).
PASS_SIGNALS = (signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

_LOGBACK = re.compile(rb"^\d{4}-\d\d-\d\d[ T][\d:,.]+ +(TRACE|DEBUG|INFO|WARN|ERROR)\b")
_LOGBACK_RECORD = re.compile(r"^\S+ \S+ +\w+ +\[[^\]]*\] (\S+) - (.*)$")  # date time level [thread] logger - msg
_LOGBACK_LEVELS = {b"TRACE": DEBUG, b"DEBUG": DEBUG, b"INFO": INFO, b"WARN": WARNING, b"ERROR": ERROR}
_JSON_LEVELS = {"debug": DEBUG, "info": INFO, "warning": WARNING, "warn": WARNING, "error": ERROR}
_JSON_LEVELS.update({"critical": 2, "fatal": 2, "exception": ERROR})
# The first line of a Java exception: its class (dotted), its message after ": " (``Caused by: `` first, for a cause).
_THROWABLE = re.compile(rb"^(Caused by: )?[A-Za-z_$][\w$]*(\.[\w$]+)+(: |\r?\n|$)")
# KCL warnings that a start says and that need nothing done then (see the module docstring): filed at info.
_STARTUP_WARNINGS = (
    # the leader's first rounds, before any worker has reported its metrics
    b"LeaseAssignmentManager - Not able to assign all expiredOrUnAssignedLeases",
    # off EC2, ECS and EKS (no instance metadata): leases are balanced without CPU metrics
    b"WorkerMetricsSelector - Did not find an operating range metadata provider.",
)
STARTUP_S = 60.0
#: Of these loggers' INFO records (logback.xml lets them through), only those saying a lease moved are relayed.
LEASE_MOVES = {
    b"VarianceBasedLeaseAssignmentDecider": (b"Assigning lease : ", b"Leases taken from worker : "),
    b"DynamoDBLeaseRenewer": (b" lost lease with key ", b"because it is expired", b"could not renew lease"),
}
_RECORD_PARTS = re.compile(rb"^\S+ \S+ +(\w+) +\[[^\]]*\] \S*?([\w$]+) - (.*)$", re.S)  # level, class, message
REASON_CHARS = 400  # the reason line quotes at most this much of the error it names
PR_SET_PDEATHSIG = 1
RELAY_DRAIN_S = 5.0  # after the JVM's exit, how long its last lines may take to arrive


def priority_of(line: bytes) -> int | None:
    """The syslog priority of one stderr line of the daemon: its own level if it is a log record (logback's
    pattern or a processor's JSON line), else ``None`` (a continuation: it belongs to the record before it)."""
    match = _LOGBACK.match(line)
    if match:
        return _LOGBACK_LEVELS[match.group(1)]
    if line.startswith(b"{"):
        try:
            record = json.loads(line)
        except ValueError:
            return None
        level = record.get("level") if isinstance(record, dict) else None
        return _JSON_LEVELS.get(str(level).lower(), INFO) if level is not None else None
    return None


class Relay:
    """Copies the daemon's stderr to ours a line at a time, prefixed with priorities when ``prefix``, and
    keeps the last error it saw with its root cause (the reason the caller gives when the daemon ends on its
    own; "Unable to initialize ..." wins over any later error)."""

    def __init__(self, out: BinaryIO, prefix: bool, stack_traces: bool = False, startup_s: float = STARTUP_S) -> None:
        """``stack_traces``: relay the daemon's Java exceptions whole (else their first lines: the docstring);
        ``startup_s``: how long the daemon's start lasts at most, for the warnings it says then."""
        self.out = out
        self.prefix = prefix
        self.stack_traces = stack_traces
        self.priority = INFO
        self.last_error: list[str] | None = None  # [the record, its innermost "Caused by"]
        self.gave_up: list[str] | None = None
        self.left_out = 0  # lines of Java exceptions not relayed
        self._current: list[str] | None = None
        self._java = False  # the record being relayed is the daemon's own (logback's), not a processor's
        self._throwable = False  # ... and an exception of it is being relayed
        self._dropping = False  # the record being read is a chatty logger's report, not relayed
        self._starting_until = time.monotonic() + startup_s  # 0 once a processor has spoken
        self._lock = threading.Lock()

    def line(self, line: bytes) -> None:
        """Relay one line (with its newline, if it had one)."""
        level = priority_of(line)
        if level is not None:
            self._java = not line.startswith(b"{")
            self._throwable = False
            self._dropping = self._java and level == INFO and not self.stack_traces and not _a_lease_move(line)
            if not self._java:
                self._starting_until = 0.0
            elif level == WARNING and time.monotonic() < self._starting_until and _expected_at_start(line):
                level, line = INFO, line.replace(b" WARN  [", b" INFO  [", 1)  # its text says what it is filed at
            self.priority = level
            self._current = [_reason_text(line)] if level <= ERROR else None
            if self._current is not None:
                self.last_error = self._current
                if b"Unable to initialize" in line:
                    self.gave_up = self._current
        elif self._current is not None and line.lstrip().startswith(b"Caused by: "):
            self._current[1:] = [_reason_text(line.lstrip()[len(b"Caused by: ") :])]
        if self._dropping:  # an assignment round's report (the record and its continuation lines)
            return
        if level is None and self._java and not self.stack_traces and self._left_out(line):
            self.left_out += 1
            return
        prefix = b"<%d>" % self.priority if self.prefix else b""
        self._write(prefix + (line if line.endswith(b"\n") else line + b"\n"))

    def _left_out(self, line: bytes) -> bool:
        """Is this continuation of a daemon's record a part of a Java exception past its first lines (a stack
        frame, a suppressed exception, the rest of a long message)? Its first line and each ``Caused by``
        are kept."""
        if _THROWABLE.match(line):
            self._throwable = True
            return False
        return self._throwable or line.lstrip().startswith(b"at ")

    @property
    def reason(self) -> str | None:
        """Why the daemon ended, as far as its log says: the error and its root cause."""
        record = self.gave_up or self.last_error
        return None if record is None else " (caused by: ".join(record) + (")" if len(record) > 1 else "")

    def say(self, level: int, text: str) -> None:
        """A line of the supervisor's own."""
        self._write((f"<{level}>" if self.prefix else "").encode() + f"copier: {text}\n".encode())

    def _write(self, data: bytes) -> None:
        with self._lock:
            self.out.write(data)
            self.out.flush()

    def copy(self, stream: BinaryIO) -> None:
        """Relay ``stream`` until it closes (the daemon and all its children are gone or closed it)."""
        for line in iter(stream.readline, b""):
            self.line(line)


def _expected_at_start(line: bytes) -> bool:
    return any(warning in line for warning in _STARTUP_WARNINGS)


def _a_lease_move(line: bytes) -> bool:
    """Is this INFO record of the daemon's one to relay: any logger's but :data:`LEASE_MOVES`', and of those the
    records that say a lease moved ("are : []": a rebalance that took nothing)?"""
    match = _RECORD_PARTS.match(line)
    if match is None or match.group(2) not in LEASE_MOVES:
        return True
    message = match.group(3).rstrip()
    return any(phrase in message for phrase in LEASE_MOVES[match.group(2)]) and not message.endswith(b"are : []")


def _reason_text(line: bytes) -> str:
    text = line.decode("utf-8", "replace").strip()
    if text.startswith("{"):
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if isinstance(record, dict):
            detail = " ".join(f"{k}={v}" for k, v in record.items() if k not in ("event", "level", "timestamp"))
            text = f"{record.get('event', '')} {detail}".strip()
    else:
        match = _LOGBACK_RECORD.match(text)
        if match:
            text = f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2)}"
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


class DaemonEnd:
    """How ``copier run`` reports the daemon's end: the exit status and, unless it was a requested stop, one
    line saying why."""

    def __init__(self, status: int, line: str | None) -> None:
        self.status = status
        self.line = line


def end_of(returncode: int, requested: int | None, why: str | None) -> DaemonEnd:
    """Decide ``copier run``'s status from the JVM's ``returncode`` (negative: killed by that signal), the
    stop signal that was forwarded to it (``requested``, None if nobody asked it to stop) and the reason its
    log gave (``why``)."""
    tail = f"; its last error: {why}" if why else " (it logged no error)"
    if requested is not None and returncode in (0, -requested, 128 + requested):
        return DaemonEnd(0, None)
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return DaemonEnd(128 - returncode, f"the KCL daemon was killed by {name}{tail}")
    asked = "" if requested is None else f" after {signal.Signals(requested).name}"
    if returncode == 0:
        return DaemonEnd(1, f"the KCL daemon stopped on its own without being asked to (exit 0){tail}")
    return DaemonEnd(returncode, f"the KCL daemon exited with status {returncode}{asked}{tail}")


def _die_with_parent() -> None:
    """In the JVM's child, before exec: SIGKILL when this supervisor dies (Linux; elsewhere a no-op)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def supervise(command: Sequence[str], out: BinaryIO, prefix: bool, stack_traces: bool = False) -> int:
    """Run ``command`` (the daemon's java command line) to its end; ``copier run``'s exit status."""
    relay = Relay(out, prefix, stack_traces)
    requested: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        if signum in STOP_SIGNALS and not requested:
            requested.append(signum)
        for proc in started:  # none yet: a stop asked before the JVM exists is sent to it once it does
            try:
                proc.send_signal(signum)
            except ProcessLookupError:  # pragma: no cover - it ended between the check and the kill
                pass

    # The handlers come first: a stop asked while the JVM is being spawned is remembered, not fatal.
    for signum in (*STOP_SIGNALS, *PASS_SIGNALS):
        signal.signal(signum, forward)
    # The run's DescribeStreamSummary share (copier.adapters.summaryshare): made fresh for this run, named to
    # the daemon's processors in their environment, removed when the daemon has ended.
    share = SummaryShare.start_run(adopt=os.environ.get(SHARE_ENV))  # copier run's, with its checks' answers
    env = {k: v for k, v in os.environ.items() if k != SHARE_ENV}  # none: each processor asks alone
    if share is not None:
        env[SHARE_ENV] = str(share)
    try:
        proc = subprocess.Popen(list(command), stderr=subprocess.PIPE, preexec_fn=_die_with_parent, env=env)  # noqa: PLW1509
    except BaseException:
        SummaryShare.end_run(share)
        raise
    started.append(proc)
    if requested:
        forward(requested[0], None)
    assert proc.stderr is not None
    # The relay reads in a thread and the main thread waits for the JVM: a child that outlives the daemon
    # (a processor orphaned by a SIGKILL) and kept a copy of its stderr must not hold ``copier run`` up.
    reader = threading.Thread(target=relay.copy, args=(proc.stderr,), name="relay", daemon=True)
    reader.start()
    returncode = proc.wait()
    SummaryShare.end_run(share)
    # The class-data archive a first run wrote at exit: kept from a run that was stopped (it loaded what a
    # running daemon loads), not from one that ended on its own (it may never have got that far).
    publish(command, keep=bool(requested) and returncode >= 0)
    # Nothing is left to stop. Ignored from here on, a stop asked again cannot kill this process by its signal
    # (status -15) while the interpreter exits: its shutdown puts a handler back to SIG_DFL, not SIG_IGN.
    for signum in (*STOP_SIGNALS, *PASS_SIGNALS):
        signal.signal(signum, signal.SIG_IGN)
    reader.join(RELAY_DRAIN_S)
    end = end_of(returncode, requested[0] if requested else None, relay.reason)
    if end.line:
        relay.say(ERROR, end.line)
    return end.status


STACK_TRACES = "--stack-traces"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m copier.kcl.supervisor [--stack-traces] JAVA ARGS...`` (what ``copier run`` execs)."""
    command = list(sys.argv[1:] if argv is None else argv)
    stack_traces = command[:1] == [STACK_TRACES]
    command = command[1:] if stack_traces else command
    if not command:
        sys.stderr.write(f"usage: python -m copier.kcl.supervisor [{STACK_TRACES}] JAVA [ARGS...]\n")
        return 2
    return supervise(command, sys.stderr.buffer, journal_wanted(), stack_traces)


if __name__ == "__main__":
    sys.exit(main())
