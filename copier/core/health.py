"""Is a shard being copied? The judgement behind ``copier status`` and ``copier status --check``.

Three questions per staging shard, each answered from what a command can
read in one pass, never from the journal (it is on other hosts):

* **Who owns it, and is that owner alive?** copier's own lease cannot say:
  it is renewed by the owner's writes, and an idle shard has none, so its
  lease runs out on a healthy worker. The KCL's lease table names the
  worker that holds the shard (``leaseOwner``), and KCL 3.x workers report
  to the WorkerMetricStats table every ``workerMetricsReporterFreqInMillis``
  (``lut``, epoch seconds), idle or not. The KCL's leader counts a worker
  whose last report is more than two reporting intervals old as gone and
  gives its leases to others (``LeaseAssignmentManager``); the same rule
  here, plus the clock margin and the report's one-second resolution, tells
  a live owner from a dead one.
* **How far behind is it?** What staging holds after the committed position
  (``Waiting``: one GetRecords of one record there). The lag is how long the
  oldest record not yet forwarded has waited, which a quiet shard whose
  owner died and a busy shard that fell behind both show, and 0 when
  nothing waits. Kinesis cannot count the records between two positions
  without reading them (that would spend the shard's 2 MiB/s), so the
  count is only whether any wait.
* **Is it stalled?** What its owner wrote in the state item
  (``copier.shard.stalls``): why, and since when.

How long a shard has had no live owner is known only as a bound. Its
owner was alive at its last report (``lut``), but a stopped worker's
report, a lease with no owner, or an idle shard's copier lease (renewed
only by writes) says nothing of when it went away. The rule: the owner is
*known gone* from the later of its worker's last report plus the expiry
above (when the KCL's leader counts it dead) and copier's lease expiry
(when it can no longer write); ``no live owner for at least ...`` counts
from that instant. When its worker has no report (stopped, or no owner),
no instant is known: the line says ``no live owner`` with no duration, and
it is a problem as soon as copier's lease of the shard has run out (at once
for an idle shard): a lease move names a live owner within seconds, so an
owner nobody can date is not one in the middle of a move.

A *problem* (a line of ``--check``) is a stall; a shard that needs an owner
and has had none, or a dead one, for longer than ``max_unowned_ms`` after
its owner is known gone (above); a record that has waited longer than
``max_lag_ms``; or a shard whose staging could not be read. A shard copier
has ended (SHARD_END) needs neither owner nor reading.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from copier.core.state import ShardState

__all__ = [
    "KCL_REPORT_MILLIS",
    "Health",
    "KclLease",
    "Thresholds",
    "Waiting",
    "gone_since",
    "judge",
    "reading_from",
    "span",
    "worker_expiry_ms",
]

KCL_REPORT_MILLIS = 30_000  # the KCL 3.x default of workerMetricsReporterFreqInMillis
REPORTS_MISSED = 2  # the KCL leader's DEFAULT_NO_OF_SKIP_STAT_FOR_DEAD_WORKER_THRESHOLD
ENDED = "SHARD_END"


@dataclass(frozen=True)
class KclLease:
    """A shard's item in the KCL's lease table: its worker (None: no owner) and checkpoint (a sequence number
    or a sentinel: TRIM_HORIZON, LATEST, AT_TIMESTAMP, SHARD_END)."""

    owner: str | None
    checkpoint: str = ""
    counter: int = 0


@dataclass(frozen=True)
class Waiting:
    """What staging holds after a shard's committed position: the arrival (AWS time, ms) of the first record
    there (None: none waits), Kinesis' ``MillisBehindLatest`` of that read, ``more`` when the read found no
    record yet Kinesis says the shard holds later ones, and ``error`` when it could not be read."""

    arrival_ms: int | None = None
    millis_behind: int | None = None
    more: bool = False
    error: str | None = None

    @property
    def any(self) -> bool:
        return self.arrival_ms is not None or self.more


@dataclass(frozen=True)
class Thresholds:
    """When ``--check`` fails: a record waited longer than ``max_lag_ms``, a shard went without a live owner
    longer than ``max_unowned_ms``."""

    max_lag_ms: int = 300_000  # the stack's LagAlarmMillis default
    max_unowned_ms: int = 60_000


@dataclass(frozen=True)
class Health:
    """One shard's answers; ``problems``: what ``--check`` reports, one line each (without the shard ID)."""

    ended: bool
    known: bool = True  # the KCL's tables could be read (else nobody's owner is judged)
    worker: str | None = None  # the KCL lease's owner
    alive: bool | None = None  # None: no lease or no owner to judge
    worker_seen_ms: int | None = None  # the owner's last report to the WorkerMetricStats table
    waiting: Waiting | None = None  # None: not read (ended, or no position to read from)
    lag_ms: int | None = None
    problems: tuple[str, ...] = field(default=())


def reading_from(state: ShardState | None, lease: KclLease | None, start_ms: int | None) -> dict[str, Any] | None:
    """Where a shard's records not yet forwarded begin, as GetShardIterator's arguments: after the committed
    position; a shard copier has not committed on yet, where its KCL lease starts (a checkpoint, TRIM_HORIZON,
    the application's start); None where nothing tells (LATEST, no lease). A position inside a KPL aggregate
    reads from the next record: the aggregate's rest is not seen waiting (a chunk ends there only briefly)."""
    if state is not None and state.position is not None:
        return {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": state.position.seq_str}
    checkpoint = lease.checkpoint if lease is not None else ""
    if checkpoint.isdigit():
        return {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": checkpoint}
    if checkpoint == "TRIM_HORIZON":
        return {"ShardIteratorType": "TRIM_HORIZON"}
    if checkpoint == "AT_TIMESTAMP" and start_ms is not None:
        return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": start_ms / 1000}
    return None


def worker_expiry_ms(report_millis: int, margin_ms: int) -> int:
    """How old a worker's last report may be while it counts as alive: the KCL leader's two reporting
    intervals, plus a second (reports are in whole seconds) and the clock margin between hosts."""
    return REPORTS_MISSED * report_millis + 1000 + margin_ms


def span(ms: int) -> str:
    """A duration for a person: 4.2s, 12m05s, 3h07m."""
    if ms < 60_000:
        return f"{max(0, ms) / 1000:.1f}s"
    minutes, seconds = divmod(ms // 1000, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"


def judge(
    shard_open: bool,
    state: ShardState | None,
    lease: KclLease | None,
    reports: dict[str, int] | None,
    waiting: Waiting | None,
    now_ms: int,
    expiry_ms: int,
    limits: Thresholds,
) -> Health:
    """One shard's health. ``reports``: each worker's last report (ms), None when the WorkerMetricStats table
    could not be read (then nobody's life is judged); ``lease`` None: the shard has no KCL lease."""
    ended = bool(state is not None and state.closed) or (lease is not None and lease.checkpoint == ENDED)
    if ended:
        return Health(ended=True, known=reports is not None, worker=lease.owner if lease else None)
    problems: list[str] = []
    worker = lease.owner if lease is not None else None
    seen = reports.get(worker) if reports is not None and worker is not None else None
    alive = None if worker is None or reports is None else seen is not None and now_ms - seen <= expiry_ms
    if reports is not None and not alive:
        problems += _unowned(lease, worker, seen, state, now_ms, expiry_ms, limits)
    if state is not None and state.stall_reason:
        since = state.stall_since_ms
        how_long = f" for {span(now_ms - since)}" if since else ""
        problems.append(f"stalled{how_long}: {state.stall_reason}: {state.stall_detail or '-'}")
    lag = None
    if waiting is not None and waiting.error is not None:
        problems.append(f"staging cannot be read: {waiting.error}")
    elif waiting is not None:
        lag = 0 if not waiting.any else max(waiting.millis_behind or 0, _age(waiting.arrival_ms, now_ms))
        if lag > limits.max_lag_ms:
            oldest = "" if waiting.arrival_ms is None else f" (the oldest record not forwarded arrived {span(lag)} ago)"
            problems.append(f"behind by {span(lag)}{oldest}, over {span(limits.max_lag_ms)}")
    return Health(False, reports is not None, worker, alive, seen, waiting, lag, tuple(problems))


def _age(arrival_ms: int | None, now_ms: int) -> int:
    return 0 if arrival_ms is None else max(0, now_ms - arrival_ms)


def _unowned(
    lease: KclLease | None,
    worker: str | None,
    seen: int | None,
    state: ShardState | None,
    now_ms: int,
    expiry_ms: int,
    limits: Thresholds,
) -> list[str]:
    """A shard without a live owner, once that has lasted ``max_unowned_ms`` (see the module's docstring: from
    the instant its owner is known gone, or at once when nothing bounds it)."""
    gone = gone_since(seen, state, expiry_ms)
    if gone is not None and now_ms - gone <= limits.max_unowned_ms:
        return []  # a lease move, a restart: the KCL hands it on within seconds
    if gone is None and state is not None and state.lease_until_ms > now_ms:
        return []  # its copier owner may still be writing
    if lease is None:
        why = "no KCL lease (the KCL has not listed the shard yet, or its lease table was lost)"
    elif worker is None:
        why = "its KCL lease has no owner"
    elif seen is None:
        why = f"its KCL lease is held by {worker}, which does not report (stopped)"
    else:
        why = f"its KCL lease is held by {worker}, which last reported {span(now_ms - seen)} ago (dead)"
    for_ = f" for at least {span(now_ms - gone)}" if gone is not None else ""
    return [f"no live owner{for_}: {why}"]


def gone_since(seen: int | None, state: ShardState | None, expiry_ms: int) -> int | None:
    """The instant from which a shard's owner is known gone: when the KCL's leader counts its worker dead (its
    last report plus the expiry) or when copier's lease of it ran out, whichever is later; None when its worker
    never reported (a stopped worker's report is gone, a lease with no owner has none): nothing bounds it."""
    if seen is None:
        return None
    return max(seen + expiry_ms, state.lease_until_ms if state is not None else 0)
